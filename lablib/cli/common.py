"""Help-text and flag helpers shared by the command modules."""

from __future__ import annotations

from contextlib import contextmanager

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


@contextmanager
def ctrl_c_also_cancels():
    """``with ctrl_c_also_cancels() as cancel:`` Ctrl-C (SIGINT) raises KeyboardInterrupt, as Python's own handler
    does, and sets ``cancel`` (a threading.Event), which a sweep checks before every request: Python prints and drops
    a KeyboardInterrupt that lands in a finalizer or a ctypes callback ("Exception ignored in ..."), and the sweep
    went on (a CI run's `lablib sweep --reps 500` still running 60 s after its SIGINT). Leaving with ``cancel`` set
    (the sweep stopped at it) raises KeyboardInterrupt there: the same way out, one line, exit 130. Outside the
    main thread (where no handler can be set) ``cancel`` is only an event.

    Inside a ``lablib`` command (:func:`lablib.children.first_interrupt_only`'s handler set), a Ctrl-C goes
    through that handler too, so the command's first signal is this Ctrl-C: a SIGTERM after it is dropped. Was:
    the command's handler never saw the Ctrl-C, and a SIGTERM 0.2 s later, on the sweep's way out, made it say
    "interrupted (SIGTERM)" and exit 143 (CI, twice: tests/test_sweep.py's Ctrl-C then SIGTERM; every time in a
    background job, where SIGINT comes in ignored and the command's handler is on SIGTERM alone)."""
    import signal
    import threading

    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return

    def on_int(signum, frame):
        # the command's handler, found on SIGTERM (which it always holds; SIGINT only where Python's handler was set,
        # not in a background job, where SIGINT came in ignored and only this handler takes it): the first only
        command = signal.getsignal(signal.SIGTERM)
        if getattr(command, "first_interrupt_only", False):
            try:
                command(signum, frame)
            except KeyboardInterrupt:
                cancel.set()
                raise
            return  # a later signal, dropped: the first is already on its way out
        cancel.set()
        raise KeyboardInterrupt

    prior = signal.signal(signal.SIGINT, on_int)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, prior)
    if cancel.is_set():
        raise KeyboardInterrupt
