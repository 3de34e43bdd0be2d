"""The engines behind one interface (:class:`lablib.engines.base.Engine`).

:data:`ENGINES` maps each canonical name to its Engine class. Importing the backend
modules is cheap: each imports its library (torch, llama_cpp, mlx, openvino_genai, onnxruntime_genai) only when an
engine is loaded. A new engine is one module here plus one line in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib.util

from lablib.checks import whole
from lablib.engines.base import Engine
from lablib.engines.hf import TransformersEngine
from lablib.engines.http import HTTPEngine
from lablib.engines.llamacpp import LlamaCppEngine
from lablib.engines.memory import check_fits
from lablib.engines.mlx import MLXEngine
from lablib.engines.openvino import OpenVINOEngine
from lablib.engines.ortgenai import OnnxRuntimeGenAIEngine
from lablib.errors import EngineUnavailable, LabError
from lablib.machine.threads import check_threads
from lablib.model.resolve import resolve

# canonical name -> Engine class, in the lab's order; http: any OpenAI-compatible server
ENGINES: dict[str, type[Engine]] = {
    cls.name: cls
    for cls in (TransformersEngine, LlamaCppEngine, MLXEngine, OpenVINOEngine, OnnxRuntimeGenAIEngine, HTTPEngine)
}
ALIASES = {
    "hf": "transformers",
    "llamacpp": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "llama-cpp": "llama.cpp",
    "mlx-lm": "mlx",
    "mlx_lm": "mlx",
    "openvino-genai": "openvino",
    "openvino_genai": "openvino",
    "ov": "openvino",
    "ort": "onnxruntime-genai",
    "ortgenai": "onnxruntime-genai",
    "onnxruntime": "onnxruntime-genai",
    "onnxruntime_genai": "onnxruntime-genai",
    "openai": "http",
    "server": "http",
}
# the engines that load the model in this process: doctor checks them all, widgets offer them all
IN_PROCESS = tuple(name for name, cls in ENGINES.items() if cls.in_process)
# the lab's default set: what sweeps, compare, the CLI and the notebooks run when no engine is named
NAMES = tuple(name for name in IN_PROCESS if ENGINES[name].lab_default)


def canonical(name: str) -> str:
    """The engine's canonical name; LabError naming the choices otherwise."""
    if not isinstance(name, str):
        raise LabError(f"engine {name!r}: expected an engine's name, one of {', '.join(ENGINES)}")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in ENGINES:
        raise LabError(f"unknown engine {name!r}: expected one of {', '.join(ENGINES)}")
    return key


def engine_class(name: str) -> type[Engine]:
    """The Engine subclass for ``name`` (any alias); its library is not imported yet."""
    return ENGINES[canonical(name)]


def check_supported(name: str, model) -> None:
    """Raise LabError, before any loading, when engine ``name`` cannot read ``model`` (a ResolvedModel):
    ``Engine.unsupported``'s message, naming the engine."""
    cls = engine_class(name)
    if cls.format and not getattr(model, f"{cls.format}_path", None):
        model.path_for(cls.format, cls.name)  # FormatError: what it got, what it needs, how to convert
    why = cls.unsupported(model)
    if why:
        raise LabError(f"engine {cls.name} cannot run {getattr(model, 'name', model)}: {why}")


def engines_for(model, names=NAMES) -> list[str]:
    """The engines of ``names`` (default: the lab's default set, :data:`NAMES`) that can read ``model``: the
    default set for that model (sweeps, compare and the notebooks run these when no engine is named). Raises
    LabError, naming each engine's reason, when none can."""
    model = resolve(model)
    why = {n: engine_class(n).unsupported(model) for n in (canonical(x) for x in names)}
    kept = [n for n, w in why.items() if not w]
    if not kept:
        raise LabError(
            f"no engine of {', '.join(why)} can run {model.name}: " + "; ".join(f"{n}: {w}" for n, w in why.items())
        )
    return kept


def check_load_keywords(name: str, kw: dict) -> None:
    """LabError naming each keyword of ``kw`` that engine ``name`` does not take (the keywords of its class's
    ``__init__``; a class that takes ``**kw`` checks its own), and the keywords it takes: before anything is
    loaded, in words, where the engine's class would raise Python's TypeError."""
    import inspect

    cls = engine_class(name)
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):  # a class that takes any keyword checks its own
        return
    takes = [p for p in params if p not in ("self", "model")]
    unknown = [k for k in kw if k not in takes]
    if unknown:
        raise LabError(
            f"engine {cls.name} takes no {', '.join(f'{k}=' for k in unknown)}: expected its own keywords, "
            f"{', '.join(takes)}"
        )


def check_load_args(kw: dict) -> dict:
    """``kw`` without its None values, ``n_ctx`` and ``n_batch`` checked as positive whole numbers (tokens) and
    ``threads`` as :func:`lablib.machine.threads.check_threads` wants it; cheap, so a command checks its flags
    with it before loading anything. Raises LabError naming the bad value."""
    kw = {k: v for k, v in kw.items() if v is not None}
    for arg in ("n_ctx", "n_batch"):
        if arg in kw:
            kw[arg] = whole(kw[arg], arg, "a positive whole number of tokens (or leave it out for the default)")
    if "threads" in kw:
        kw["threads"] = check_threads(kw["threads"])
    return kw


def adapter_engines() -> tuple[str, ...]:
    """The engines that load a LoRA adapter in process (``load_engine(..., adapter=)``: their ``adapter_form``)."""
    return tuple(n for n, c in ENGINES.items() if c.in_process and c.adapter_form)


def load_engine(name: str, model=None, adapter=None, merge_adapter: bool = False, **kw) -> Engine:
    """Load engine ``name`` on ``model`` (a ResolvedModel, a name/path, or None for the default).

    Keyword arguments go to the engine (n_ctx, threads, dtype...); the engine class fills
    in its defaults for the rest (:meth:`Engine.default_load_kwargs`: llama.cpp's n_ctx is
    the trained context, at most 8192 tokens). ``adapter`` (lab 11): a LoRA adapter of ``model``
    (:func:`lablib.model.adapters.make_adapter`) the engine applies on the fly, or, with ``merge_adapter``,
    the model with the adapter merged into its weights (:func:`lablib.model.adapters.merged_model`), loaded
    instead of the base; engines without ``adapter_form`` refuse it. Raises EngineUnavailable when its library is
    missing, FormatError for a format it cannot read, LabError for a model it does not support
    (:func:`check_supported`), an adapter it cannot load or of another model, a bad n_ctx, n_batch or
    threads or an engine that will not fit in the memory available (:func:`lablib.engines.memory.check_fits`).
    """
    cls = engine_class(name)
    check_load_keywords(cls.name, kw)
    if (adapter is not None or merge_adapter) and not cls.adapter_form:
        raise LabError(
            f"engine {cls.name} takes no LoRA adapter in the lab (adapter=, merge_adapter=); the engines that do: "
            f"{', '.join(adapter_engines())}"
            + ("; a server takes one per request (GenerationConfig.adapter)" if not cls.in_process else "")
        )
    if importlib.util.find_spec(cls.requires) is None:
        raise EngineUnavailable(
            f"engine {cls.name} is not installed (no module {cls.requires!r}); install it: {cls.install_hint}"
        )
    rm = resolve(model)
    check_supported(cls.name, rm)
    cls.check_adapter(rm, adapter, merge_adapter)
    if adapter is not None:
        kw.update(adapter=adapter, merge_adapter=merge_adapter)
    kw = {**cls.default_load_kwargs(rm), **check_load_args(kw)}
    if cls.in_process:  # weights, the runtime's buffers and, where reserved at load, a KV cache for all of n_ctx
        reserved = kw["n_ctx"] if cls.reserves_kv_at_load else 0
        check_fits(rm, [cls], reserved, n_batch=kw.get("n_batch") or 512)
    return cls(rm, **kw)
