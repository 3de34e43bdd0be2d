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
    main thread (where no handler can be set) ``cancel`` is only an event."""
    import signal
    import threading

    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return

    def on_int(signum, frame):
        cancel.set()
        raise KeyboardInterrupt

    prior = signal.signal(signal.SIGINT, on_int)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, prior)
    if cancel.is_set():
        raise KeyboardInterrupt


@contextmanager
def first_interrupt_only():
    """``with first_interrupt_only():`` Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt named after the signal
    ("SIGINT", "SIGTERM": SIGTERM the same way out as Ctrl-C) the first time; later ones are dropped until the block
    ends, so they cannot break what the first one began: stopping a server, writing the rows of the requests in
    flight (as a client process's own handler does, :func:`lablib.measure.load._process_worker`). Raised too, a
    second one (Ctrl-C pressed twice; SIGINT and SIGTERM sent together, both pending at once: Python runs the second
    handler at its next check, in the middle of the first one's way out) broke it. Found by fuzzing `lablib serve`,
    `bench` and `replay`: serve exited 130 with its server left to its death signal; bench and replay printed a
    RuntimeError traceback ("release unlocked lock": the second KeyboardInterrupt inside a queue's Condition.wait as
    it unwound from the first) and exited 1, the rows of the requests in flight not written. Only on the main thread
    (no handler can be set elsewhere); SIGINT only where a Python handler is set (ignored in a background job, it
    stays ignored)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []

    def first_only(signum, frame):
        if not came:
            came.append(signum)
            raise KeyboardInterrupt(signal.Signals(signum).name)

    prior = {}
    for s in (signal.SIGTERM, signal.SIGINT):
        if s == signal.SIGTERM or callable(signal.getsignal(s)):
            prior[s] = signal.signal(s, first_only)
    try:
        yield
    finally:
        for s, h in prior.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
