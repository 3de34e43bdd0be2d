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
}
ALIASES = {"hf": "transformers", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp", "llama-cpp": "llama.cpp",
           "mlx-lm": "mlx", "mlx_lm": "mlx"}
NAMES = tuple(ENGINES)


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
    it cannot read, LabError for a bad n_ctx or an engine that will not fit in
    the memory available (:func:`lablib.memory.check_fits`).
    """
    from ..models import ResolvedModel, prepare

    key = canonical(name)
    _, _, module, install = ENGINES[key]
    if importlib.util.find_spec(module) is None:
        raise EngineUnavailable(f"engine {key} is not installed (no module {module!r}); install it: {install}")
    rm = model if isinstance(model, ResolvedModel) else prepare(model)
    n_ctx = kw.get("n_ctx")
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
        raise LabError(f"n_ctx={n_ctx!r}: expected a positive whole number of tokens (or leave it out for "
                       f"the model's trained context)")
    # weights, the runtime's buffers and, for llama.cpp, a KV cache reserved for all of n_ctx now
    from ..memory import check_fits

    check_fits(rm, [key], (n_ctx or rm.max_position_embeddings or 4096) if key == "llama.cpp" else 0,
               n_batch=kw.get("n_batch", 512))
    return engine_class(key)(rm, **kw)
