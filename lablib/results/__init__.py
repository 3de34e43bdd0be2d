"""One request's record, from its clock to a table.

- :mod:`lablib.results.trace`: :class:`RequestTrace`, the one clock (``now``) and the metrics of a trace;
- :mod:`lablib.results.schema`: every column a results row can carry, declared once;
- :mod:`lablib.results.store`: the run manifest, rows on disk (appended as requests finish), reading and merging;
- :mod:`lablib.results.tables`: medians, percentiles and per-run numbers from rows;
- :mod:`lablib.results.reference`: rows measured on other machines (``data/reference/``), beside a learner's own.

``from lablib.results import load_results, ResultsWriter`` works as it did when this was one module:
the names of :mod:`lablib.results.store` are reached here on first use (PEP 562), so importing the
trace (``import lablib`` does) does not import the store and the machine facts it records.
"""

from __future__ import annotations

import importlib

_STORE = ("FORMATS", "ResultsWriter", "load_results", "merge_results", "run_manifest", "trace_row")


def __getattr__(name: str):
    if name in _STORE:
        return getattr(importlib.import_module("lablib.results.store"), name)
    raise AttributeError(f"module 'lablib.results' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_STORE))
