"""Inference Engine Lab: one model through transformers, llama.cpp and MLX, one clock.

``import lablib`` stays light: engines (torch, llama_cpp, mlx), pandas and plotly
import only when used. The verbs a notebook needs are reached from here, loaded on
first use (PEP 562): :func:`prepare` a model, :func:`load_engine`, generate and read
the :class:`RequestTrace`; :func:`side_by_side`, :func:`summary_table`,
:func:`run_table`, :func:`sweep_panel`, :func:`report_html`, :func:`load_case`;
the modules ``lablib.plots``, ``lablib.tables``, ``lablib.sweep``, ``lablib.compare``,
``lablib.anchors``.
"""

from __future__ import annotations

import importlib

from ._version import __version__
from .errors import ContextOverflowError, EngineUnavailable, FormatError, LabError, TraceError
from .trace import RequestTrace

# name -> (module, attribute), imported on first access; attribute None: the module itself
_LAZY = {
    "prepare": ("models", "prepare"),
    "load_engine": ("engines", "load_engine"),
    "chat_ids": ("workload", "chat_ids"),
    "prompt_of_length": ("workload", "prompt_of_length"),
    "side_by_side": ("sweep", "side_by_side"),
    "context_sweep": ("sweep", "context_sweep"),
    "concurrency_sweep": ("sweep", "concurrency_sweep"),
    "summary_table": ("tables", "summary_table"),
    "run_table": ("tables", "run_table"),
    "sweep_panel": ("widgets", "sweep_panel"),
    "compare": ("compare", None),  # the module: lablib.compare.compare(...), lablib.compare.TokenizerView
    "check_engines": ("doctor", "check_engines"),
    "hardware_info": ("hardware", "hardware_info"),
    "load_case": ("cases", "load_case"),
    "folder_with_config": ("formats", "folder_with_config"),
    "load_results": ("results", "load_results"),
    "report_html": ("report", "report_html"),
    "plots": ("plots", None),
    "tables": ("tables", None),
    "sweep": ("sweep", None),
    "anchors": ("anchors", None),  # llama.cpp's own benchmarks next to the lab's numbers
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'lablib' has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = importlib.import_module(f".{module}", __name__)
    return mod if attr is None else getattr(mod, attr)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ContextOverflowError",
    "EngineUnavailable",
    "FormatError",
    "TraceError",
    "LabError",
    "RequestTrace",
    "__version__",
    *_LAZY,
]
