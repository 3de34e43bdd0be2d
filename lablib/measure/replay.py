"""Workloads beyond one length: a request trace replayed over HTTP, scaled to the lab's model and machine.

A trace (:mod:`lablib.measure.traces`: :func:`read_trace` of Mooncake's or a plain file, :func:`synthetic`,
:func:`sessions`; their names are this module's too) is a list of requests, each with an arrival time, a
prompt length, an output length and, where known, the prompt's KV blocks as ids.

:func:`scale` fits a trace to the model and machine (a :class:`Replay`): times times ``time_scale``,
lengths times ``length_scale`` (outputs times ``output_scale``, by default the same), prompts cut to the
context less the output, blocks of ``block_tokens`` = 512 x ``length_scale`` (rounded) unless given. The
factors are in every row (:data:`ROW_COLUMNS`) and in the run manifest's workload (``replay``).

:func:`build_prompts` makes the token ids from the lab's real text (:func:`lablib.measure.workload.corpus_ids`):
each block id is one cut of ``block_tokens`` tokens, the same wherever the id appears, and the blocks that
follow one block (or start a prompt) each begin with a different token; so two prompts whose block lists
share exactly ``k`` leading ids share exactly ``k x block_tokens`` tokens of prefix (fewer only where one
prompt ends sooner) and differ at the next token. A prompt longer than its blocks ends in a cut of its own.
:func:`perfect_reuse` says what a prefix cache with room for everything could reuse of that structure.

:func:`replay` sends it with :func:`lablib.measure.load.run_load` in an open loop on the trace's own send
times (``schedule``) and output lengths (``max_new_tokens``; EOS ignored, so each output is exactly its
length); each row has its ``t_scheduled`` and ``schedule_lag_s`` (how late the lab sent it) and the
request's trace columns; :func:`replay_processes` sends it from several client processes on one start (request
``i`` from process ``i % N``, on the one schedule: ``lablib replay --client-processes``). :func:`replay_summary`: the run's summary with the lag's p50/p99 and ``kept_up``,
False when the lag's p99 exceeds ``max_lag_s`` (default :data:`MAX_LAG_S`, 50 ms): then the lab itself did
not send on the trace's times and the arrival pattern measured is not the trace's (a warning is logged).
A server that falls behind is another thing, seen in ``queue``/TTFT and in ``drain_s`` (the last token
after the last send). :func:`run_replay` is ``lablib replay``: a trace, a server (a URL, or one the lab
starts), a results file, a summary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from lablib.checks import whole
from lablib.errors import LabError
from lablib.measure.traces import (  # a trace's names, reached here as before (__all__)
    DEFAULT_TRACE,
    LENGTH_KINDS,
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_FIELDS,
    PLAIN_FIELDS,
    TRACE_FORMATS,
    LengthDist,
    Trace,
    TraceRequest,
    default_trace_path,
    fit_lognormal,
    fixed,
    lognormal,
    read_trace,
    sessions,
    synthetic,
    uniform,
)
from lablib.results.schema import REPLAY, REPLAY_SUMMARY

MAX_LAG_S = 0.05  # schedule lag p99 above this (seconds): the replay did not keep up with its trace
BLOCK_GAP = 17  # tokens of the corpus skipped between two blocks' cuts (as workload.DISTINCT_GAP)
# the columns a replay adds to run_load's rows, and what replay_summary adds to run_summary: declared in the schema
ROW_COLUMNS = REPLAY
SUMMARY_COLUMNS = REPLAY_SUMMARY


# --- scaling --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReplayRequest:
    """One request as the replay sends it.

    ``t_s``: its send time, seconds after the replay's start; ``prompt_tokens``, ``max_new_tokens``: the
    scaled lengths (tokens); ``hash_ids``: the block ids its prompt reaches (``ceil(prompt_tokens /
    block_tokens)`` of the trace's, fewer where the trace has fewer); ``capped``: the prompt was cut to the
    context; the trace's own ``trace_index``, ``trace_prompt_tokens``, ``trace_output_tokens``, ``session``,
    ``turn``."""

    trace_index: int
    t_s: float
    prompt_tokens: int
    max_new_tokens: int
    hash_ids: tuple[int, ...]
    trace_prompt_tokens: int
    trace_output_tokens: int
    capped: bool = False
    session: int | None = None
    turn: int | None = None


@dataclasses.dataclass(frozen=True)
class Replay:
    """A trace scaled to a model and machine (:func:`scale`): its requests in send order, the tokens per
    block id (None: no block ids), the factors (``time_scale``, ``length_scale``, ``output_scale``,
    ``block_tokens``, ``block_tokens_exact`` = the trace's block x length_scale, ``trace_block_tokens``,
    ``n_ctx``, ``capped``: prompts cut to the context) and the trace."""

    requests: tuple[ReplayRequest, ...]
    block_tokens: int | None
    factors: dict
    trace: Trace

    def schedule(self) -> list[float]:
        """Send times, seconds after the start, one per request (run_load's ``schedule``)."""
        return [r.t_s for r in self.requests]

    def max_new_tokens(self) -> list[int]:
        """Output lengths, tokens, one per request (run_load's ``max_new_tokens``)."""
        return [r.max_new_tokens for r in self.requests]

    def labels(self) -> dict:
        """The columns every row of this replay carries: the trace's file name and the scale factors."""
        f = self.factors
        return {
            "trace_file": Path(self.trace.source).name,
            "time_scale": f["time_scale"],
            "length_scale": f["length_scale"],
            "output_scale": f["output_scale"],
            "block_tokens": self.block_tokens,
        }

    def workload(self) -> dict:
        """The run manifest's workload: the load shape, the lengths and ``replay`` (trace and factors)."""
        p = [r.prompt_tokens for r in self.requests]
        return {
            "mode": "open",
            "arrival": "schedule",
            "requests": len(self.requests),
            "prompt_tokens": sorted(set(p)),
            "max_new_tokens": sorted(set(self.max_new_tokens())),
            "replay": {"trace": self.trace.describe(), **self.factors},
        }


def _factor(x, what: str, zero_ok: bool = False) -> float:
    ok = not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and (x >= 0 if zero_ok else x > 0)
    if not ok:
        raise LabError(f"{what}={x!r}: expected a finite number above 0{' (or 0)' if zero_ok else ''}")
    return float(x)


def scale(
    trace: Trace,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    output_scale: float | None = None,
    block_tokens: int | None = None,
    n_ctx: int | None = None,
) -> Replay:
    """``trace`` fitted to a model and machine.

    Send time ``(arrival_s - first arrival_s) x time_scale`` seconds (0.1: ten times faster; 0: all at once);
    prompt ``ceil(prompt_tokens x length_scale)`` tokens, cut to ``n_ctx - output`` when ``n_ctx`` (the
    server's context per request, tokens) is given; output ``round(output_tokens x output_scale)``, at least 1
    (``output_scale`` None: ``length_scale``); blocks of ``block_tokens`` (None: the trace's block x
    ``length_scale``, rounded: 512 x 1/32 = 16). Raises LabError for factors that are not positive, a block
    under one token, and an output that leaves no room for a prompt."""
    time_scale = _factor(time_scale, "time_scale", zero_ok=True)
    length_scale = _factor(length_scale, "length_scale")
    output_scale = length_scale if output_scale is None else _factor(output_scale, "output_scale")
    if n_ctx is not None:
        n_ctx = whole(n_ctx, "n_ctx", "the context per request, tokens, at least 2", lo=2)
    exact = None if trace.block_tokens is None else trace.block_tokens * length_scale
    if block_tokens is None and exact is not None:
        block_tokens = round(exact)
        if block_tokens < 1:
            raise LabError(
                f"length_scale={length_scale:g} makes a {trace.block_tokens}-token block {exact:.3g} tokens: "
                "expected at least 1 token per block; give block_tokens= (tokens) or a larger length_scale"
            )
    elif block_tokens is not None:
        block_tokens = whole(block_tokens, "block_tokens", "tokens per block, at least 1")
    if not trace.requests:
        raise LabError("the trace has no requests: expected one or more")
    t0 = trace.requests[0].arrival_s
    out, capped = [], 0
    for r in trace.requests:
        m = max(1, math.floor(r.output_tokens * output_scale + 0.5))
        n = max(1, math.ceil(r.prompt_tokens * length_scale - 1e-9))
        cut = False
        if n_ctx is not None:
            room = n_ctx - m
            if room < 1:
                raise LabError(
                    f"trace request {r.index}: its output of {m} tokens (x {output_scale:g}) fills the context of "
                    f"{n_ctx} tokens, leaving no room for a prompt: expected a smaller output_scale or a larger n_ctx"
                )
            if n > room:
                n, cut = room, True
                capped += 1
        blocks = r.hash_ids[: math.ceil(n / block_tokens)] if block_tokens else ()
        out.append(
            ReplayRequest(
                r.index,
                (r.arrival_s - t0) * time_scale,
                n,
                m,
                blocks,
                r.prompt_tokens,
                r.output_tokens,
                cut,
                r.session,
                r.turn,
            )
        )
    factors = {
        "time_scale": time_scale,
        "length_scale": length_scale,
        "output_scale": output_scale,
        "block_tokens": block_tokens,
        "block_tokens_exact": exact,
        "trace_block_tokens": trace.block_tokens,
        "n_ctx": n_ctx,
        "capped": capped,
    }
    return Replay(tuple(out), block_tokens if trace.block_tokens is not None else None, factors, trace)


# --- prompts --------------------------------------------------------------------------------------
def build_prompts(model, replay: Replay, corpus: str = "prose") -> list[list[int]]:
    """The token ids of each request of ``replay`` (``prompt_tokens`` each), cut from the real text of
    ``corpus`` (:func:`lablib.measure.workload.corpus_ids`, the model's tokenizer).

    Each block id is one cut of ``block_tokens`` consecutive corpus tokens (wrapping round the corpus), the
    same in every prompt it appears in; a prompt is its blocks in order, cut at its length, and where it is
    longer than its blocks, a cut of its own for the rest. The cuts that may follow one block (the blocks
    and own cuts after it in any prompt; at a prompt's start, every first block and own cut) each start
    with a different token: a cut's start moves on through the corpus until its first token is new there.
    So prompts whose block lists share exactly ``k`` leading ids share exactly ``min(k x block_tokens,
    their lengths)`` tokens, and differ at the next one. Raises LabError when the corpus has too few
    distinct tokens for the cuts that follow one block (try corpus="code"), and when an id follows two
    different ids and its first token is already taken after one of them (a trace whose ids are not
    chained hashes)."""
    from lablib.measure.workload import corpus_ids

    ids = corpus_ids(model, corpus)
    size = len(ids)
    bt = replay.block_tokens or 0
    start: dict = {}  # node (a block id, or ("own", request position)) -> the corpus offset of its cut
    taken: dict = {}  # node after which (None: a prompt's start) -> {first token: the node it starts}
    cursor = 0

    def place(node, after, length):
        nonlocal cursor
        firsts = taken.setdefault(after, {})
        if node in start:  # placed before (after another node, or after this one)
            tok = ids[start[node]]
            if firsts.get(tok, node) != node:
                raise LabError(
                    f"block id {node} follows block {after} and another block, and its first token is taken "
                    f"after {after} by block {firsts[tok]}: expected chained block ids (each id has one "
                    "predecessor, as Mooncake's hash_ids)"
                )
            firsts[tok] = node
            return
        for step in range(size):
            off = (cursor + step) % size
            if ids[off] not in firsts:
                break
        else:
            raise LabError(
                f"{len(firsts)} different cuts follow {'a prompt start' if after is None else f'block {after}'}, "
                f"but the {corpus} corpus has only {len(set(ids))} distinct tokens to start them: expected "
                "fewer requests, or corpus='code'"
            )
        firsts[ids[off]] = node
        start[node] = off
        cursor = (off + length + BLOCK_GAP) % size

    def cut(node, length):
        off = start[node]
        return [ids[(off + t) % size] for t in range(length)]

    prompts = []
    for pos, r in enumerate(replay.requests):
        ids_out: list[int] = []
        after = None
        for h in r.hash_ids:
            place(h, after, bt)
            ids_out += cut(h, bt)
            after = h
        del ids_out[r.prompt_tokens :]
        rest = r.prompt_tokens - len(ids_out)
        if rest > 0:
            own = ("own", pos)
            place(own, after, rest)
            ids_out += cut(own, rest)
        prompts.append(ids_out)
    return prompts


def perfect_reuse(replay: Replay) -> dict:
    """What a prefix cache with room for everything could reuse of ``replay``'s block structure.

    In send order, a request's reusable tokens are ``block_tokens`` x its leading *full* blocks (ids whose
    whole block is in its prompt) that an earlier request's prompt also held whole, under the same leading
    ids: a block-granular cache (vLLM's, with blocks of ``block_tokens``) that keeps every block and sees
    each request after all earlier ones finished. An upper bound: a server still evaluates at least a
    prompt's last token, evicts, and may not have an earlier request's blocks while it is in flight.
    Returns ``block_tokens``, ``prompt_tokens`` (all requests), ``reusable_tokens`` (their sum),
    ``hit_fraction`` (reusable / prompt tokens) and ``per_request`` (reusable tokens, in send order)."""
    bt = replay.block_tokens
    trie: dict = {}
    per = []
    for r in replay.requests:
        full = r.hash_ids[: r.prompt_tokens // bt] if bt else ()
        node, k, hit = trie, 0, True
        for h in full:
            if hit and h in node:
                k += 1
            else:
                hit = False
                node.setdefault(h, {})
            node = node[h]
        per.append(k * (bt or 0))
    total = sum(r.prompt_tokens for r in replay.requests)
    return {
        "block_tokens": bt,
        "prompt_tokens": total,
        "reusable_tokens": sum(per),
        "hit_fraction": sum(per) / total if total else 0.0,
        "per_request": per,
    }


def request_columns(replay: Replay, reuse: dict | None = None) -> list[dict]:
    """Per request (send order), the columns a replay row adds (:data:`ROW_COLUMNS` less the labels, and ``turn``)."""
    reuse = reuse or perfect_reuse(replay)
    return [
        {
            "trace_index": r.trace_index,
            "trace_prompt_tokens": r.trace_prompt_tokens,
            "trace_output_tokens": r.trace_output_tokens,
            "session": r.session,
            "turn": r.turn,
            "hash_ids": list(r.hash_ids),
            "prefix_blocks": len(r.hash_ids),
            "reusable_tokens": reuse["per_request"][i],
        }
        for i, r in enumerate(replay.requests)
    ]


# --- the run ------------------------------------------------------------------------------------
def replay(
    engine,
    plan: Replay,
    prompts: list[list[int]] | None = None,
    *,
    concurrency: int | None = None,
    cfg=None,
    max_duration_s: float = 300.0,
    on_row: Callable[[dict], None] | None = None,
    server_metrics=None,
    corpus: str = "prose",
    client_probe=None,
    stop=None,
) -> list[dict]:
    """Send ``plan`` to the HTTP ``engine`` on its own times: :func:`lablib.measure.load.run_load`, open loop,
    ``schedule`` = :meth:`Replay.schedule`, ``max_new_tokens`` = each request's output length (``cfg``'s
    other settings; default: greedy, EOS ignored), at most ``concurrency`` in flight when given (later ones
    wait in the lab's queue: their ``queue_s``), within ``max_duration_s`` (requests scheduled later are not
    sent). ``prompts``: the token ids (None: :func:`build_prompts` with the engine's model and ``corpus``).

    Rows (run_load's, finish order) also carry :data:`ROW_COLUMNS`: the trace and scale factors, and per
    request its ``trace_index``, unscaled lengths, ``session``/``turn``, ``hash_ids``, ``prefix_blocks``,
    ``reusable_tokens`` (:func:`perfect_reuse`); added before ``on_row(row)`` sees the row. ``client_probe``: a
    :class:`lablib.measure.headroom.LoopLagProbe` on the loop that stamps the tokens (run_load's). ``stop``:
    run_load's (a threading.Event: once set, nothing more is sent; the requests in flight finish)."""
    from lablib.measure.load import run_load

    prompts, cfg, manifest, add = _prepared(engine, plan, prompts, corpus, concurrency, max_duration_s, cfg, on_row)
    return run_load(
        engine,
        prompts,
        "open",
        concurrency=concurrency,
        schedule=plan.schedule(),
        max_new_tokens=plan.max_new_tokens(),
        cfg=cfg,
        max_duration_s=max_duration_s,
        manifest=manifest,
        on_row=add,
        server_metrics=server_metrics,
        client_probe=client_probe,
        stop=stop,
        **plan.labels(),
    )


def replay_processes(
    engine,
    plan: Replay,
    prompts: list[list[int]] | None = None,
    *,
    processes: int = 2,
    concurrency: int | None = None,
    cfg=None,
    max_duration_s: float = 300.0,
    on_row: Callable[[dict], None] | None = None,
    server_metrics=None,
    corpus: str = "prose",
) -> tuple[list[dict], list[dict]]:
    """:func:`replay` from ``processes`` client processes on one start
    (:func:`lablib.measure.load.run_load_processes`, as ``lablib bench --client-processes``): request ``i`` of
    the plan is sent by process ``i % processes`` at its time on the trace's one schedule, each process with an
    http engine like ``engine`` (:func:`lablib.measure.load.process_engine_kw`); a ``concurrency`` cap is shared
    out (each process at most its share in flight). Rows are :func:`replay`'s, each with its ``client_process``,
    passed to ``on_row`` in this process as they arrive; the manifest's workload says ``client_processes``.
    ``server_metrics``: sampled from just before the processes start to after the last row. Returns (rows, one
    dict per process: ``process``, ``pid``, ``streams``, ``requests``, ``rows``, ``error``,
    ``client_headroom``). Raises LabError as run_load_processes does."""
    from lablib.measure.load import process_engine_kw, run_load_processes

    processes = whole(processes, "processes", "a whole number of client processes, at least 1")
    prompts, cfg, manifest, add = _prepared(
        engine, plan, prompts, corpus, concurrency, max_duration_s, cfg, on_row, processes
    )
    if server_metrics is not None:
        server_metrics.start()
    try:
        return run_load_processes(
            process_engine_kw(engine, engine.model),
            prompts,
            "open",
            processes=processes,
            concurrency=concurrency,
            schedule=plan.schedule(),
            max_new_tokens=plan.max_new_tokens(),
            cfg=cfg,
            max_duration_s=max_duration_s,
            manifest=manifest,
            on_row=add,
            **plan.labels(),
        )
    finally:
        if server_metrics is not None:
            server_metrics.stop()


def _prepared(engine, plan, prompts, corpus, concurrency, max_duration_s, cfg, on_row, processes=None):
    """A replay's prompts (checked, or built), its cfg, its manifest (with ``client_processes`` when given) and the
    ``on_row`` that adds each row's trace columns first."""
    from lablib.engines.base import GenerationConfig
    from lablib.results.store import engine_manifest

    if prompts is None:
        prompts = build_prompts(engine.model, plan, corpus)
    if len(prompts) != len(plan.requests):
        raise LabError(f"{len(prompts)} prompts for {len(plan.requests)} requests: expected one per request")
    for i, (p, r) in enumerate(zip(prompts, plan.requests)):
        if len(p) != r.prompt_tokens:
            raise LabError(f"prompt {i}: {len(p)} tokens, expected the replay's {r.prompt_tokens}")
    cfg = cfg or GenerationConfig(ignore_eos=True)
    reuse = perfect_reuse(plan)
    per = request_columns(plan, reuse)
    workload = dict(plan.workload(), concurrency=concurrency, max_duration_s=max_duration_s)
    workload["replay"] = dict(workload["replay"], perfect_reuse_fraction=reuse["hit_fraction"])
    if processes is not None:
        workload["client_processes"] = processes
    manifest = engine_manifest(engine, workload)

    def add(row):
        i = row.get("request_index")
        if i is not None:
            row.update(per[i])
        if on_row is not None:
            on_row(row)

    return prompts, cfg, manifest, add


def replay_summary(
    rows,
    plan: Replay,
    max_lag_s: float = MAX_LAG_S,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
) -> dict:
    """:func:`lablib.results.tables.run_summary` of a replay's ``rows`` and :data:`SUMMARY_COLUMNS`:
    ``scheduled`` (requests in the plan), ``not_sent`` (scheduled after the time limit: no row),
    ``schedule_lag_p50_s``/``_p99_s`` (how late the lab sent them, seconds), ``max_lag_s`` and ``kept_up``
    (lag p99 <= max_lag_s: the lab sent on the trace's times), ``schedule_span_s`` (the last row's scheduled
    send, seconds after the start), ``drain_s`` (from the last scheduled send to the last token, seconds:
    how far the server was behind at the end), ``output_count_ok`` (every successful row has exactly its
    ``max_new_tokens``), ``perfect_reuse_fraction`` (:func:`perfect_reuse`), and the factors."""
    from lablib.results.tables import percentile, run_summary

    max_lag_s = _factor(max_lag_s, "max_lag_s")
    out = run_summary(rows, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s)
    lags = [r["schedule_lag_s"] for r in rows if r.get("schedule_lag_s") is not None]
    p99 = percentile(lags, 99) if lags else None
    ok = [r for r in rows if not r.get("error") and r.get("t_last_token") is not None]
    sends = [r["t_submit"] for r in rows if r.get("t_submit") is not None]
    out.update(
        scheduled=len(plan.requests),
        not_sent=len(plan.requests) - len(rows),
        schedule_lag_p50_s=percentile(lags, 50) if lags else None,
        schedule_lag_p99_s=p99,
        max_lag_s=max_lag_s,
        kept_up=p99 is not None and p99 <= max_lag_s,
        schedule_span_s=max((r["t_scheduled"] for r in rows if r.get("t_scheduled") is not None), default=None),
        drain_s=max(r["t_last_token"] for r in ok) - max(sends) if ok and sends else None,
        output_count_ok=bool(ok) and all(r.get("output_tokens") == r.get("max_new_tokens") for r in ok),
        perfect_reuse_fraction=perfect_reuse(plan)["hit_fraction"],
        **{k: v for k, v in plan.factors.items()},
    )
    return out


def lag_warning(summary: dict) -> str | None:
    """A sentence when a replay did not keep up (its lag p99 above ``max_lag_s``), left requests unsent, or
    ran with the lab's client near its own limit (``client_headroom``'s ``near_limit``); None otherwise."""
    parts = []
    if not summary.get("kept_up"):
        p99 = summary.get("schedule_lag_p99_s")
        parts.append(
            f"the replay fell behind its trace: schedule lag p99 {'-' if p99 is None else f'{p99 * 1e3:.1f} ms'} "
            f"above {summary['max_lag_s'] * 1e3:.0f} ms, so the arrivals measured are not the trace's "
            "(a busy machine, or too many requests at once for the lab's client: slow the trace with a "
            "larger time_scale)"
        )
    if summary.get("not_sent"):
        parts.append(
            f"{summary['not_sent']} of {summary['scheduled']} requests were scheduled after the time limit "
            "and not sent (a larger max_duration_s or a smaller time_scale sends them)"
        )
    head = summary.get("client_headroom") or {}
    if head.get("near_limit"):
        p99 = head.get("loop_lag_p99_s")
        parts.append(
            f"the lab's client was near its own limit (the loop that stamps tokens lagged "
            f"{'-' if p99 is None else f'{p99 * 1e3:.1f} ms'} at p99): its TTFT and ITL include the client's delay "
            "(fewer requests at once, or a quieter machine)"
        )
    return "; ".join(parts) or None


def run_replay(
    *,
    out,
    trace=None,
    fmt: str = "auto",
    start: int = 0,
    count: int | None = None,
    time_scale: float = 1.0,
    length_scale: float = 1 / 32,
    output_scale: float | None = None,
    block_tokens: int | None = None,
    base_url: str | None = None,
    server: str | None = None,
    parallel: int | None = None,
    threads: int | None = None,
    n_ctx: int | None = None,
    model=None,
    server_model: str | None = None,
    api: str = "completions",
    concurrency: int | None = None,
    max_duration_s: float = 300.0,
    read_timeout_s: float = 60.0,
    warmup: int = 1,
    max_lag_s: float = MAX_LAG_S,
    corpus: str = "prose",
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
    client_processes: int | str = 1,
    log=print,
) -> dict:
    """``lablib replay``: a trace (``trace`` file, None: the shipped Mooncake slice; ``fmt``; requests
    ``start`` .. ``start + count - 1``) scaled (:func:`scale`: ``time_scale``, ``length_scale``,
    ``output_scale``, ``block_tokens``; prompts cut to the server's context) and replayed
    (:func:`replay`) on the OpenAI-compatible server at ``base_url``, or on a server the lab starts
    (``server``: a name of :data:`lablib.engines.servers.SERVERS`, with ``parallel`` slots (default 1) of
    ``n_ctx`` tokens (default 1024) and ``threads``; stopped at the end; with ``base_url`` these three are
    refused: a running server keeps its own). ``warmup`` unrecorded requests first (8-token prompts of
    the prose, 4 tokens out). Every row is appended to ``out`` (.jsonl/.parquet) as it finishes.

    ``client_processes``: how many client processes share the replay's requests (:func:`replay_processes`:
    request ``i`` in process ``i % N``, on the trace's one schedule, the rows merged into ``out``), as ``lablib
    bench --client-processes``; ``"auto"``: one per :data:`lablib.measure.processes.STREAMS_PER_PROCESS` of the
    ``concurrency`` cap, at most the usable cores less one (1 without a cap, as bench's open loop).

    Returns :func:`replay_summary` (against ``max_lag_s`` and the goodput targets) with ``server`` (its
    kind), ``client_headroom`` (:func:`lablib.measure.load.client_headroom_of`: the lag of the loop that
    stamped the tokens; with several processes the worst process's, :func:`lablib.measure.processes.merged_headroom`,
    and ``client_processes``: each process's streams, rows and headroom) and ``warning`` (:func:`lag_warning`,
    also logged). Raises LabError for bad arguments (before any request) and when no server answers."""
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import prompt_of_length
    from lablib.model.resolve import ResolvedModel, prepare
    from lablib.results.store import LOAD_SYNC_S, ResultsWriter, _suffix

    _suffix(out)  # a bad file name is refused before any work
    if (base_url is None) == (server is None):
        raise LabError("expected either base_url (a running server) or server (a name, for the lab to start one)")
    given = {k: v for k, v in (("parallel", parallel), ("threads", threads), ("n_ctx", n_ctx)) if v is not None}
    if base_url is not None and given:  # they would be dropped without a word: the server runs as it was started
        raise LabError(
            f"{', '.join(f'{k}={v!r}' for k, v in given.items())} with base_url={base_url!r}: these set up the server "
            "run_replay starts (server=NAME); a running server keeps its own slots, threads and context: leave "
            "them out, or give server=NAME instead of base_url"
        )
    parallel, n_ctx = 1 if parallel is None else parallel, 1024 if n_ctx is None else n_ctx
    warmup = whole(warmup, "warmup", "0 or more", lo=0)
    # the run's and the summary's parameters too, before a server starts or a request is sent
    from lablib.measure.load import _check_max_duration
    from lablib.results.tables import check_targets

    if concurrency is not None:
        whole(concurrency, "concurrency", "a whole number of requests in flight, at least 1")
    if client_processes == "auto":
        from lablib.measure.processes import auto_processes

        client_processes = auto_processes(concurrency)
    client_processes = whole(
        client_processes, "client_processes", "a whole number of client processes, at least 1 (or 'auto')"
    )
    if client_processes > 1:  # a client process re-running an unguarded script stops here, before its server starts
        from lablib.measure.processes import refuse_in_bootstrap

        refuse_in_bootstrap()
    _check_max_duration(max_duration_s)
    _factor(max_lag_s, "max_lag_s")
    check_targets(ttft_s, tpot_s, e2e_s)
    tr = read_trace(trace, fmt, start, count)
    scale(tr, time_scale, length_scale, output_scale, block_tokens)  # bad factors refused before a server starts
    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    srv = None
    if server is not None:
        from lablib.engines.servers import start_server

        srv = start_server(server, rm, parallel=parallel, threads=threads, n_ctx=n_ctx, log=log)
    try:
        engine = (
            srv.engine(rm, api=api, read_timeout_s=read_timeout_s)
            if srv is not None
            else load_engine(
                "http", rm, base_url=base_url, api=api, server_model=server_model, read_timeout_s=read_timeout_s
            )
        )
        try:
            plan = scale(tr, time_scale, length_scale, output_scale, block_tokens, n_ctx=engine.n_ctx)
            prompts = build_prompts(rm, plan, corpus)
            writer = ResultsWriter(out, sync_every_s=LOAD_SYNC_S)
            for i in range(warmup):
                engine.generate(prompt_of_length(rm, 8, offset=3 * i), GenerationConfig(max_new_tokens=4))
            from lablib.measure.headroom import LoopLagProbe
            from lablib.measure.load import client_headroom_of

            probe, per_process = LoopLagProbe(), None
            run = dict(concurrency=concurrency, max_duration_s=max_duration_s, on_row=writer.append, corpus=corpus)
            with writer:  # the rows made durable at the end, stopped or not
                if client_processes > 1:
                    rows, per_process = replay_processes(engine, plan, prompts, processes=client_processes, **run)
                else:
                    rows = replay(engine, plan, prompts, client_probe=probe, **run)
            s = {"server": engine.kind, **replay_summary(rows, plan, max_lag_s, ttft_s, tpot_s, e2e_s)}
            if per_process is None:
                s["client_headroom"] = client_headroom_of(probe, s.get("itl_p50_s"))
            else:
                from lablib.measure.processes import merged_headroom

                s["client_headroom"] = merged_headroom(per_process)
                s["client_processes"] = per_process
        finally:
            engine.close()
    finally:
        if srv is not None:
            srv.stop()
    s["warning"] = lag_warning(s)
    if s["warning"]:
        log(f"warning: {s['warning']}")
    return s


__all__ = [
    "BLOCK_GAP",
    "build_prompts",
    "DEFAULT_TRACE",
    "default_trace_path",
    "fit_lognormal",
    "fixed",
    "lag_warning",
    "LENGTH_KINDS",
    "LengthDist",
    "lognormal",
    "MAX_LAG_S",
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_FIELDS",
    "perfect_reuse",
    "PLAIN_FIELDS",
    "read_trace",
    "replay",
    "Replay",
    "replay_processes",
    "replay_summary",
    "ReplayRequest",
    "request_columns",
    "ROW_COLUMNS",
    "run_replay",
    "scale",
    "sessions",
    "SUMMARY_COLUMNS",
    "synthetic",
    "Trace",
    "TRACE_FORMATS",
    "TraceRequest",
    "uniform",
]
