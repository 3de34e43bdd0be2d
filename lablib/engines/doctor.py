"""Is each engine usable here, and why not.

Each engine is loaded and asked for two tokens in a child process: a library
built for instructions the CPU does not grant dies with SIGILL instead of
raising, and the doctor must live to say so.
"""

from __future__ import annotations

import json
import subprocess
import sys

_SMOKE = r"""
import json, sys
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
e = load_engine(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None, n_ctx=256)
t = e.generate(e.tokenize("The capital of France is"), GenerationConfig(max_new_tokens=2))
i = e.info()
print(json.dumps({"version": i.version, "backend": i.backend, "dtype": i.dtype, "tokens": t.output_tokens,
                  "device": i.device, "build": i.flags.get("build")}))
"""


def check_engine(name: str, model: str | None = None, timeout: float = 300, resolved=None) -> dict:
    """Load engine ``name`` and generate 2 tokens in a child process.

    A child process, because a library built for instructions the CPU does not
    grant dies with SIGILL instead of raising. Returns {engine, usable, detail, supported}: ``supported``
    False (nothing loaded) when the engine cannot read the model (``resolved``, the prepared ``model``:
    ``Engine.unsupported``'s reason in ``detail``).
    """
    import importlib.util
    import signal

    from lablib.engines import ENGINES

    module, install = ENGINES[name].requires, ENGINES[name].install_hint
    if importlib.util.find_spec(module) is None:
        return {"engine": name, "usable": False, "detail": f"not installed (no module {module!r}); {install}"}
    why = ENGINES[name].unsupported(resolved) if resolved is not None else None
    if why:
        return {"engine": name, "usable": False, "supported": False, "detail": why}
    cmd = [sys.executable, "-c", _SMOKE, name] + ([model] if model else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"engine": name, "usable": False, "detail": f"no answer within {timeout:.0f} s"}
    if p.returncode == 0:
        info = json.loads(p.stdout.strip().splitlines()[-1])
        detail = (
            f"{info['version']}, {info['backend']}, {info['dtype']}, on {info.get('device', 'cpu')}: "
            f"generated {info['tokens']} tokens"
        )
        return {"engine": name, "usable": True, "detail": detail + (f"; {info['build']}" if info.get("build") else "")}
    if p.returncode < 0:
        sig = signal.Signals(-p.returncode).name
        hint = (
            " (illegal instruction: the library was built for CPU features this machine does not "
            "grant, or its kernels were miscompiled; `python -m lablib.build.llama --install` tests "
            "the build on this CPU, switches off the extension family that crashes and rebuilds)"
            if sig == "SIGILL"
            else " (killed: most often the out-of-memory killer; see the memory line above, and close "
            "other programs or raise the container's memory cap)"
            if sig == "SIGKILL"
            else ""
        )
        return {"engine": name, "usable": False, "detail": f"crashed with {sig}{hint}"}
    last = (p.stderr.strip().splitlines() or ["failed"])[-1]
    return {"engine": name, "usable": False, "detail": last}


def check_engines(model: str | None = None, resolved=None) -> list[dict]:
    """:func:`check_engine` for every in-process engine, in the lab's order (the http engine
    needs a server: `lablib serve`); ``resolved``: the prepared ``model``, whose unsupported engines are
    said without loading them."""
    from lablib.engines import IN_PROCESS

    return [check_engine(name, model, resolved=resolved) for name in IN_PROCESS]
