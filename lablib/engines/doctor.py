"""Is each engine usable here, and why not.

Each engine is loaded and asked for two tokens in a child process: a library
built for instructions the CPU does not grant dies with SIGILL instead of
raising, and the doctor must live to say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lablib.checks import keywords_checked
from lablib.errors import LabError, shown

_SMOKE = r"""
import json, sys
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
e = load_engine(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None, n_ctx=256)
t = e.generate(e.tokenize("The capital of France is"), GenerationConfig(max_new_tokens=2))
i = e.info()
print(json.dumps({"version": i.version, "backend": i.backend, "dtype": i.dtype, "tokens": t.output_tokens,
                  "device": i.device, "build": i.flags.get("build"), "kernels": i.flags.get("matmul_kernels")}))
"""


def check_engine(name: str, model: str | None = None, timeout: float = 300, resolved=None) -> dict:
    """Load engine ``name`` and generate 2 tokens in a child process.

    A child process, because a library built for instructions the CPU does not
    grant dies with SIGILL instead of raising. Returns {engine, usable, detail, supported}: ``supported``
    False (nothing loaded) when the engine cannot read the model (``resolved``, the prepared ``model``:
    ``Engine.unsupported``'s reason in ``detail``). ``model``: a name or path (None: the lab's default), or a prepared
    model (``lablib.prepare()``), which the child prepares again from its source (a cache hit). Raises LabError for
    anything else, before any child starts (was: subprocess's TypeError).
    """
    import importlib.util
    import signal

    from lablib.engines import ENGINES, canonical
    from lablib.model.resolve import ResolvedModel

    name = canonical(name)  # an alias as load_engine takes it; an unknown name said with the choices (was: KeyError)

    if isinstance(model, ResolvedModel):
        model, resolved = model.source, resolved or model
    elif model is not None and not isinstance(model, (str, os.PathLike)):
        raise LabError(
            f"model={shown(model)}: expected a model's name or path, a prepared model (lablib.prepare()), or None for "
            "the lab's default; check_engines() checks every engine, check_engine(name, model) one"
        )

    module, install = ENGINES[name].requires, ENGINES[name].install_hint
    if importlib.util.find_spec(module) is None:
        return {"engine": name, "usable": False, "detail": f"not installed (no module {module!r}); {install}"}
    why = ENGINES[name].unsupported(resolved) if resolved is not None else None
    if why:
        return {"engine": name, "usable": False, "supported": False, "detail": why}
    cmd = [sys.executable, "-c", _SMOKE, name] + ([os.fspath(model)] if model else [])
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
        detail += f"; {info['build']}" if info.get("build") else ""
        # llama.cpp: the kernel its prefill multiplies the model's weights with here (lab 06)
        detail += f"; prefill multiplies {info['kernels']} (lab 06)" if info.get("kernels") else ""
        return {"engine": name, "usable": True, "detail": detail}
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


@keywords_checked
def check_engines(model: str | None = None, resolved=None) -> list[dict]:
    """:func:`check_engine` for every in-process engine, in the lab's order (the http engine
    needs a server: `lablib serve`); ``resolved``: the prepared ``model``, whose unsupported engines are
    said without loading them."""
    from lablib.engines import IN_PROCESS

    return [check_engine(name, model, resolved=resolved) for name in IN_PROCESS]


# --- a CPU-only torch or llama.cpp beside an NVIDIA GPU -------------------------------------------------

_TORCH_BUILD = "import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda}))"


def gpu_build_facts(gpus: list[str], timeout: float = 120) -> dict:
    """What :func:`gpu_build_warnings` needs: ``gpus`` (the NVIDIA GPUs' names, as the machine layer lists them),
    ``torch`` (``{"version", "cuda"}`` as torch itself says in a child process, None when it is not installed; asked
    only where there is a GPU: importing torch takes seconds), ``llama`` (None when llama-cpp-python is not
    installed, else ``{"report": lablib.build.llama's build record or None}``) and ``python`` (this interpreter)."""
    import importlib.util

    facts: dict = {"gpus": list(gpus), "torch": None, "llama": None, "python": sys.executable}
    if not gpus:
        return facts
    if importlib.util.find_spec("torch") is not None:
        try:
            p = subprocess.run([sys.executable, "-c", _TORCH_BUILD], capture_output=True, text=True, timeout=timeout)
            facts["torch"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            facts["torch"] = None
    if importlib.util.find_spec("llama_cpp") is not None:
        from lablib.build.llama import build_report

        facts["llama"] = {"report": build_report()}
    return facts


def gpu_build_warnings(facts: dict) -> list[str]:
    """``lablib doctor``'s warnings when an NVIDIA GPU is here but torch is a CPU-only build (``torch.version.cuda``
    None) or llama.cpp was built without CUDA (its build record's CMAKE_ARGS lack ``-DGGML_CUDA=ON``), each with the
    command that gets the CUDA one. ``facts``: :func:`gpu_build_facts`'s dict. Pure."""
    gpus = ", ".join(dict.fromkeys(facts.get("gpus") or []))
    if not gpus:
        return []
    py = facts.get("python") or "python"
    lines = []
    torch = facts.get("torch")
    if torch and not torch.get("cuda"):
        lines.append(
            f"WARNING: torch {torch.get('version')} is a CPU-only build (torch.version.cuda is None) beside {gpus}: "
            f"transformers computes on the CPU. `{py} -m lablib.build.torch_choice --install` installs the CUDA "
            "build this driver runs (it says which and why)"
        )
    report = (facts.get("llama") or {}).get("report")
    if report and "-DGGML_CUDA=ON" not in str(report.get("cmake_args", "")):
        failed = [d["reason"] for d in report.get("dropped", []) if d.get("family") == "CUDA"]
        why = f"its CUDA build failed: {failed[-1]}" if failed else report.get("cuda") or "no CUDA flags were asked for"
        lines.append(
            f"WARNING: llama.cpp (llama-cpp-python) was built without CUDA beside {gpus}: it computes on the CPU "
            f"(CMAKE_ARGS={report.get('cmake_args') or ''!r}; why: {why}). `{py} -m lablib.build.llama --install` "
            "builds it for the GPUs here where the CUDA toolkit (nvcc) is installed, then the llama.cpp tools again "
            f"with `{py} -m lablib.build.llama --tool all`"
        )
    return lines
