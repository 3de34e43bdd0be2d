"""Help-text and flag helpers shared by the command modules."""

from __future__ import annotations

from lablib.checks import csv_text
from lablib.config import budget


def quick_full(kind: str, setting: str) -> str:
    """A default of lablib.config.BUDGETS as help text: "FULL (QUICK in quick mode)"."""
    full, quick = (budget(kind, setting, q) for q in (False, True))
    full, quick = (csv_text(v) if isinstance(v, tuple) else str(v) for v in (full, quick))
    return full if full == quick else f"{full} ({quick} in quick mode)"


def flags(ns, *names: str) -> dict:
    """The parsed flags ``names`` of ``ns`` as keywords of the same names, for the function a subcommand
    calls: ``report(**flags(ns, "engines", "reps"))`` is ``report(engines=ns.engines, reps=ns.reps)``."""
    return {name: getattr(ns, name) for name in names}


def add_goodput_targets(p) -> None:
    """``--ttft-target-s``, ``--tpot-target-s``, ``--e2e-target-s``: a run's goodput targets (``lablib bench``,
    ``lablib replay``), passed on by :func:`goodput_targets`."""
    for metric in ("ttft", "tpot", "e2e"):
        p.add_argument(f"--{metric}-target-s", type=float, default=None)


GOODPUT_KEYWORDS = {f"{metric}_s": f"--{metric}-target-s" for metric in ("ttft", "tpot", "e2e")}
"""The keywords of :func:`goodput_targets` as their flags (a command's ``keywords(ns)``, :func:`lablib.cli.in_flags`)."""


def goodput_targets(ns) -> dict:
    """The goodput targets of :func:`add_goodput_targets` as keywords ``ttft_s``, ``tpot_s``, ``e2e_s``
    (:func:`lablib.measure.load.bench`, :func:`lablib.measure.replay.run_replay`)."""
    return {f"{metric}_s": getattr(ns, f"{metric}_target_s") for metric in ("ttft", "tpot", "e2e")}
