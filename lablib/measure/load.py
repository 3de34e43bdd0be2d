"""Load shapes over HTTP: a closed loop, an open loop from a seeded arrival schedule, goodput.

- **closed loop** (``mode="closed"``): C clients; each sends its next request the moment
  its previous one finished (``t_submit`` = that moment), until R requests are done; the send
  waits for the event loop to stamp the other streams' tokens already read (its ``queue_s``);
- **open loop** (``mode="open"``): requests arrive on a precomputed schedule
  (:func:`arrival_schedule`: constant, Poisson or gamma inter-arrival times at ``rate``
  requests/s, seeded), whether or not earlier ones finished; an optional concurrency
  cap makes later arrivals wait in the lab's queue (their ``queue_s``). Each row keeps
  its scheduled and actual dispatch time (``t_scheduled``, ``schedule_lag_s``); ``t_submit``
  is the scheduled time, so a late client does not hide latency.

Every run is bounded: at most ``len(prompts)`` requests and ``max_duration_s`` seconds;
at the limit no new request starts and requests in flight are cancelled and recorded as
error rows. A failed request (HTTP 429/500, error event, cut stream, timeout) is an error
row with what arrived; the run goes on. Rows are made and written by the calling thread (off the
event loop that times the streams) as each request finishes.

A run's numbers (throughput, p50/p90/p95/p99 of TTFT, TPOT, ITL and e2e, goodput: requests per
second that met every target, DistServe's definition as ``vllm bench serve --goodput``) are
:func:`lablib.results.tables.run_summary`, the lab's one run summary (:func:`summarize` here calls it).
:func:`bench` is ``lablib bench``: prompts, a results file, the engine, warm-up, one run per rate and
its summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import signal
import threading
from collections.abc import Callable

from lablib.checks import csv_list, whole
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.results.schema import flatten_manifest
from lablib.results.store import runs_path, server_path, trace_row
from lablib.results.tables import check_targets, run_summary
from lablib.results.trace import RequestTrace, now

# the load shapes (run_load's mode): C clients in a closed loop, or an open loop whose requests arrive on a
# schedule of ARRIVALS; in process, the closed loop's scheduling modes are lablib.measure.closed_loop's
LOAD_SHAPES = ("closed", "open")
ARRIVALS = ("constant", "poisson", "gamma")
MAX_REQUESTS = 100_000
STOP_POLL_S = 0.05  # how often a sleeping open loop looks at run_load's stop event (s): a Cancel takes effect within it


def arrival_schedule(
    n: int, rate: float, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Send times of ``n`` requests, seconds after the run's start (the first at 0).

    Inter-arrival times have mean ``1 / rate`` (``rate`` in requests/s; ``math.inf``: all at
    0, a burst): ``constant`` (all equal), ``poisson`` (exponential), or ``gamma`` with shape
    ``burstiness`` (below 1 burstier than Poisson, above 1 smoother; 1 is Poisson). The same
    seed gives the same schedule. Raises LabError for bad arguments.
    """
    import numpy as np

    n = whole(n, "requests", f"a whole number from 1 to {MAX_REQUESTS}", hi=MAX_REQUESTS)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise LabError(f"rate={rate!r}: expected requests per second above 0 (math.inf: all at once)")
    if arrival not in ARRIVALS:
        raise LabError(f"arrival={arrival!r}: expected one of {', '.join(ARRIVALS)}")
    if not isinstance(burstiness, (int, float)) or not burstiness > 0 or not math.isfinite(burstiness):
        raise LabError(f"burstiness={burstiness!r}: expected a positive number (1 = Poisson)")
    if math.isinf(rate):
        return [0.0] * n
    if arrival == "constant":
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        shape = 1.0 if arrival == "poisson" else float(burstiness)
        gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def run_load(
    engine,
    prompts: list[list[int]],
    mode: str = "closed",
    concurrency: int | None = None,
    rate: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    max_duration_s: float = 300.0,
    cfg: GenerationConfig | None = None,
    manifest: dict | None = None,
    on_row: Callable[[dict], None] | None = None,
    server_metrics=None,
    schedule: list[float] | None = None,
    max_new_tokens: list[int] | None = None,
    client_probe=None,
    stop: threading.Event | None = None,
    start_at: float | None = None,
    adapters: list[str | None] | None = None,
    **labels,
) -> list[dict]:
    """Send ``prompts`` (token ids, one request each) to an HTTP engine in a load shape; one row per request.

    ``mode="closed"``: ``concurrency`` clients (required). ``mode="open"``: ``rate`` requests/s
    with ``arrival`` and ``burstiness`` (:func:`arrival_schedule`, ``seed``), at most
    ``concurrency`` in flight when given. Rows (dicts, in finish order) hold the trace's metrics
    and manifest fields (:func:`lablib.results.store.trace_row`), the HTTP fields (chunk counts,
    usage checks, server timings), ``mode``, ``arrival``, ``rate``, ``concurrency``,
    ``request_index``, ``client`` (closed), ``t_scheduled``, ``schedule_lag_s`` (open), and
    ``error`` (None when it succeeded). ``on_row(row)`` is called in the calling thread as each
    request finishes (write it to disk there). ``server_metrics``: a
    :class:`lablib.engines.http.metrics.MetricsSampler`, started just before the first request and
    stopped after the last (its rows and deltas cover this run). ``client_probe``: a
    :class:`lablib.measure.headroom.LoopLagProbe`, run on the engine's event loop from the first request to the
    last (its ``headroom()`` then says how late the loop that stamps tokens was: the client's own delay). Raises LabError for bad arguments.

    ``schedule``: an open loop's own send times, seconds after the run's start, one per prompt,
    non-decreasing (a trace replay, :mod:`lablib.measure.replay`), instead of ``rate`` (rows: ``rate``
    None, ``arrival`` "schedule"). ``max_new_tokens``: one output budget per prompt (tokens; each
    request's ``cfg`` with its own), instead of ``cfg.max_new_tokens`` for all. ``adapters``: one LoRA adapter
    name (or None: the base model) per prompt, each request's ``cfg`` with its own, instead of ``cfg.adapter``
    for all (lab 11's multi-LoRA loop: ``adapters[i] = names[i % C]`` gives C clients a different adapter each
    in flight); every name is checked against the server's before any request is sent (LabError naming those it
    serves), and every row says its request's ``adapter`` when the run names one or the server serves any. ``stop``: a
    :class:`threading.Event` another thread may set (a panel's Cancel): from then on no request is sent (a
    sleeping schedule wakes within :data:`STOP_POLL_S`), those in flight finish and give their rows; the
    requests never sent give none. ``start_at``: the run's start on the lab's clock (:func:`lablib.results.trace.now`,
    ``CLOCK_MONOTONIC`` on Linux: one clock for every process of a machine), a moment still to come: the loop
    waits for it, and its schedule, deadline and first ``t_submit`` count from it (several client processes
    on one start: :mod:`lablib.measure.processes`); None: now.
    """
    from lablib.engines.http import HTTPEngine
    from lablib.results.store import engine_manifest

    if not isinstance(engine, HTTPEngine):
        raise LabError(
            f"run_load drives an http engine (load_engine('http', ...)); got {type(engine).__name__}: "
            "for in-process engines use lablib.measure.closed_loop.run_closed_loop"
        )
    concurrency = _check_shape(mode, prompts, concurrency, max_duration_s)
    cfg = cfg or GenerationConfig()
    cfgs = _request_configs(cfg, max_new_tokens, len(prompts), adapters)
    for c in cfgs:  # an adapter the server does not serve: refused before any request is sent
        engine.check_adapter_request(c)
    named = adapters is not None or any(c.adapter is not None for c in cfgs) or bool(getattr(engine, "adapters", None))
    prompts = [[int(t) for t in p] for p in prompts]
    for i, p in enumerate(prompts):
        if not p:
            raise LabError(f"prompt {i} is empty: expected at least one token id")
        engine.check_ids(p)
        engine.check_context(len(p), cfgs[i].max_new_tokens)
    schedule = _open_schedule(mode, len(prompts), rate, arrival, burstiness, seed, schedule)
    if schedule is not None and rate is None:
        arrival = "schedule"
    manifest = manifest or engine_manifest(
        engine,
        {
            "mode": mode,
            "requests": len(prompts),
            "concurrency": concurrency,
            "rate": rate,
            "arrival": arrival if mode == "open" else None,
            "burstiness": burstiness if mode == "open" else None,
            "seed": seed,
            "max_new_tokens": sorted({c.max_new_tokens for c in cfgs}) if max_new_tokens else cfg.max_new_tokens,
            "max_duration_s": max_duration_s,
            "prompt_tokens": sorted({len(p) for p in prompts}),
            **({"adapters": sorted({c.adapter for c in cfgs if c.adapter is not None})} if named else {}),
        },
    )
    base = dict(
        labels,
        mode=mode,
        concurrency=concurrency,
        rate=rate if mode == "open" else None,
        arrival=arrival if mode == "open" else None,
        burstiness=burstiness if mode == "open" and rate is not None else None,
    )
    if named:
        base["adapter"] = None  # each row's own, from its request's cfg (_one)
    from lablib.measure.headroom import frozen_heap

    # the heap so far frozen first (its full collection now, before the first scrape, the probe and any stamp):
    # no collection during the run walks it (frozen_heap: pauses of the stamping loop up to 190-270 ms at
    # 512-1,024 streams)
    with frozen_heap():
        if server_metrics is not None:
            server_metrics.start()  # its first scrape, before any request
        try:
            if client_probe is not None:  # after the manifest and prompts: work before the run is no token's delay
                client_probe.start(engine)
            try:
                return _drive(
                    engine,
                    prompts,
                    mode,
                    concurrency,
                    schedule,
                    cfgs,
                    max_duration_s,
                    manifest,
                    base,
                    on_row,
                    stop,
                    start_at,
                )
            finally:
                if client_probe is not None:
                    client_probe.stop()
        finally:
            if server_metrics is not None:
                server_metrics.stop()  # its last scrape, after the last row


def _check_shape(mode, prompts, concurrency, max_duration_s) -> int | None:
    """A load run's shape checked (one run_load or one from several processes): its concurrency, whole or None."""
    if mode not in LOAD_SHAPES:
        raise LabError(f"mode={mode!r}: expected 'closed' or 'open'")
    if not prompts or len(prompts) > MAX_REQUESTS:
        raise LabError(f"{len(prompts or [])} prompts: expected 1 to {MAX_REQUESTS} requests")
    if concurrency is not None:
        concurrency = whole(concurrency, "concurrency", "a whole number of requests in flight, at least 1")
    if mode == "closed" and concurrency is None:
        raise LabError("a closed loop needs concurrency=C (clients)")
    _check_max_duration(max_duration_s)
    return concurrency


def _open_schedule(mode, n, rate, arrival, burstiness, seed, schedule) -> list[float] | None:
    """An open loop's send times: ``schedule`` checked, or made from ``rate`` (:func:`arrival_schedule`); None
    for a closed loop."""
    if schedule is not None:
        if mode != "open" or rate is not None:
            raise LabError("schedule=[...] is an open loop's send times: expected mode='open' and no rate")
        return _check_schedule(schedule, n)
    if mode == "open":
        if rate is None:
            raise LabError("an open loop needs rate=R (requests per second; math.inf for all at once)")
        return arrival_schedule(n, rate, arrival, burstiness, seed)
    return None


def _check_max_duration(max_duration_s) -> None:
    if not isinstance(max_duration_s, (int, float)) or not 0 < max_duration_s < math.inf:
        raise LabError(
            f"max_duration_s={max_duration_s!r}: expected a positive, finite number of seconds "
            "(every load run is bounded in time)"
        )


def _request_configs(cfg, max_new_tokens, n, adapters=None):
    """One GenerationConfig per request: ``cfg``, or ``cfg`` with each of ``max_new_tokens`` and / or each of
    ``adapters`` (n of each)."""
    import dataclasses

    if max_new_tokens is None and adapters is None:
        return [cfg] * n
    budgets = [cfg.max_new_tokens] * n if max_new_tokens is None else list(max_new_tokens)
    if len(budgets) != n:
        raise LabError(f"{len(budgets)} max_new_tokens for {n} prompts: expected one output budget per prompt")
    if isinstance(adapters, str):
        raise LabError(
            f"adapters={adapters!r}: expected one adapter name (or None) per prompt, a list; for one adapter on "
            "every request, GenerationConfig(adapter=...)"
        )
    names = [cfg.adapter] * n if adapters is None else list(adapters)
    if len(names) != n:
        raise LabError(f"{len(names)} adapters for {n} prompts: expected one adapter name (or None) per prompt")
    # each checked: at least 1 token, an adapter's name a non-empty string or None
    return [dataclasses.replace(cfg, max_new_tokens=m, adapter=a) for m, a in zip(budgets, names)]


def _check_schedule(schedule, n) -> list[float]:
    """Send times (seconds after the run's start): n of them, finite, from 0 up, non-decreasing."""
    times = list(schedule)
    if len(times) != n:
        raise LabError(f"{len(times)} send times for {n} prompts: expected one per prompt")
    last = 0.0
    for i, t in enumerate(times):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < last:
            raise LabError(
                f"send time {i} = {t!r}: expected finite seconds from 0 up, in order (after {last}): sort the schedule"
            )
        last = float(t)
    return [float(t) for t in times]


def _drive(
    engine, prompts, mode, concurrency, schedule, cfgs, max_duration_s, manifest, base, on_row, stop=None, start_at=None
):
    """The run on the engine's event loop; rows to ``on_row`` in the calling thread (``cfgs``: one per prompt)."""
    rows_q = _Rows()
    run = (
        _closed(engine, prompts, concurrency, cfgs, max_duration_s, manifest, base, rows_q, stop, start_at)
        if mode == "closed"
        else _open(engine, prompts, schedule, concurrency, cfgs, max_duration_s, manifest, base, rows_q, stop, start_at)
    )
    ended = threading.Event()

    async def guarded():
        try:
            return await run
        finally:
            # the run's tasks are all done: cancelled ones have emitted their rows, finished ones have theirs queued
            # on this loop (_one's call_soon), which run before this: an interrupt then finds every row in rows_q
            asyncio.get_running_loop().call_soon(ended.set)

    fut = engine.submit(guarded())  # on the engine's event loop, which times the streams
    rows: list[dict] = []
    try:
        while True:  # rows go to on_row here, in the calling thread, while the loop keeps timing streams
            try:
                row = rows_q.row(rows_q.get(timeout=0.05))
            except queue.Empty:
                if fut.done() and rows_q.empty():
                    break
                continue
            rows.append(row)
            if on_row is not None:
                on_row(row)
    except KeyboardInterrupt as e:  # Ctrl-C (or a SIGTERM a command turned into one): rows of those in flight too
        rows_q.stopped = f"interrupted by {e.args[0] if e.args and isinstance(e.args[0], str) else 'SIGINT'}"
        fut.cancel()
        ended.wait(timeout=5)
        try:
            while not rows_q.empty():
                rows.append(rows_q.row(rows_q.get_nowait()))
                if on_row is not None:
                    on_row(rows[-1])
        except Exception:  # noqa: BLE001 - the interrupt is what the caller sees
            pass
        raise
    except BaseException:  # on_row failed (a full disk): stop the run, its requests with it
        fut.cancel()
        raise
    fut.result()  # re-raise a bug in the driver itself
    return rows


class _Rows(queue.Queue):
    """The rows of a run on their way to the calling thread; called as ``emit(row)``, or ``emit.request(trace,
    manifest, error, labels)``: what a finished request's row is made of, made into the row
    (:func:`request_row`) by :meth:`row` in the calling thread, off the event loop that stamps the other streams
    (profiled at 512 streams on the fast server, building rows took about 4 % of that loop's time). ``stopped``:
    why the run was stopped from outside (an interrupt), for the rows of the requests it cancels."""

    stopped: str | None = None
    _columns: tuple[dict, dict] | None = None  # (a manifest, its flattened columns): a run's rows share one

    def __call__(self, row: dict) -> None:
        self.put(row)

    def request(self, trace, manifest: dict, error: str | None, labels: dict) -> None:
        self.put((trace, manifest, error, labels))

    def row(self, item) -> dict:
        """An item of the queue as its row (the manifest's columns flattened once a run: the rows' thread holds
        the GIL through a burst of finished requests, while the loop waits to stamp the next tokens)."""
        if isinstance(item, dict):
            return item
        trace, manifest, error, labels = item
        if self._columns is None or self._columns[0] is not manifest:
            self._columns = (manifest, flatten_manifest(manifest))
        return request_row(trace, manifest, error, manifest_columns=self._columns[1], **labels)


def _jsonable(x):
    """numpy scalars and other odd values of a summary, for json.dumps."""
    try:
        return x.item()
    except AttributeError:
        return str(x)


def client_headroom_of(probe, itl_p50_s: float | None) -> dict:
    """The client's headroom in one run (:meth:`lablib.measure.headroom.LoopLagProbe.headroom`): near its
    limit when the stamping loop's p99 lag is above a tenth of the run's median ITL (``itl_p50_s``, seconds;
    at least :data:`lablib.measure.headroom.NEAR_LIMIT_S`): then the rows' ITL and TTFT p99 hold more than
    10 % of the client's own delay."""
    from lablib.measure.headroom import NEAR_LIMIT_S

    return probe.headroom(max(NEAR_LIMIT_S, 0.1 * itl_p50_s) if itl_p50_s else NEAR_LIMIT_S)


def rate_sweep(engine, prompts: list[list[int]], rates, **kw) -> list[dict]:
    """:func:`run_load` in an open loop once per rate in ``rates`` (requests/s, in the order
    given), each with the same prompts and seeded schedule; the rows of all runs, each with its
    ``rate``. ``kw`` goes to run_load (arrival, burstiness, seed, concurrency, max_duration_s
    per rate, cfg, on_row, labels)."""
    rates = list(rates)
    if not rates:
        raise LabError("no rates: expected one or more requests-per-second values")
    rows: list[dict] = []
    for r in rates:
        rows += run_load(engine, prompts, "open", rate=r, **kw)
    return rows


def parse_rates(text) -> list[float]:
    """Rates from "0.5,1,2" (or "inf"), requests/s; LabError naming a bad one."""
    out = []
    for part in csv_list(str(text), "rates", "0.5,1,2") or [""]:
        try:
            r = float(part)
        except ValueError:
            r = None
        if r is None or not r > 0:
            raise LabError(
                f"rates={str(text)!r}: rate {part!r} is not a number above 0; expected requests per second (or inf), "
                "several as 0.5,1,2"
            )
        out.append(r)
    return out


def _manifest_columns(manifest: dict) -> dict:
    """The manifest fields trace_row puts on every row (engine, model, hardware ...)."""
    dummy = RequestTrace(prompt_tokens=1, t_submit=0.0, t_start=0.0)
    dummy.token(-1, 1.0)
    row = trace_row(dummy, manifest)
    drop = set(dummy.metrics()) | {"itl_s", "t_submit", "t_start", "t_first_token", "t_last_token"}
    return {k: v for k, v in row.items() if k not in drop}


def request_row(
    trace, manifest: dict, error: str | None = None, *, manifest_columns: dict | None = None, **labels
) -> dict:
    """One tidy row of an HTTP request: :func:`trace_row` when tokens arrived, else the manifest
    columns and what is known (prompt tokens, t_submit, t_start, output tokens so far) with ``error``
    (``manifest_columns``: :func:`trace_row`'s)."""
    if trace is not None and trace.t_tokens and trace.t_start is not None:
        row = trace_row(trace, manifest, manifest_columns=manifest_columns, **labels)
        row["token_ids"] = list(trace.token_ids)
    else:
        row = dict(labels)
        row.update(_manifest_columns(manifest))
        if trace is not None:
            row.update(
                prompt_tokens=trace.prompt_tokens,
                output_tokens=trace.output_tokens,
                t_submit=trace.t_submit,
                t_start=trace.t_start,
                server=getattr(trace, "server", None),
                api=getattr(trace, "api", None),
            )
    row["error"] = error
    return row


async def _one(engine, ids, cfg, t_submit, manifest, labels, emit):
    if "adapter" in labels:  # a run that names adapters: the one this request used
        labels = dict(labels, adapter=cfg.adapter)
    box: dict = {}
    # the row is made in the calling thread (_Rows.row), off this loop, which stamps the other streams' tokens;
    # handed over in the loop's next turn, with the client's next request (_closed): that thread takes the GIL
    # once this loop next waits, after the request is sent, not in between (at 1 client: +43 us of queue_s for
    # a yield before the next request, against +130 us with the row handed over before the yield)
    try:
        trace = await engine.agenerate(ids, cfg, t_submit=t_submit, _checked=True, box=box)
        asyncio.get_running_loop().call_soon(emit.request, trace, manifest, None, labels)
    except asyncio.CancelledError:
        why = getattr(emit, "stopped", None)
        why = f"{why}: stopped in flight" if why else "cancelled at the run's time limit (max_duration_s)"
        emit.request(box.get("trace"), manifest, why, labels)
        raise
    except LabError as e:  # HTTPEngineError: what arrived is in its trace
        emit.request(getattr(e, "trace", None) or box.get("trace"), manifest, str(e), labels)


async def _bounded(tasks, deadline):
    if not tasks:
        return
    try:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - now()))
    except asyncio.CancelledError:  # the run itself was stopped: its requests stop with it
        pending = tasks
        raise
    finally:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _start(start_at: float | None) -> float:
    """The run's start: ``start_at`` once it has come (slept to on this loop), else now."""
    if start_at is None:
        return now()
    while (delay := start_at - now()) > 0:
        await asyncio.sleep(delay)
    return start_at


async def _closed(engine, prompts, clients, cfgs, max_duration_s, manifest, base, emit, stop=None, start_at=None):
    t0 = await _start(start_at)
    deadline = t0 + max_duration_s
    nxt = iter(range(len(prompts)))

    async def client(c):
        t_submit = t0
        for i in nxt:
            if now() >= deadline or (stop is not None and stop.is_set()):
                return
            await _one(engine, prompts[i], cfgs[i], t_submit, manifest, dict(base, request_index=i, client=c), emit)
            t_submit = now()  # the client wants its next request the moment this one finished,
            # and sends it after the loop has run what was already ready (other streams' tokens, read in the same
            # poll): a request's send costs the loop 0.4 ms (queue_s p50 at 1 client, mostly aiohttp), which
            # went into the stamps of those tokens, unseen (16 streams on the fast server, benchmarks/
            # client_capacity.py: added ITL p99 2.8-3.7 ms within 15 ms of a request's start or end, 0.8-1.0
            # with this; vllm bench's client 0.9), and now goes into this request's queue_s, where it is
            await asyncio.sleep(0)

    await _bounded([asyncio.ensure_future(client(c)) for c in range(min(clients, len(prompts)))], deadline)


async def _open(engine, prompts, schedule, cap, cfgs, max_duration_s, manifest, base, emit, stop=None, start_at=None):
    t0 = await _start(start_at)
    deadline = t0 + max_duration_s
    sem = asyncio.Semaphore(cap) if cap else None
    tasks = []

    async def send(i, t_sched, t_disp):
        labels = dict(base, request_index=i, t_scheduled=t_sched - t0, schedule_lag_s=t_disp - t_sched)
        if sem is None:
            await _one(engine, prompts[i], cfgs[i], t_sched, manifest, labels, emit)
            return
        try:
            await sem.acquire()  # waiting here is the request's queue_s (t_start - t_submit)
        except asyncio.CancelledError:
            why = getattr(emit, "stopped", None) or "the run's time limit (max_duration_s) came"
            emit(
                request_row(
                    None,
                    manifest,
                    f"not sent: {why} while it waited for the concurrency cap",
                    **labels,
                    prompt_tokens=len(prompts[i]),
                )
            )
            raise
        try:
            if stop is None or not stop.is_set():  # stopped while it waited for the cap: never sent
                await _one(engine, prompts[i], cfgs[i], t_sched, manifest, labels, emit)
        finally:
            sem.release()

    try:
        for i, offset in enumerate(schedule):
            t_sched = t0 + offset
            if t_sched >= deadline:
                break
            delay = t_sched - now()
            while delay > 0 and not (stop is not None and stop.is_set()):
                await asyncio.sleep(delay if stop is None else min(delay, STOP_POLL_S))
                delay = t_sched - now()
            if stop is not None and stop.is_set():
                break
            tasks.append(asyncio.ensure_future(send(i, t_sched, now())))
    except asyncio.CancelledError:  # the run itself was stopped while it scheduled
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    await _bounded(tasks, deadline)


# --- one run from several client processes (lablib.measure.processes) ----------------------------
# Ctrl-C blocked while a client process is born, where signal masks exist (POSIX; not Windows): see run_load_processes
_MASKS = hasattr(signal, "pthread_sigmask")


def _process_worker(index: int, engine_kw: dict, job: dict, to_worker, to_parent) -> None:
    """One client process: an http engine, ready; then run_load from the shared start, rows to the parent."""
    import os
    import signal

    from lablib.children import first_interrupt_handler

    # the first SIGINT stops the run (its rows in flight recorded), later ones are dropped; set even where SIGINT
    # came ignored (a background job): the lab's process stops this one by SIGINT
    signal.signal(signal.SIGINT, first_interrupt_handler())
    engine = headroom = error = None
    frozen = contextlib.ExitStack()
    try:
        if _MASKS:  # born with Ctrl-C blocked (run_load_processes): one that came since is raised here
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        from lablib.engines import load_engine
        from lablib.measure.headroom import LoopLagProbe, frozen_heap

        engine = load_engine("http", **engine_kw)
        if job["prompts"]:  # one unrecorded request of 2 tokens: the request path's imports and first connection
            import dataclasses

            engine.generate(job["prompts"][0], dataclasses.replace(job["cfg"], max_new_tokens=2))
        # this process's heap frozen before the shared start: run_load's own (nested) collection is then of the
        # few objects made since, well within START_MARGIN_S
        frozen.enter_context(frozen_heap())
        to_parent.put(("ready", index, os.getpid()))
        start_at = to_worker.get()
        if start_at is None:  # another process failed before the start
            return
        local = job["requests"]
        clients = job["clients"]

        def emit(row: dict) -> None:
            row["request_index"] = local[row["request_index"]]
            if clients is not None and row.get("client") is not None:
                row["client"] = clients[row["client"]]
            row.update(job["run_labels"], client_process=index)
            to_parent.put(("row", index, row))

        probe = LoopLagProbe()
        itl = []
        try:
            rows = run_load(
                engine,
                job["prompts"],
                job["mode"],
                concurrency=job["concurrency"],
                schedule=job["schedule"],
                max_duration_s=job["max_duration_s"],
                cfg=job["cfg"],
                manifest=job["manifest"],
                max_new_tokens=job["max_new_tokens"],
                adapters=job["adapters"],
                on_row=emit,
                client_probe=probe,
                start_at=start_at,
                **job["labels"],
            )
            itl = [x for r in rows if not r.get("error") for x in (r.get("itl_s") or [])]
        finally:
            from lablib.results.tables import percentile

            headroom = client_headroom_of(probe, percentile(itl, 50) if itl else None)
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as e:  # noqa: BLE001 - the parent says it, with this process's index
        error = f"{type(e).__name__}: {e}"
    finally:
        frozen.close()  # thawed
        if engine is not None:
            engine.close()
        to_parent.put(("done", index, {"headroom": headroom, "error": error, "pid": os.getpid()}))


def run_load_processes(
    engine_kw: dict,
    prompts: list[list[int]],
    mode: str = "closed",
    processes: int = 2,
    concurrency: int | None = None,
    rate: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    schedule: list[float] | None = None,
    max_duration_s: float = 300.0,
    cfg=None,
    manifest: dict | None = None,
    max_new_tokens: list[int] | None = None,
    on_row: Callable[[dict], None] | None = None,
    start_at: float | None = None,
    adapters: list[str | None] | None = None,
    **labels,
) -> tuple[list[dict], list[dict]]:
    """:func:`lablib.measure.load.run_load`'s run from ``processes`` client processes on one start (see the module).

    ``engine_kw``: :func:`lablib.engines.load_engine`'s keywords for the ``http`` engine each process makes
    (``model``, ``base_url``, ``server``, ``api``, timeouts...; picklable). ``manifest``: the run's manifest
    (every row's; the caller's engine's, with ``client_processes`` in its workload when None is not given). The
    other arguments are run_load's (``start_at``: the shared start on the lab's clock; None: just after every
    process is ready). Returns (rows in arrival order, one dict per process: ``process``, ``pid``,
    ``streams`` (its clients, or its share of the cap), ``requests``, ``rows``, ``error``, and its
    ``client_headroom``). Raises LabError for bad arguments, a process that fails to get ready, or one that
    fails during the run (after every row that arrived was passed to ``on_row``)."""
    import multiprocessing
    import os
    import signal
    import time

    from lablib.children import interrupts_held
    from lablib.measure.processes import DONE_GRACE_S, START_MARGIN_S, _collect, _plan, _wait_ready, refuse_in_bootstrap

    refuse_in_bootstrap()
    processes = whole(processes, "processes", "a whole number of client processes, at least 1")
    concurrency = _check_shape(mode, prompts, concurrency, max_duration_s)
    schedule = _open_schedule(mode, len(prompts), rate, arrival, burstiness, seed, schedule)
    processes = min(processes, concurrency or processes, len(prompts))
    cfg = cfg or GenerationConfig()
    _request_configs(cfg, max_new_tokens, len(prompts), adapters)  # one budget / adapter per prompt, checked here
    plans = _plan(len(prompts), mode, concurrency, processes)
    ctx = multiprocessing.get_context("spawn")
    to_parent = ctx.Queue()
    workers = []
    rows: list[dict] = []
    try:  # from the first process started: an interrupt while the others start stops it too
        for p, plan in enumerate(plans):
            idx = plan["requests"]
            job = {
                "prompts": [prompts[i] for i in idx],
                "requests": idx,
                "clients": plan["clients"],
                "mode": mode,
                "concurrency": plan["concurrency"],
                # the open loop's send times of this process's requests, on the run's time line (from the shared start)
                "schedule": [schedule[i] for i in idx] if mode == "open" else None,
                "max_duration_s": max_duration_s,
                "cfg": cfg,
                "manifest": manifest,
                "max_new_tokens": [max_new_tokens[i] for i in idx] if max_new_tokens is not None else None,
                "adapters": [adapters[i] for i in idx] if adapters is not None else None,
                "labels": labels,
                # the run's own labels on every row, not this process's share (its concurrency, its sub-schedule)
                "run_labels": {"concurrency": concurrency}
                if mode == "closed"
                else {
                    "concurrency": concurrency,
                    "rate": rate,
                    "arrival": arrival if rate is not None else "schedule",
                    "burstiness": burstiness if rate is not None else None,
                },
            }
            to_worker = ctx.Queue()
            proc = ctx.Process(target=_process_worker, args=(p, engine_kw, job, to_worker, to_parent), daemon=True)
            # a Ctrl-C inside start() lost the started process (it waited for its start for ever): held until the
            # process is among the workers, which the except below interrupts and the finally joins
            with interrupts_held() as held:
                # born with Ctrl-C blocked (a signal mask survives fork and exec; multiprocessing's resource tracker
                # starts so too), unblocked by _process_worker once its handler is set: a Ctrl-C before (the
                # terminal's, or the one the except below passes on) waits for it. Else it came while the new
                # Python imported: a KeyboardInterrupt traceback, or "Fatal Python error: init_import_site"
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if _MASKS else None
                try:
                    proc.start()
                finally:
                    if blocked is not None:
                        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                workers.append({"proc": proc, "to": to_worker, "plan": plan, "rows": 0, "done": None})
                held.release()
        _wait_ready(workers, to_parent)
        if start_at is None:
            start_at = now() + START_MARGIN_S
        for w in workers:
            w["to"].put(start_at)
        _collect(workers, to_parent, rows, on_row)
    except KeyboardInterrupt:
        for w in workers:
            # no start is coming: a process whose own Ctrl-C was dropped (raised inside a finalizer: "Exception
            # ignored in ...") went on, got ready and waited for it, and this run for the process (DONE_GRACE_S, then
            # the finally's join: lablib bench exited 41 s after its Ctrl-C)
            w["to"].put(None)
            if w["proc"].is_alive() and w["done"] is None:
                os.kill(w["proc"].pid, signal.SIGINT)
        try:
            _collect(workers, to_parent, rows, on_row, deadline=time.monotonic() + DONE_GRACE_S)
        except (LabError, KeyboardInterrupt):
            pass
        raise
    except BaseException:
        for w in workers:
            w["to"].put(None)
        raise
    finally:
        for w in workers:
            w["proc"].join(timeout=5)
            if w["proc"].is_alive():
                w["proc"].kill()
                w["proc"].join(timeout=5)
    out = []
    for p, w in enumerate(workers):
        d = w["done"] or {}
        out.append(
            {
                "process": p,
                "pid": d.get("pid"),
                "streams": w["plan"]["concurrency"],
                "requests": len(w["plan"]["requests"]),
                "rows": w["rows"],
                "error": d.get("error"),
                "client_headroom": d.get("headroom"),
            }
        )
    failed = [o for o in out if o["error"]]
    if failed:
        raise LabError(
            "client process "
            + "; ".join(f"{o['process']} (pid {o['pid']}): {o['error']}" for o in failed)
            + f"; the {len(rows)} rows that arrived were kept"
        )
    return rows, out


# --- summaries ----------------------------------------------------------------------------------
def summarize(rows, ttft_s: float | None = None, tpot_s: float | None = None, e2e_s: float | None = None) -> dict:
    """One run in numbers: :func:`lablib.results.tables.run_summary` of ``rows`` against the goodput
    targets ``ttft_s``, ``tpot_s``, ``e2e_s`` (seconds; None: no target)."""
    return run_summary(rows, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s)


# --- lablib bench -------------------------------------------------------------------------------
def bench(
    *,
    base_url: str,
    out,
    requests: int,
    prompt_tokens: int,
    max_new_tokens: int,
    rates=None,
    concurrency: int | None = None,
    model=None,
    server_model: str | None = None,
    api: str = "completions",
    server: str = "auto",
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    until_eos: bool = False,
    max_duration_s: float = 300.0,
    read_timeout_s: float = 60.0,
    connect_timeout_s: float = 10.0,
    request_timeout_s: float = 600.0,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
    warmup: int = 1,
    metrics_interval_s: float = 0.25,
    log=print,
    on_summary: Callable[[dict], None] | None = None,
    prompts: str = "prose",
    client_processes: int | str = 1,
    start_at_unix: float | None = None,
    price_per_hour: float | None = None,
    on_row: Callable[[dict], None] | None = None,
    stop: threading.Event | None = None,
) -> list[dict]:
    """Load on the OpenAI-compatible server at ``base_url`` (``lablib bench``): one summary per run.

    ``requests`` prompts of exactly ``prompt_tokens`` tokens, made with ``model``'s tokenizer (a lab model's
    name or a ResolvedModel; None: the default): with ``prompts="prose"``, the lab's prose cut at distinct
    offsets, so no request shares a prefix with another; with ``prompts="random"``, the prompts
    ``vllm bench serve --dataset-name random --seed <seed>`` sends
    (:func:`lablib.measure.workload.random_prompts` of ``seed``); ``max_new_tokens`` each (exactly, unless
    ``until_eos``). ``warmup`` unrecorded requests first, on prompts of their own (random ones: of
    ``seed + 1``). Then an open loop per rate of ``rates`` (requests/s: a list, or
    "0.5,1,2"; "inf" all at once) with at most ``concurrency`` in flight when given, or, with ``rates``
    None, a closed loop of ``concurrency`` clients (:func:`run_load`: ``arrival``, ``burstiness``, ``seed``,
    ``max_duration_s`` per run). Every row is appended to ``out`` (.jsonl/.parquet) as it finishes.
    ``read_timeout_s`` (the longest silence within a response), ``connect_timeout_s`` (to open a
    connection) and ``request_timeout_s`` (one request from its POST to its end, however busy its stream:
    a server sending keep-alive comments forever) bound a request the server does not answer or finish:
    it becomes an error row saying which.

    Each summary is :func:`lablib.results.tables.run_summary` of the run (goodput against ``ttft_s``,
    ``tpot_s``, ``e2e_s``) with ``server`` (the server's kind), ``mode``, ``rate`` and ``concurrency``;
    ``on_summary(summary)`` is called as each run ends. Raises LabError for bad arguments (before any
    work) and when no server answers.

    When the server answers ``/metrics`` (vLLM; llama-server with --metrics), each run is sampled every
    ``metrics_interval_s`` seconds (:class:`lablib.engines.http.metrics.MetricsSampler`, after the warm-up):
    its tidy rows, with the run's ``mode``, ``rate`` and ``concurrency``, are appended as plain JSON lines
    to ``<out without suffix>.server.jsonl``, and each summary gets ``server_counters`` (the run's counter
    deltas and gauge maxima by common name, with ``scrapes``, ``scrape_failures``, ``scrape_s_max``) and
    ``server_info`` (what the server says of itself: the sampler's ``info``); both None without ``/metrics``.
    An interrupt (KeyboardInterrupt: Ctrl-C, or SIGTERM as ``lablib bench`` turns it into one) leaves with
    ``rows_written`` set on it: the rows of this call on disk in ``out`` (0 when it came before the first).
    Every summary also gets ``client_headroom`` (:func:`client_headroom_of`: how late the loop that stamped the
    tokens was, and whether that makes the client the limit) and is appended, with ``out``, to
    ``<out without suffix>.runs.jsonl`` as its run ends. ``on_row(row)``: each measured row too, as it is written
    (the warm-up's are neither). ``stop`` (one client process; lab 05's panel's Cancel): once set, no further
    request is sent (the ones in flight finish, their rows are kept; a warm-up request is cancelled) and no further
    run starts.

    ``client_processes``: how many client processes share each run's streams (:mod:`lablib.measure.processes`:
    one start on the machine's one clock, the rows merged into ``out``); ``"auto"``: one per
    :data:`lablib.measure.processes.STREAMS_PER_PROCESS` streams (the closed loop's clients, the open loop's
    cap), at most the usable cores less one. ``start_at_unix``: the first run starts at this Unix time (seconds;
    the same on several client machines, whose clocks NTP keeps together: one run from all of them, merged with
    ``lablib merge --one-clock``), which must still be to come when the warm-up is done.

    ``price_per_hour``: the machine's price for an hour (any currency): each summary's ``cost_per_mtok`` is
    what its output cost per million tokens at this load (:func:`lablib.machine.telemetry.cost_per_million_tokens`).
    Each run is sampled (:class:`lablib.machine.telemetry.RunTelemetry`): where NVML answers (an NVIDIA GPU
    here) memory, SM clock, power and the energy counter, where RAPL is readable the CPU packages' energy; its
    summary gets :data:`lablib.results.schema.TELEMETRY` (``gpu_energy_j``, ``gpu_j_per_output_token``,
    ``cpu_energy_j`` ...); elsewhere ``gpu_telemetry`` and ``cpu_energy_note`` say why there are none. With more than one, each summary's ``client_processes`` lists
    each process's streams, rows and ``client_headroom``, and its ``client_headroom`` is the worst of them.
    """
    import json

    from lablib.engines import load_engine
    from lablib.engines.http.metrics import MetricsSampler, scrape
    from lablib.measure.headroom import LoopLagProbe
    from lablib.measure.workload import PROMPT_KINDS, distinct_prompts, random_prompts
    from lablib.model.resolve import ResolvedModel, prepare
    from lablib.results.store import LOAD_SYNC_S, ResultsWriter, _suffix

    _suffix(out)  # a bad file name is refused before any work
    if prompts not in PROMPT_KINDS:
        raise LabError(f"prompts={prompts!r}: expected one of {', '.join(PROMPT_KINDS)}")
    if rates is None:
        mode, rates = "closed", [None]
        if concurrency is None:
            raise LabError("a closed loop needs concurrency=C (clients); an open loop rates=[R, ...]")
    else:
        mode = "open"
        rates = parse_rates(rates if isinstance(rates, str) else ",".join(map(str, rates)))
    whole(requests, "requests", f"a whole number from 1 to {MAX_REQUESTS}", hi=MAX_REQUESTS)
    for what, n in (("prompt_tokens", prompt_tokens), ("max_new_tokens", max_new_tokens)):
        whole(n, what, "at least 1")
    warmup = whole(warmup, "warmup", "0 or more", lo=0)
    # the run's own parameters too, before the server is asked anything (run_load checks them again)
    if concurrency is not None:
        concurrency = whole(concurrency, "concurrency", "a whole number of requests in flight, at least 1")
    if mode == "open":
        arrival_schedule(1, rates[0], arrival, burstiness, seed)  # arrival and burstiness
    _check_max_duration(max_duration_s)
    check_targets(ttft_s, tpot_s, e2e_s)
    from lablib.machine.telemetry import RunTelemetry, cost_per_million_tokens
    from lablib.measure.headroom import frozen_heap
    from lablib.measure.processes import auto_processes, refuse_in_bootstrap

    cost_per_million_tokens(price_per_hour, 1.0, 1)  # a bad price is refused before any work

    if client_processes == "auto":
        client_processes = auto_processes(concurrency)
    client_processes = whole(
        client_processes, "client_processes", "a whole number of client processes, at least 1 (or 'auto')"
    )
    if client_processes > 1:  # a client process re-running an unguarded script stops here, before its warm-up
        refuse_in_bootstrap()
    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=not until_eos)
    if prompts == "random":  # vllm bench's measured prompts, in its order; the warm-up's of another seed
        warm = random_prompts(rm, prompt_tokens, warmup, seed + 1) if warmup else []
        prompts = warm + random_prompts(rm, prompt_tokens, requests, seed)
    else:
        prompts = distinct_prompts(rm, prompt_tokens, warmup + requests)  # a server's prefix cache stays cold
    writer = ResultsWriter(out, sync_every_s=LOAD_SYNC_S)  # a bad out is refused before any request
    summaries, engine = [], None
    runs_file = runs_path(out)
    try:
        engine = load_engine(
            "http",
            rm,
            base_url=base_url,
            api=api,
            server=server,
            server_model=server_model,
            read_timeout_s=read_timeout_s,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
        )
        try:
            scrape(engine.root_url)
            server_file = server_path(out)
        except LabError as e:
            log(f"no server counters: {e}")
            server_file = None
        for ids in prompts[:warmup]:
            if not _warm_up(engine, ids, cfg, stop):
                break  # stopped: no run starts (below)
        start_at = None
        if start_at_unix is not None:
            import time as _time

            from lablib.results.trace import now

            start_at = now() + (float(start_at_unix) - _time.time())
            if start_at <= now():
                raise LabError(
                    f"start_at_unix={start_at_unix}: that time has passed ({_time.time() - float(start_at_unix):.1f} s "
                    "ago, after the warm-up); expected a moment still to come on every client machine"
                )

        def keep(row: dict) -> None:
            writer.append(row)
            if on_row is not None:
                on_row(row)

        with writer:  # the rows made durable at the end, whatever ends the runs (a failed run: its error, not a sync's)
            for rate in rates:
                if stop is not None and stop.is_set():
                    break
                labels = {"server": engine.kind, "mode": mode, "rate": rate, "concurrency": concurrency}
                sampler = None if server_file is None else MetricsSampler(engine.root_url, metrics_interval_s, **labels)
                probe = LoopLagProbe()
                shape = dict(concurrency=concurrency, rate=rate, arrival=arrival, burstiness=burstiness, seed=seed)
                per_process = None
                # the heap frozen before the counters' window opens: its full collection is no part of the run's energy
                # (run_load's own, nested, then collects only what was made since: headroom.frozen_heap)
                with frozen_heap(), RunTelemetry() as gpu:  # the GPU's (NVML) and CPU's (RAPL) own counters, where read
                    if client_processes > 1:
                        rows, per_process = _bench_processes(
                            engine,
                            rm,
                            prompts[warmup:],
                            mode,
                            shape,
                            cfg,
                            max_duration_s,
                            client_processes,
                            keep,
                            sampler,
                            start_at,
                        )
                    else:
                        rows = run_load(
                            engine,
                            prompts[warmup:],
                            mode,
                            **shape,
                            max_duration_s=max_duration_s,
                            cfg=cfg,
                            on_row=keep,
                            server_metrics=sampler,
                            client_probe=probe,
                            start_at=start_at,
                            stop=stop,
                        )
                writer.sync()  # the run's last rows made durable before its summary is written
                counters = info = None
                writer.make_folder()  # a run with no rows (none sent in time) writes its records too
                if sampler is not None:
                    with open(server_file, "a") as f:
                        f.writelines(json.dumps(r) + "\n" for r in sampler.rows())
                    counters = dict(
                        sampler.deltas(),
                        scrapes=sampler.scrapes,
                        scrape_failures=sampler.failures,
                        scrape_s_max=max(sampler.scrape_s, default=None),
                    )
                    info = sampler.info
                s = {
                    "server": engine.kind,
                    "mode": mode,
                    "rate": rate,
                    "concurrency": concurrency,
                    **run_summary(rows, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s),
                    "server_counters": counters,
                    "server_info": info,
                }
                s.update(gpu.summary(s["output_tokens"]))
                if price_per_hour is not None:
                    s["price_per_hour"] = price_per_hour
                    s["cost_per_mtok"] = cost_per_million_tokens(price_per_hour, s["makespan_s"], s["output_tokens"])
                start_at = None  # the first run only: the next starts when this one ends
                if per_process is None:
                    s["client_headroom"] = client_headroom_of(probe, s.get("itl_p50_s"))
                else:
                    from lablib.measure.processes import merged_headroom

                    s["client_headroom"] = merged_headroom(per_process)
                    s["client_processes"] = per_process
                with open(runs_file, "a") as f:  # the run's summary on disk beside its rows, headroom included
                    f.write(json.dumps({**s, "out": str(out)}, default=_jsonable) + "\n")
                summaries.append(s)
                if on_summary is not None:
                    on_summary(s)
    except KeyboardInterrupt as e:  # what is on disk, for the message (none while the server was first asked)
        e.rows_written = writer.written
        raise
    finally:
        if engine is not None:
            engine.close()
    return summaries


def _warm_up(engine, ids, cfg, stop: threading.Event | None) -> bool:
    """One of :func:`bench`'s warm-up requests (its answer is no row); True when it ended. With ``stop``, it is
    cancelled once ``stop`` is set (lab 05's Cancel), within :data:`STOP_POLL_S`, and False returned: a server that
    holds it (busy, stuck) kept a cancelled panel waiting for the read timeout, 60 s and more."""
    if stop is None:
        engine.generate(ids, cfg)
        return True
    import concurrent.futures

    engine.check_context(len(ids), cfg.max_new_tokens)
    fut = engine.submit(engine.agenerate(ids, cfg))
    try:
        while not fut.done():
            if stop.is_set():
                return False
            concurrent.futures.wait([fut], timeout=STOP_POLL_S)
        fut.result()  # its error, as generate raises it
        return True
    finally:
        fut.cancel()  # stopped or interrupted: the request stops on the engine's loop (done: no-op)


def process_engine_kw(engine, model) -> dict:
    """:func:`lablib.engines.load_engine`'s keywords for an http engine like ``engine`` in another client process
    (:func:`run_load_processes`' ``engine_kw``): its server, URL, API, model id, version, settings, timeouts and
    context, with ``model`` (the lab's model, a ResolvedModel) for its tokenizer."""
    return dict(
        model=model,
        base_url=engine.base_url,
        api=engine.api,
        server=engine.kind,
        server_model=engine.server_model,
        server_version=engine.server_version,
        server_settings=engine.server_settings or None,
        read_timeout_s=engine.read_timeout_s,
        connect_timeout_s=engine.connect_timeout_s,
        request_timeout_s=engine.request_timeout_s,
        n_ctx=engine.n_ctx,
    )


def _bench_processes(engine, rm, prompts, mode, shape, cfg, max_duration_s, processes, on_row, sampler, start_at=None):
    """One of :func:`bench`'s runs from ``processes`` client processes (:func:`lablib.measure.load.run_load_processes`),
    each with an http engine like ``engine``, every row with ``engine``'s manifest; (rows, per process)."""
    from lablib.results.store import engine_manifest

    manifest = engine_manifest(
        engine,
        {
            "mode": mode,
            "requests": len(prompts),
            **{k: v for k, v in shape.items() if mode == "open" or k in ("concurrency", "seed")},
            "max_new_tokens": cfg.max_new_tokens,
            "max_duration_s": max_duration_s,
            "prompt_tokens": sorted({len(p) for p in prompts}),
            "client_processes": processes,
        },
    )
    engine_kw = process_engine_kw(engine, rm)
    if sampler is not None:
        sampler.start()
    try:
        return run_load_processes(
            engine_kw,
            prompts,
            mode,
            processes=processes,
            **shape,
            max_duration_s=max_duration_s,
            cfg=cfg,
            manifest=manifest,
            on_row=on_row,
            start_at=start_at,
        )
    finally:
        if sampler is not None:
            sampler.stop()
