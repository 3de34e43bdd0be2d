"""Concurrency: a closed loop of C clients and R requests, in two scheduling modes.

DESIGN.md, "Concurrency". ``C`` clients each send a request, wait for it to
finish, and send their next one at once (no think time), until ``R`` requests
are done. Two scheduling modes per engine:

- ``serial``: one request at a time, first come first served (a single
  llama-server slot, a default Ollama). Runs in the calling thread through
  ``engine.generate``; the clients are simulated without threads: the first C
  requests are submitted at the same instant, and when a request finishes its
  client submits the next one (``t_submit`` = that finish time). Later
  requests wait: their ``queue_s`` grows with arrival order.
- ``batched``: the engine's own continuous batching (``engine.batch_session``):
  llama.cpp's multi-sequence ``llama_decode``, mlx-lm's ``BatchGenerator``,
  transformers' ``ContinuousBatchingManager``. Several sequences advance in one
  engine step and new requests join as others finish.

A batch session (one per engine module) follows
:class:`lablib.engines.base.BatchSession`; what a run counted is a
:class:`lablib.engines.base.BatchStats`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lablib.checks import whole
from lablib.engines.base import BatchStats, GenerationConfig
from lablib.errors import LabError
from lablib.results.trace import RequestTrace, now

# how the engine serves C clients in process (over HTTP, the load shapes: lablib.measure.load.LOAD_SHAPES)
SCHEDULING_MODES = ("serial", "batched")


@dataclass
class ClosedLoopRun:
    """What :func:`run_closed_loop` returns: the R traces in submission order, and what the
    engine counted (``stats.max_sequences_per_step``: how many sequences advanced together)."""

    traces: list[RequestTrace]
    stats: BatchStats


def run_closed_loop(
    engine,
    prompts: list[list[int]],
    concurrency: int,
    mode: str,
    cfg: GenerationConfig,
    on_trace: Callable[[RequestTrace], None] | None = None,
) -> ClosedLoopRun:
    """C clients, R = len(prompts) requests, in closed loop; returns the R traces in submission order
    and the engine's counts (a :class:`ClosedLoopRun`).

    ``prompts[i]``: token ids of request i (requests are submitted in index
    order). Each trace has ``t_submit`` (entered the lab's queue), ``t_start``
    (the engine began work on it), one ``t_tokens[i]`` per token id (seconds,
    the lab's clock), and the fields ``request_index`` and ``client``
    (0..C-1). ``on_trace(trace)`` is called as each request finishes, in finish
    order (after its client submitted its next request).

    Raises LabError for concurrency < 1, an empty prompt list or prompt, an
    unknown mode, or an engine without batched mode; ContextOverflowError
    before any work when a request (or, for llama.cpp batched, C requests
    together) cannot fit the context.
    """
    if mode not in SCHEDULING_MODES:
        raise LabError(f"unknown scheduling mode {mode!r}: expected one of {', '.join(SCHEDULING_MODES)}")
    concurrency = whole(concurrency, "concurrency", "a whole number of clients, at least 1")
    if not prompts:
        raise LabError("no prompts: a closed loop needs at least one request")
    prompts = [[int(t) for t in p] for p in prompts]
    for i, p in enumerate(prompts):
        if not p:
            raise LabError(f"prompt {i} is empty: expected at least one token id")
        engine.check_context(len(p), cfg.max_new_tokens)
    run = _run_serial if mode == "serial" else _run_batched
    return run(engine, prompts, min(concurrency, len(prompts)), cfg, on_trace or (lambda trace: None))


def _labelled(trace: RequestTrace, index: int, client: int) -> RequestTrace:
    trace.request_index, trace.client = index, client
    return trace


def _run_serial(engine, prompts, clients, cfg, on_trace):
    """First come first served, one request at a time, through engine.generate."""
    R = len(prompts)
    traces: list[RequestTrace | None] = [None] * R
    t0 = now()
    queue = deque((i, i, t0) for i in range(clients))  # (index, client, t_submit), submission order
    submitted = clients
    while queue:
        i, client, t_submit = queue.popleft()
        trace = traces[i] = _labelled(engine.generate(prompts[i], cfg, t_submit=t_submit), i, client)
        if submitted < R:  # the client sends its next request the moment this one finished
            queue.append((submitted, client, trace.t_tokens[-1]))
            submitted += 1
        on_trace(trace)
    stats = BatchStats(
        mode="serial",
        concurrency=clients,
        requests=R,
        engine=engine.name,
        impl="engine.generate, one request at a time",
        steps=None,
        max_sequences_per_step=1,
        prompt_tokens=sum(t.prompt_tokens for t in traces),
        generated_tokens=sum(t.output_tokens for t in traces),
    )
    return ClosedLoopRun(traces, stats)


def _run_batched(engine, prompts, clients, cfg, on_trace):
    """The engine's continuous batching: up to ``clients`` sequences in flight."""
    R = len(prompts)
    longest = max(len(p) for p in prompts) + cfg.max_new_tokens
    threads = engine.adapt_threads()
    session = engine.batch_session(cfg, max_sequences=clients, max_seq_tokens=longest)
    traces: list[RequestTrace | None] = [None] * R

    def submit(i: int, client: int, t_submit: float) -> None:
        traces[i] = _labelled(
            RequestTrace(prompt_tokens=len(prompts[i]), t_submit=t_submit, threads=threads), i, client
        )
        session.submit(prompts[i], traces[i])

    try:
        t0 = now()
        for i in range(clients):
            submit(i, i, t0)
        submitted = clients
        while session.pending:
            for trace in session.step():
                if submitted < R:  # the client sends its next request the moment this one finished
                    submit(submitted, trace.client, trace.t_tokens[-1])
                    submitted += 1
                on_trace(trace)
    finally:
        session.close()
    stats = BatchStats.from_counts(session.stats, mode="batched", concurrency=clients, requests=R)
    return ClosedLoopRun(traces, stats)
