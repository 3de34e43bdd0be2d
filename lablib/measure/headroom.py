"""How much headroom the client had: the lag of the event loop that timed the streams, measured while it ran.

A load run stamps each token when its bytes are handed to the engine's event loop (:mod:`lablib.engines.http`):
a loop busy with other streams' bytes stamps late, and then the client's ITL and TTFT carry its own delay,
not the server's. :class:`LoopLagProbe` measures that delay on the loop itself: an event the kernel makes
ready every ``interval_s`` seconds, exactly, and the time the loop took to get to it.

- **Linux**: a periodic ``timerfd`` on ``CLOCK_MONOTONIC`` (the lab's clock, ``time.perf_counter``) watched
  with ``add_reader``: the kernel makes it readable at ``t0 + k * interval_s`` with no thread, no GIL and no
  rounding in between, the way a socket becomes readable when a token's bytes arrive; the loop's lateness
  in reading it is the delay a token's bytes arriving then would have had before being stamped
  (``method: "timerfd"``). Every expiry is one sample (several that expired together each count from their
  own time), so ``loop_lag_p99_s`` says how late the loop was 1 % of the time.
- **elsewhere** (macOS): ``asyncio.sleep`` on the loop, whose lateness also holds the selector's
  millisecond rounding of its timeout (``method: "sleep"``: about 1 ms on an idle loop; read it as a floor).

Also ``loop_cpu_fraction``: the loop thread's CPU time over the probe's wall time (1.0: it never waited
for I/O). :func:`client_headroom` turns lags into the manifest's dict; ``near_limit`` is True when the
p99 lag is above ``threshold_s`` (:data:`NEAR_LIMIT_S`) or the loop thread was busy
:data:`BUSY_FRACTION` of the time or more.

``benchmarks/client_capacity.py`` sets the probe beside the truth (a scripted server's send time of every token,
on the same clock): on the 2-core VM shared with other work, the probe's p99 and the tokens' own stamping
delay p99 were of one order and rose together with concurrency (about 1-7 ms from 1 to 32 streams of one
token per 10 ms, 40-130 ms at 64-128, hundreds of ms at 256-512 streams); the probe also counts stalls when no
stream is in flight (a run's start), which no token sees. On a machine that busy even an idle loop's p99 is a
few ms: ``near_limit`` then says that the client's ITL p99 below that is not to be read, whatever the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time

from lablib.errors import LabError

# p99 loop lag above this: the client's own delay is more than a tenth of a 10 ms ITL (a fast server's
# decode step) at the p99, so the rows' ITL and TTFT p99 carry more than 10 % of the client's own
NEAR_LIMIT_S = 0.001
BUSY_FRACTION = 0.9  # the loop thread on the CPU this much of the time: no headroom left
DEFAULT_INTERVAL_S = 0.005
MAX_SAMPLES = 200_000  # a bound on the probe's memory (about 17 minutes at 5 ms)


_frozen = 0  # frozen_heap()s entered and not yet left, in any thread
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def frozen_heap():
    """Within it, Python's cyclic garbage collector leaves alone every object made before it began.

    On entry a full collection (before any stamp: no token waits for it), then :func:`gc.freeze`: the
    process's heap so far (modules, tokenizer, engine: about 300,000 objects in a load run's process) moves to
    the permanent generation, which no collection traverses; on leaving the outermost one, :func:`gc.unfreeze`.
    The collector stays on for what the run makes. Why: a full collection stops every thread, the loop that
    stamps tokens with them, for as long as it walks the heap; measured on the 2-core EPYC with the fast
    scripted server (``benchmarks/client_capacity.py``, 512 streams, server and client on a core each), two or
    three of them in a 3 to 7 s level, the longest 190-270 ms, the rows' ITL p99 with them; with the heap frozen
    one took 20 ms. CPython's own advice for such pauses (its ``gc.freeze`` docs); vLLM's server freezes its
    heap after start-up for the same reason. Nests, and works from several threads (a count)."""
    global _frozen
    with _frozen_lock:
        gc.collect()
        gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen -= 1
            if _frozen == 0:
                gc.unfreeze()


def _percentile(vals: list[float], q: float) -> float | None:
    from lablib.results.tables import percentile

    return percentile(vals, q) if vals else None


def client_headroom(
    lags_s,
    interval_s: float | None = None,
    cpu_fraction: float | None = None,
    threshold_s: float = NEAR_LIMIT_S,
    method: str | None = None,
) -> dict:
    """The ``client_headroom`` dict of a run manifest from the loop's lags (seconds, one per probe tick):
    ``loop_lag_p50_s``, ``loop_lag_p99_s``, ``loop_lag_max_s`` (None without samples), ``samples``,
    ``interval_s``, ``method``, ``loop_cpu_fraction``, ``threshold_s`` and ``near_limit``: True when the
    p99 lag is above ``threshold_s`` or the loop thread was busy :data:`BUSY_FRACTION` of the time or
    more; None when there is nothing to judge (no sample and no CPU fraction)."""
    lags = [float(x) for x in lags_s]
    p99 = _percentile(lags, 99)
    verdict = None
    if p99 is not None or cpu_fraction is not None:
        verdict = bool(
            (p99 is not None and p99 > threshold_s) or (cpu_fraction is not None and cpu_fraction >= BUSY_FRACTION)
        )
    return {
        "loop_lag_p50_s": _percentile(lags, 50),
        "loop_lag_p99_s": p99,
        "loop_lag_max_s": max(lags) if lags else None,
        "samples": len(lags),
        "interval_s": interval_s,
        "method": method,
        "loop_cpu_fraction": cpu_fraction,
        "threshold_s": threshold_s,
        "near_limit": verdict,
    }


# --- a periodic kernel timer (Linux) -----------------------------------------------------------
_TFD = None


def _timerfd():
    """libc's timerfd_create and timerfd_settime through ctypes, or None where there are none."""
    global _TFD
    if _TFD is None:
        _TFD = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)

                class Timespec(ctypes.Structure):
                    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

                class Itimerspec(ctypes.Structure):
                    _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]

                create, settime = libc.timerfd_create, libc.timerfd_settime
                create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(Itimerspec), ctypes.c_void_p]
                settime.restype = ctypes.c_int
                _TFD = (ctypes, create, settime, Timespec, Itimerspec)
            except (OSError, AttributeError):
                _TFD = False
    return _TFD or None


def _monotonic() -> float:
    """CLOCK_MONOTONIC, the timerfd's clock (on Linux also ``time.perf_counter``'s, the lab's)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _open_timerfd(t0: float, interval_s: float) -> int | None:
    """A non-blocking timerfd that expires at ``t0`` (CLOCK_MONOTONIC seconds) and every ``interval_s`` after."""
    lib = _timerfd()
    if lib is None:
        return None
    ctypes, create, settime, Timespec, Itimerspec = lib
    fd = create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)  # TFD_NONBLOCK, TFD_CLOEXEC are these
    if fd < 0:
        return None

    def ts(x: float):
        sec = int(x)
        return Timespec(sec, int(round((x - sec) * 1e9)))

    spec = Itimerspec(ts(interval_s), ts(t0))
    if settime(fd, 1, ctypes.byref(spec), None) != 0:  # 1: TFD_TIMER_ABSTIME
        os.close(fd)
        return None
    return fd


class LoopLagProbe:
    """The lag of one event loop, sampled every ``interval_s`` seconds while :meth:`run` runs on it.

    ``with LoopLagProbe().on(engine) as probe: ...`` (``engine``: anything with ``submit(coro)``, as the http
    engine has: its loop is the one that stamps the tokens) and then ``probe.headroom()``; or
    ``probe.start(engine)`` ... ``probe.stop()`` (which returns the headroom). ``lags_s``: the samples."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, max_samples: int = MAX_SAMPLES):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not 0.0005 <= interval_s <= 10:
            raise LabError(f"interval_s={interval_s!r}: expected seconds from 0.0005 to 10 between the probe's ticks")
        self.interval_s = float(interval_s)
        self.max_samples = int(max_samples)
        self.lags_s: list[float] = []
        self.method: str | None = None
        self._cpu = None  # (thread CPU s, wall s) at the start, read on the loop's thread
        self.cpu_fraction: float | None = None
        self._fut = None
        self._started, self._ended = threading.Event(), threading.Event()
        self._stopping = False

    # --- on the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Sample the running loop until cancelled."""
        self._started.set()
        if self._stopping:  # stopped before it began: nothing to sample
            self._ended.set()
            return
        loop = asyncio.get_running_loop()
        clock = time.perf_counter
        self._cpu = (time.thread_time(), clock())
        try:
            t0 = _monotonic() + self.interval_s
            fd = _open_timerfd(t0, self.interval_s)
            if fd is not None:
                self.method = "timerfd"
                await self._timerfd(loop, fd, t0)
            else:
                self.method = "sleep"
                await self._sleep()
        finally:
            cpu0, wall0 = self._cpu
            wall = clock() - wall0
            self.cpu_fraction = (time.thread_time() - cpu0) / wall if wall > 0 else None
            self._ended.set()

    async def _timerfd(self, loop, fd: int, t0: float) -> None:
        clock, lags, interval = _monotonic, self.lags_s, self.interval_s
        fired = 0  # expiries read so far

        def ready():
            nonlocal fired
            t = clock()
            try:
                n = int.from_bytes(os.read(fd, 8), sys.byteorder)
            except BlockingIOError:
                return
            for k in range(fired, fired + n):
                if len(lags) < self.max_samples:
                    lags.append(max(0.0, t - (t0 + k * interval)))
            fired += n

        loop.add_reader(fd, ready)
        try:
            await loop.create_future()  # until cancelled
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _sleep(self) -> None:
        clock, lags, interval = time.perf_counter, self.lags_s, self.interval_s
        due = clock() + interval
        while True:
            await asyncio.sleep(max(0.0, due - clock()))
            t = clock()
            while due <= t:
                if len(lags) < self.max_samples:
                    lags.append(t - due)
                due += interval

    # --- from another thread ---------------------------------------------------------------------
    def start(self, engine) -> LoopLagProbe:
        """Run the probe on ``engine``'s loop (``engine.submit(coro)``); returns self."""
        if self._fut is not None:
            raise LabError("this probe is running already: one probe per run (make a new one)")
        self._fut = engine.submit(self.run())
        return self

    def stop(self, threshold_s: float = NEAR_LIMIT_S) -> dict:
        """Stop the probe (waits up to 5 s for its loop to let go of the timer) and return :meth:`headroom`."""
        self._stopping = True
        if self._fut is not None and not self._fut.done():
            self._fut.cancel()
            if self._started.is_set():  # else it never runs, or returns at once (_stopping)
                self._ended.wait(5.0)
        return self.headroom(threshold_s)

    def on(self, engine) -> LoopLagProbe:
        """For ``with probe.on(engine):``: started now, stopped at the block's end."""
        return self.start(engine)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def headroom(self, threshold_s: float = NEAR_LIMIT_S) -> dict:
        """:func:`client_headroom` of the samples so far."""
        return client_headroom(list(self.lags_s), self.interval_s, self.cpu_fraction, threshold_s, self.method)
