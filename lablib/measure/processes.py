"""One load run from several client processes on one clock: for servers that produce tokens faster than one
client process can stamp them.

One process's event loop stamps every token of every stream it drives (:mod:`lablib.engines.http`); past a few
hundred streams of a fast server it is busy all the time and its stamps come late (``benchmarks/client_capacity.py``
measures where: :data:`STREAMS_PER_PROCESS`). :func:`run_load_processes` spreads one run's streams over ``processes``
client processes, each :func:`lablib.measure.load.run_load` on an http engine of its own, all starting at one
moment of the lab's clock (``time.perf_counter``, ``CLOCK_MONOTONIC`` on Linux: the same clock in every process of
a machine, so every row's ``t_submit``, ``t_first_token``, ``t_scheduled`` is on one time line, as if one client
had taken them). The rows come back to the calling process as each request finishes, in one list and through
one ``on_row`` (one results file), each with the ``client_process`` that sent it.

How the run is shared (``P`` processes):

- **closed loop** of ``C`` clients: client ``c`` runs in process ``c % P``; request ``i`` goes to the process of
  client ``i % C`` (its share of the requests is its share of the clients);
- **open loop**: request ``i`` at its scheduled time goes to process ``i % P`` (the schedule is computed once,
  here, so the run is the same schedule as in one process); a concurrency cap is shared out as the clients are
  (each process at most its share in flight: the cap is per process, not global);

Each process runs a :class:`lablib.measure.headroom.LoopLagProbe` on its own loop; :func:`run_load_processes`
returns the rows and each process's headroom (``client_processes``), and the worst of them is the run's.
Processes are spawned (a fresh interpreter: the caller's threads and event loops are not copied), ready
before the start is set (their import and tokenizer load are not in any request's time). Ctrl-C (or SIGTERM
turned into one) reaches each worker as SIGINT: each records its requests in flight, as one process does,
and the caller gets every row before the interrupt goes on.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import time
from collections.abc import Callable

from lablib.checks import whole
from lablib.errors import LabError

# below this many streams one process keeps up with the fast scripted server here (benchmarks/client_capacity.py)
STREAMS_PER_PROCESS = 128
START_MARGIN_S = 0.25  # the shared start is this long after the last process said it was ready
READY_TIMEOUT_S = 120.0  # a process that is not ready by then (import, tokenizer) fails the run
DONE_GRACE_S = 30.0  # after an interrupt, how long the processes get to hand back their rows


def auto_processes(concurrency: int | None, cores: int | None = None) -> int:
    """Client processes for ``concurrency`` streams: one per :data:`STREAMS_PER_PROCESS` streams, at most the
    cores the lab may use (:func:`lablib.machine.threads.cpus_usable`) less one for the server when it runs here."""
    if not concurrency:
        return 1
    if cores is None:
        from lablib.machine.threads import cpus_usable

        cores = cpus_usable()
    return max(1, min(math.ceil(concurrency / STREAMS_PER_PROCESS), max(1, cores - 1)))


def share(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` whole shares, the first ones one larger: share(5, 2) = [3, 2]."""
    return [n // parts + (1 if p < n % parts else 0) for p in range(parts)]


def _plan(n_requests: int, mode: str, concurrency: int | None, processes: int) -> list[dict]:
    """Per process: {requests: global indices, concurrency: its clients (or its share of the cap), clients:
    the global client number of each of its local clients}."""
    plans = []
    for p in range(processes):
        if mode == "closed":
            mine = [i for i in range(n_requests) if (i % concurrency) % processes == p]
            clients = list(range(p, concurrency, processes))
            plans.append({"requests": mine, "concurrency": len(clients), "clients": clients})
        else:
            mine = list(range(p, n_requests, processes))
            cap = share(concurrency, processes)[p] if concurrency else None
            plans.append({"requests": mine, "concurrency": cap, "clients": None})
    return [p for p in plans if p["requests"]]


def _worker(index: int, engine_kw: dict, job: dict, to_worker, to_parent) -> None:
    """One client process: an http engine, ready; then run_load from the shared start, rows to the parent."""
    state = {"interrupted": False}

    def once(signum, frame):  # the first SIGINT stops the run (its rows in flight recorded), later ones wait
        if not state["interrupted"]:
            state["interrupted"] = True
            raise KeyboardInterrupt("SIGINT")

    signal.signal(signal.SIGINT, once)
    engine = headroom = error = None
    try:
        from lablib.engines import load_engine
        from lablib.measure.headroom import LoopLagProbe
        from lablib.measure.load import client_headroom_of, run_load

        engine = load_engine("http", **engine_kw)
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
    **labels,
) -> tuple[list[dict], list[dict]]:
    """:func:`lablib.measure.load.run_load`'s run from ``processes`` client processes on one start (see the module).

    ``engine_kw``: :func:`lablib.engines.load_engine`'s keywords for the ``http`` engine each process makes
    (``model``, ``base_url``, ``server``, ``api``, timeouts...; picklable). ``manifest``: the run's manifest
    (every row's; the caller's engine's, with ``client_processes`` in its workload when None is not given). The
    other arguments are run_load's. Returns (rows in arrival order, one dict per process: ``process``, ``pid``,
    ``streams`` (its clients, or its share of the cap), ``requests``, ``rows``, ``error``, and its
    ``client_headroom``). Raises LabError for bad arguments, a process that fails to get ready, or one that
    fails during the run (after every row that arrived was passed to ``on_row``)."""
    import multiprocessing

    from lablib.engines.base import GenerationConfig
    from lablib.measure.load import LOAD_SHAPES, _check_max_duration, _check_schedule, arrival_schedule
    from lablib.results.trace import now

    processes = whole(processes, "processes", "a whole number of client processes, at least 1")
    if mode not in LOAD_SHAPES:
        raise LabError(f"mode={mode!r}: expected 'closed' or 'open'")
    if not prompts:
        raise LabError("no prompts: expected one list of token ids per request")
    if concurrency is not None:
        concurrency = whole(concurrency, "concurrency", "a whole number of requests in flight, at least 1")
    if mode == "closed" and concurrency is None:
        raise LabError("a closed loop needs concurrency=C (clients)")
    _check_max_duration(max_duration_s)
    if mode == "open":
        if schedule is None:
            if rate is None:
                raise LabError("an open loop needs rate=R (requests per second) or schedule=[...]")
            schedule = arrival_schedule(len(prompts), rate, arrival, burstiness, seed)
        else:
            schedule = _check_schedule(schedule, len(prompts))
    processes = min(processes, concurrency or processes, len(prompts))
    cfg = cfg or GenerationConfig()
    plans = _plan(len(prompts), mode, concurrency, processes)
    ctx = multiprocessing.get_context("spawn")
    to_parent = ctx.Queue()
    workers = []
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
        proc = ctx.Process(target=_worker, args=(p, engine_kw, job, to_worker, to_parent), daemon=True)
        proc.start()
        workers.append({"proc": proc, "to": to_worker, "plan": plan, "rows": 0, "done": None})
    rows: list[dict] = []
    try:
        _wait_ready(workers, to_parent)
        start_at = now() + START_MARGIN_S
        for w in workers:
            w["to"].put(start_at)
        _collect(workers, to_parent, rows, on_row)
    except KeyboardInterrupt:
        for w in workers:
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


def _wait_ready(workers, to_parent) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready = set()
    while len(ready) < len(workers):
        try:
            kind, index, payload = to_parent.get(timeout=0.2)
        except queue.Empty:
            dead = [i for i, w in enumerate(workers) if not w["proc"].is_alive() and i not in ready]
            if dead or time.monotonic() > deadline:
                why = "exited" if dead else f"was not ready within {READY_TIMEOUT_S:.0f} s"
                raise LabError(f"client process {(dead or [min(set(range(len(workers))) - ready)])[0]} {why}") from None
            continue
        if kind == "ready":
            ready.add(index)
        elif kind == "done":  # it failed before it was ready (no server, a bad argument)
            workers[index]["done"] = payload
            raise LabError(f"client process {index} could not start: {payload['error']}")


def _collect(workers, to_parent, rows, on_row, deadline: float | None = None) -> None:
    """Rows to ``on_row`` as they come, until every process said it is done (or ``deadline``, time.monotonic)."""
    while any(w["done"] is None for w in workers):
        try:
            kind, index, payload = to_parent.get(timeout=0.1)
        except queue.Empty:
            if deadline is not None and time.monotonic() > deadline:
                return
            for i, w in enumerate(workers):
                if w["done"] is None and not w["proc"].is_alive():
                    w["done"] = {"error": f"exited with code {w['proc'].exitcode} before it was done", "pid": w["proc"].pid}
            continue
        if kind == "row":
            workers[index]["rows"] += 1
            rows.append(payload)
            if on_row is not None:
                on_row(payload)
        elif kind == "done":
            workers[index]["done"] = payload


def merged_headroom(per_process: list[dict]) -> dict | None:
    """The run's ``client_headroom``: the process whose loop lagged most at the p99 (near its limit if any was),
    with ``processes``: how many shared the run."""
    heads = [p["client_headroom"] for p in per_process if p.get("client_headroom")]
    if not heads:
        return None
    worst = max(heads, key=lambda h: h.get("loop_lag_p99_s") or 0.0)
    near = [h.get("near_limit") for h in heads if h.get("near_limit") is not None]
    return dict(worst, near_limit=any(near) if near else None, processes=len(per_process))
