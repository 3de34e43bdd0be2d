"""One load run from several client processes on one clock: for servers that produce tokens faster than one
client process can stamp them.

One process's event loop stamps every token of every stream it drives (:mod:`lablib.engines.http`); past a few
hundred streams of a fast server it is busy all the time and its stamps come late (``benchmarks/client_capacity.py``
measures where: :data:`STREAMS_PER_PROCESS`). :func:`lablib.measure.load.run_load_processes` spreads one run's streams over ``processes``
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

Each process runs a :class:`lablib.measure.headroom.LoopLagProbe` on its own loop; ``run_load_processes``
returns the rows and each process's headroom (``client_processes``), and the worst of them is the run's.
Processes are spawned (a fresh interpreter: the caller's threads and event loops are not copied), ready
before the start is set: each has loaded its engine and sent one unrecorded request of 2 tokens (its imports
on the request path and its first connection are not in any request's time). Ctrl-C (or SIGTERM
turned into one) reaches each worker as SIGINT: each records its requests in flight, as one process does,
and the caller gets every row before the interrupt goes on.

This module holds the shares and the parent's side (ready, start, rows back); the run and the worker process
are :mod:`lablib.measure.load`'s (``run_load_processes``, ``_process_worker``), beside ``run_load`` which each
process runs.
"""

from __future__ import annotations

import math
import queue
import time

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


# a client process's exit code when it was re-running the caller's script from the top (see refuse_in_bootstrap)
RERAN_SCRIPT_EXIT = 86
RERAN_SCRIPT = (
    "the client processes are started with 'spawn', which runs the calling script again from its top in each of "
    "them, and this script starts a load run there again; put the script's own calls under "
    '`if __name__ == "__main__":` (Python\'s rule for scripts that start processes; a notebook and the lablib '
    "command need nothing)"
)


def refuse_in_bootstrap() -> None:
    """In a client process that is still importing the caller's script (``multiprocessing`` marks that time
    ``_inheriting``): the script starts a load run at its top level, unguarded, and would start processes of its
    own. Says so in one line on standard error and exits with :data:`RERAN_SCRIPT_EXIT`, which the parent turns
    into one LabError (Python's own message is a RuntimeError's traceback from every process). Called first by
    ``run_load_processes``, and by ``bench`` and ``run_replay`` with more than one client process before they
    prepare anything: else each client process started the script's server or sent its warm-up requests first."""
    import multiprocessing.process
    import sys

    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        print(f"lablib: {RERAN_SCRIPT}", file=sys.stderr)
        raise SystemExit(RERAN_SCRIPT_EXIT)


def _wait_ready(workers, to_parent) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready = set()
    while len(ready) < len(workers):
        try:
            kind, index, payload = to_parent.get(timeout=0.2)
        except queue.Empty:
            dead = [i for i, w in enumerate(workers) if not w["proc"].is_alive() and i not in ready]
            if dead and workers[dead[0]]["proc"].exitcode == RERAN_SCRIPT_EXIT:
                raise LabError(f"client process {dead[0]} could not start: {RERAN_SCRIPT}") from None
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
            for w in workers:
                if w["done"] is None and not w["proc"].is_alive():
                    w["done"] = {
                        "error": f"exited with code {w['proc'].exitcode} before it was done",
                        "pid": w["proc"].pid,
                    }
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
