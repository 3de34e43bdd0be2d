"""How many threads an engine runs with: the policy (LABLIB_THREADS, the usable CPUs) and contention.

An engine's threads default to the CPUs this process may use (:func:`default_threads`); before each
request an engine with automatic threads leaves the CPUs other processes keep busy
(:class:`BusyMeter`, :func:`threads_beside_others`; benchmarks/contention.py measures why).
"""

from __future__ import annotations

import math
import os
import time

from lablib.checks import whole
from lablib.machine.limits import cpus_usable


def cpus_busy(interval: float = 0.5) -> float:
    """CPUs kept busy by *other* processes over ``interval`` seconds (this process idles meanwhile):
    system-wide CPU time (psutil.cpu_percent) as a number of CPUs, 0.0 to the logical CPU count."""
    import psutil

    return psutil.cpu_percent(interval=interval) / 100 * (psutil.cpu_count(logical=True) or 1)


class BusyMeter:
    """CPUs kept busy by *other* processes between two readings.

    System-wide busy CPU time (psutil.cpu_times: all but idle and iowait) minus this process's own
    CPU time (all its threads), over the wall time between readings. The first reading covers a
    short blocking sample (``first_interval`` seconds) taken when the meter is made.
    """

    def __init__(self, first_interval: float = 0.2):
        import psutil

        self._proc = psutil.Process()
        self._last = self._sample()
        time.sleep(first_interval)

    def _sample(self) -> tuple[float, float, float]:
        import psutil

        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        own = sum(self._proc.cpu_times()[:2])
        return time.monotonic(), busy, own

    def others(self) -> float:
        """CPUs other processes kept busy since the last reading (0.0 or more)."""
        now_, busy, own = self._sample()
        t0, busy0, own0 = self._last
        self._last = (now_, busy, own)
        wall = now_ - t0
        return max(0.0, ((busy - busy0) - (own - own0)) / wall) if wall > 0 else 0.0


def threads_beside_others(most: int, others: float) -> int:
    """Threads an engine should use when other processes keep ``others`` CPUs busy: the CPUs
    left, rounded (0.5 up), between 1 and ``most``.

    Why: OpenMP threads (llama.cpp's ggml, PyTorch) meet at a barrier after every operation, so
    one thread that shares its core with a busy neighbour holds all of them up, for a scheduler
    time slice at a time (benchmarks/contention.py measured a 4x slowdown here with 2 threads and
    one busy core, and none with 1 thread).
    """
    return max(1, min(most, most - math.floor(others + 0.5)))


# --- threads ------------------------------------------------------------------------------------
# Oversubscription is a fair experiment (what do 8 threads on 2 cores cost?), thousands of
# threads are not: llama.cpp crashes, torch cannot start them.
MAX_THREADS_PER_CPU = 4


def check_threads(value, what: str = "threads") -> int:
    """``value`` as a thread count: a whole number from 1 to :data:`MAX_THREADS_PER_CPU` per
    logical CPU (a str of digits, an int or a numpy integer). Raises LabError naming ``what``."""
    most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
    expected = (
        f"a whole number of threads from 1 to {most} ({MAX_THREADS_PER_CPU} per logical CPU; "
        f"{cpus_usable()} would use the CPUs this process may use), or leave it unset"
    )
    return whole(value, what, expected, lo=1, hi=most, strings=True)


def default_threads() -> int:
    """Threads for CPU engines: the CPUs this process can use (physical cores, affinity and
    container quota: :func:`lablib.machine.cpus_usable`). LABLIB_THREADS overrides.

    Raises LabError when LABLIB_THREADS is not a whole number from 1 to 4 per logical CPU.
    """
    env = os.environ.get("LABLIB_THREADS", "").strip()
    return check_threads(env, "LABLIB_THREADS") if env else cpus_usable()
