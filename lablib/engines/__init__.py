"""The three engines behind one interface (:class:`lablib.engines.base.Engine`).

Each backend module imports its library only when an engine is loaded.
"""
from __future__ import annotations

import importlib

from ..errors import EngineUnavailable, LabError

# engine name -> (module, class, the import that must succeed, what to install)
ENGINES = {
    "transformers": ("hf", "TransformersEngine", "transformers", "pip install 'torch==2.13.0' transformers accelerate"),
    "llama.cpp": ("llamacpp", "LlamaCppEngine", "llama_cpp", "make setup (builds llama-cpp-python for this CPU)"),
    "mlx": ("mlx", "MLXEngine", "mlx_lm", "pip install 'mlx[cpu]' mlx-lm (Linux) or mlx-lm (macOS)"),
    # any OpenAI-compatible server (load_engine("http", model, base_url=..., api=...)); not an in-process engine
    "http": ("http", "HTTPEngine", "aiohttp", "pip install 'lablib[serve]' (aiohttp)"),
}
ALIASES = {"hf": "transformers", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp", "llama-cpp": "llama.cpp",
           "mlx-lm": "mlx", "mlx_lm": "mlx",
           "openai": "http", "server": "http"}
NAMES = tuple(ENGINES)
IN_PROCESS = ("transformers", "llama.cpp", "mlx")  # the engines that load the model here


def canonical(name: str) -> str:
    """The engine's canonical name; LabError naming the choices otherwise."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in ENGINES:
        raise LabError(f"unknown engine {name!r}: expected one of {', '.join(NAMES)}")
    return key


def engine_class(name: str):
    """The Engine subclass for ``name`` (imports its backend module, not yet its library)."""
    mod, cls, _, _ = ENGINES[canonical(name)]
    return getattr(importlib.import_module(f"{__name__}.{mod}"), cls)


def load_engine(name: str, model=None, **kw):
    """Load engine ``name`` on ``model`` (a ResolvedModel, a name/path, or None for the default).

    Keyword arguments go to the engine (n_ctx, threads, dtype...). Raises
    EngineUnavailable when its library is missing, FormatError for a format
    it cannot read, LabError for a bad n_ctx, n_batch or threads or an engine
    that will not fit in the memory available (:func:`lablib.memory.check_fits`).
    llama.cpp's n_ctx defaults to the trained context, at most 8192 tokens.
    """
    from ..models import ResolvedModel, prepare

    key = canonical(name)
    _, _, module, install = ENGINES[key]
    if importlib.util.find_spec(module) is None:
        raise EngineUnavailable(f"engine {key} is not installed (no module {module!r}); install it: {install}")
    rm = model if isinstance(model, ResolvedModel) else prepare(model)
    kw = dict(kw)
    for arg in ("n_ctx", "n_batch"):
        if kw.get(arg) is not None:
            kw[arg] = _positive_int(kw[arg], arg)
    if kw.get("threads") is not None:
        from .base import check_threads

        kw["threads"] = check_threads(kw["threads"])
    if key == "llama.cpp" and kw.get("n_ctx") is None:
        kw["n_ctx"] = llama_default_n_ctx(rm)
    if key == "http":  # the model lives in the server's process; here only its tokenizer
        if not kw.get("base_url"):
            raise LabError("the http engine needs base_url=... (a server's OpenAI URL, e.g. "
                           "http://127.0.0.1:8080/v1); start a server with `lablib serve`, measure it with "
                           "`lablib bench --base-url URL`")
        return engine_class(key)(rm, **kw)
    # weights, the runtime's buffers and, for llama.cpp, a KV cache reserved for all of n_ctx now
    from ..memory import check_fits

    check_fits(rm, [key], kw["n_ctx"] if key == "llama.cpp" else 0, n_batch=kw.get("n_batch") or 512)
    return engine_class(key)(rm, **kw)


LLAMA_DEFAULT_N_CTX = 8192  # SmolLM2's trained context; pass n_ctx for longer prompts


def llama_default_n_ctx(model) -> int:
    """llama.cpp's context when none is given, tokens: the trained context, at most 8192.

    llama.cpp reserves its KV cache for the whole context: a long-context model's trained
    length (128k, 1M tokens) would reserve gigabytes for prompts of a few hundred tokens.
    """
    return min(model.max_position_embeddings or LLAMA_DEFAULT_N_CTX, LLAMA_DEFAULT_N_CTX)


def _positive_int(value, what: str) -> int:
    import operator

    try:
        n = operator.index(value)  # int, numpy integers; not float, str or bool
    except TypeError:
        n = None
    if isinstance(value, bool) or n is None or n < 1:
        raise LabError(f"{what}={value!r}: expected a positive whole number of tokens (or leave it out "
                       f"for the default)")
    return n
