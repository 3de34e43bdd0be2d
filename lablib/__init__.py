"""Inference Engine Lab: one model through transformers, llama.cpp and MLX, one clock.

``import lablib`` stays light: engines (torch, llama_cpp, mlx), pandas and plotly
import only when used. The verbs a notebook needs are reached from here, loaded on
first use (PEP 562): :func:`prepare` a model, :func:`load_engine`, generate and read
the :class:`RequestTrace`; :func:`side_by_side`, :func:`summary_table`,
:func:`run_table`, :func:`sweep_panel`, :func:`report_html`, :func:`load_case`;
the modules ``lablib.plots``, ``lablib.tables``, ``lablib.sweep``, ``lablib.compare``,
``lablib.anchors`` (short names for :mod:`lablib.plots`, :mod:`lablib.results.tables`,
:mod:`lablib.measure.sweep`, :mod:`lablib.studies.compare`, :mod:`lablib.studies.anchors`).

The package's folders are its layers (docs/DESIGN.md): ``model/``, ``machine/``,
``engines/``, ``results/``, ``measure/``, ``studies/``, ``plots/``, ``ui/``, ``cli/``
and, at install time only, ``build/``. Module paths of the flat layout before them
(``lablib.hardware``, ``lablib.roofline``, ...) still import, with a DeprecationWarning
(:mod:`lablib._compat`).
"""

from __future__ import annotations

import importlib

from lablib import _compat
from lablib._version import __version__
from lablib.errors import ContextOverflowError, EngineUnavailable, FormatError, LabError, TraceError
from lablib.results.trace import RequestTrace

# name -> (module, attribute), imported on first access; attribute None: the module itself
_LAZY = {
    "prepare": ("lablib.model.resolve", "prepare"),
    "load_engine": ("lablib.engines", "load_engine"),
    "chat_ids": ("lablib.measure.workload", "chat_ids"),
    "text_ids": ("lablib.measure.workload", "text_ids"),
    "question_ids": ("lablib.measure.workload", "question_ids"),
    "prompt_of_length": ("lablib.measure.workload", "prompt_of_length"),
    "side_by_side": ("lablib.measure.sweep", "side_by_side"),
    "context_sweep": ("lablib.measure.sweep", "context_sweep"),
    "concurrency_sweep": ("lablib.measure.sweep", "concurrency_sweep"),
    "summary_table": ("lablib.results.tables", "summary_table"),
    "run_table": ("lablib.results.tables", "run_table"),
    "sweep_panel": ("lablib.ui.widgets", "sweep_panel"),
    "compare": ("lablib.studies.compare", None),  # the module: lablib.compare.compare(...), .TokenizerView
    "batch_invariance": ("lablib.studies.batch_invariance", "batch_invariance"),
    "check_engines": ("lablib.engines.doctor", "check_engines"),
    "hardware_info": ("lablib.machine.identity", "hardware_info"),
    "load_case": ("lablib.studies.cases", "load_case"),
    "folder_with_config": ("lablib.model.formats", "folder_with_config"),
    "load_results": ("lablib.results.store", "load_results"),
    "report_html": ("lablib.ui.report", "report_html"),
    "plots": ("lablib.plots", None),
    "tables": ("lablib.results.tables", None),
    "sweep": ("lablib.measure.sweep", None),
    "anchors": ("lablib.studies.anchors", None),  # llama.cpp's own benchmarks next to the lab's numbers
}
# the layers, reachable as attributes after a plain ``import lablib`` (lablib.machine.identity, ...)
_PACKAGES = ("model", "machine", "engines", "results", "measure", "studies", "plots", "ui", "cli", "config")


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    if name in _PACKAGES:
        return importlib.import_module(f"lablib.{name}")
    raise AttributeError(f"module 'lablib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_PACKAGES))


_compat.install()

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
