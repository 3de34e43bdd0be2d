"""Waiting for a killed process's child to be gone (tests of lablib.children and its users)."""

import contextlib
import os
import time

import psutil

BOUND_S = 30  # liveness bound for a death that should follow at once: not a timing assertion


def gone(p: psutil.Process) -> bool:
    """Dead: no such process any more, or a zombie (waiting for a reaper that may never come) with
    all its threads gone: the leader thread is a zombie while its other threads still exit, and
    the process's files (a listening socket) close with the last of them (seen with llama-server)."""
    try:
        if not p.is_running():
            return True
        return p.status() == psutil.STATUS_ZOMBIE and os.listdir(f"/proc/{p.pid}/task") == [str(p.pid)]
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True


def wait_gone(p: psutil.Process, t0: float | None = None, bound_s: float = BOUND_S) -> float:
    """Seconds from ``t0`` (time.monotonic(); default now) until ``p`` was gone, polled every 10 ms
    for at most ``bound_s``; fails the test past it."""
    t0 = time.monotonic() if t0 is None else t0
    while not gone(p) and time.monotonic() - t0 < bound_s:
        time.sleep(0.01)
    assert gone(p), f"pid {p.pid} ({p.name()}) still runs {bound_s} s after its parent was killed"
    return time.monotonic() - t0


@contextlib.contextmanager
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process for the block (Python's own handler, as in a terminal or a
    notebook's kernel), its handler before put back after: a pytest-xdist worker ignores SIGINT (SIG_IGN), and a
    test that sends itself a Ctrl-C would see nothing there."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
