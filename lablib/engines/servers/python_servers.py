"""The servers that are a Python package's ``python -m``: llama-cpp-python's server, mlx_lm.server,
``transformers serve``; each a command of :data:`lablib.engines.servers.SERVERS`.

A command takes ``(model, host, port, parallel, threads, n_ctx)`` (``parallel`` slots, ``threads`` CPU
threads, ``n_ctx`` tokens per slot) and returns ``(argv, version, readiness paths, model id or None)``; it
starts nothing. Raises LabError when the package is not installed, the model has no file in the server's
format, or (llama-cpp-python) ``parallel`` is not 1.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from lablib.errors import LabError


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _need(modules, what: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise LabError(f"{what} needs {', '.join(missing)}: install them with pip install 'lablib[serve]'")


def _llama_cpp_python(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """llama-cpp-python's own server: one request at a time (a default single slot's serial queue)."""
    _need(
        ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"),
        "llama-cpp-python's server",
    )
    if parallel != 1:
        raise LabError(
            f"parallel={parallel}: llama-cpp-python's server runs one request at a time "
            "(use --parallel 1, or llama-server / mlx for several slots)"
        )
    gguf = model.path_for("gguf", "llama-cpp-python's server")
    # a new request would cancel the running stream; full logits per prompt token cost ~400 MB
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--host",
        host,
        "--port",
        port,
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "False",
        "--logits_all",
        "False",
        "--model_alias",
        "lab-model",
    ]
    return argv, _version("llama_cpp_python"), ["/v1/models"], "lab-model"


def _mlx_server(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """mlx_lm.server: ``parallel`` sequences decoded and prefilled together."""
    if importlib.util.find_spec("mlx_lm") is None:
        raise LabError("mlx_lm.server needs mlx-lm: pip install 'mlx[cpu]' mlx-lm")
    folder = model.path_for("mlx", "mlx_lm.server")
    argv = [
        sys.executable,
        "-m",
        "mlx_lm.server",
        "--model",
        folder,
        "--host",
        host,
        "--port",
        port,
        "--decode-concurrency",
        str(parallel),
        "--prompt-concurrency",
        str(parallel),
        "--max-tokens",
        "4096",
        "--log-level",
        "WARNING",
    ]
    return argv, _version("mlx-lm"), ["/health"], None


def _transformers_serve(model, host: str, port: str, parallel: int, threads: int, n_ctx: int):
    """``transformers serve`` on the HF folder (continuous batching when ``parallel`` > 1)."""
    if importlib.util.find_spec("openai") is None:
        raise LabError(
            "transformers serve needs the openai package (and fastapi, uvicorn): pip install openai fastapi uvicorn"
        )
    folder = model.path_for("hf", "transformers serve")
    exe = Path(sys.executable).with_name("transformers")
    argv = [str(exe), "serve", folder, "--host", host, "--port", port, "--device", "cpu", "--log-level", "warning"]
    argv += ["--continuous-batching"] if parallel > 1 else []
    return argv, _version("transformers"), ["/v1/models"], folder
