"""Help-text helpers shared by the command modules."""

from __future__ import annotations

from lablib.checks import csv_text
from lablib.config import budget


def quick_full(kind: str, setting: str) -> str:
    """A default of lablib.config.BUDGETS as help text: "FULL (QUICK in quick mode)"."""
    full, quick = (budget(kind, setting, q) for q in (False, True))
    full, quick = (csv_text(v) if isinstance(v, tuple) else str(v) for v in (full, quick))
    return full if full == quick else f"{full} ({quick} in quick mode)"
