"""Head-of-line blocking (lab 09): a few short streams decoding, then one long prompt arrives; the short
streams' inter-token latency over time shows whether the long prompt's prefill stalled them (one step that
holds the whole prompt) or was cut into chunks between their decode steps.

Seconds unless a name says otherwise; times on the lab's clock, a run's times relative to its first ``t_submit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.results.trace import now

if TYPE_CHECKING:
    import pandas as pd


ROLES = ("short", "long")  # a request's part in the head-of-line experiment (its rows' ``role``)


# --- head-of-line blocking ------------------------------------------------------------------------------
@dataclass
class HolRun:
    """One head-of-line run (:func:`hol_blocking`): ``rows`` (one dict per request, ``role`` "short" or
    "long", ``batch_tokens`` the server's token budget per step), ``tokens`` (:func:`token_table` of them)
    and ``summary`` (:func:`hol_summary`, with the server's own step count where it says)."""

    rows: list[dict]
    tokens: pd.DataFrame
    summary: dict = field(default_factory=dict)


def batch_tokens(server) -> int | None:
    """The most tokens one step of ``server`` (a RunningServer) computes, as it was started: llama-server's
    ``-b`` (its settings' ``batch``), vLLM's ``--max-num-batched-tokens`` when the lab set it; None when
    unknown (vLLM's own default)."""
    s = getattr(server, "settings", None) or {}
    for key in ("batch", "max_num_batched_tokens"):
        if s.get(key) is not None:
            return int(s[key])
    return None


def prefill_steps(prompt_tokens: int, budget: int | None, decoding: int = 0) -> int | None:
    """The steps a prompt of ``prompt_tokens`` takes to prefill when each step computes at most ``budget``
    tokens and ``decoding`` running streams put their next token in every step first (llama-server's
    ``update_slots``: the generating slots' tokens, then waiting prompts' tokens up to ``-b``): 1 when it
    fits beside them, else ceil(prompt_tokens / (budget - decoding)). None when ``budget`` is unknown.
    LabError when the budget leaves no room for a prompt token."""
    if budget is None:
        return None
    room = budget - decoding
    if room < 1:
        raise LabError(f"a step of {budget} tokens with {decoding} streams decoding leaves no room for a prompt token")
    return max(1, math.ceil(prompt_tokens / room))


# server-side step counters, the first found is read: {metric: does it count a step that returned no token?}.
# llama-server's n_decode_total counts every llama_decode() call, a prompt chunk's too. vLLM's histogram of the
# tokens per step takes one sample per step that returned output (vllm/v1/engine/async_llm.py, output_handler:
# ``IterationStats() if (log_stats and num_outputs) else None``): a chunk of a prompt that ends no prompt, in a
# step where no other request decodes, returns nothing and is not counted
STEP_COUNTERS = {"llamacpp:n_decode_total": True, "vllm:iteration_tokens_total_count": False}


def step_counter(root_url: str) -> tuple[str | None, int | None]:
    """The server's own count of the steps it has run so far (``/metrics``), with the counter's name
    (a key of :data:`STEP_COUNTERS`: llama-server's ``n_decode_total``, vLLM's ``iteration_tokens_total``
    count); (None, None) without /metrics or such a counter."""
    from lablib.engines.http.metrics import scrape

    try:
        samples = scrape(root_url)
    except LabError:
        return None, None
    by = {}
    for s in samples:
        by[s["name"]] = by.get(s["name"], 0.0) + s["value"]
    for name in STEP_COUNTERS:
        if name in by:
            return name, int(by[name])
    return None, None


def server_steps(root_url: str) -> int | None:
    """The server's own step count so far (:func:`step_counter`); None without one."""
    return step_counter(root_url)[1]


def steps_counted(counter: str | None, prompt_tokens: int, budget: int | None, output_tokens: int) -> int | None:
    """The steps ``counter`` (a key of :data:`STEP_COUNTERS`) counts for one request alone on the server: its
    prefill steps (:func:`prefill_steps` of ``prompt_tokens`` at ``budget``), the last of which gives the first
    token, then one per later token; for a counter of steps that returned a token (vLLM's), one per token
    whatever the budget. None when the counter or (for llama-server's) the budget is unknown."""
    if counter is None:
        return None
    if not STEP_COUNTERS[counter]:
        return output_tokens
    steps = prefill_steps(prompt_tokens, budget)
    return None if steps is None else steps + output_tokens - 1


def hol_blocking(
    server,
    model,
    short_streams: int = 2,
    short_new_tokens: int | None = None,
    long_prompt_tokens: int = 1024,
    long_delay_s: float | None = None,
    short_prompt_tokens: int = 16,
    long_new_tokens: int = 4,
    max_duration_s: float = 300.0,
) -> HolRun:
    """Head-of-line blocking on ``server`` (a RunningServer with at least ``short_streams`` + 1 slots):
    ``short_streams`` requests of ``short_prompt_tokens`` sent at 0 decode ``short_new_tokens`` each; at
    ``long_delay_s`` one request of ``long_prompt_tokens`` arrives (``long_new_tokens``). An open loop on
    an explicit schedule (:func:`lablib.measure.load.run_load`); no prompt shares a prefix with another
    (and llama-server's prompt cache is off per request).

    First a warm-up: a long prompt of the same length alone (8 tokens; a prompt no measured request
    uses), which also measures this machine: its TTFT (the prefill alone, ``solo_ttft_s``), its TPOT
    (``solo_tpot_s``) and the server's own step count for it (``solo_server_steps``, beside
    ``solo_steps_predicted``: :func:`steps_counted`, its prefill steps plus one per later token where the
    counter counts every step, one per token where it counts only steps that returned one, as vLLM's does). From
    them, when not given: ``long_delay_s`` = twice a short prompt's TTFT (one more warm-up request) plus 20
    TPOTs (the short streams have decoded for a while when the long prompt arrives) and ``short_new_tokens`` enough to outlast its prefill (3x the tokens they would
    make before it arrives, plus one per predicted prefill step, plus 20; at most the slot's context).

    What the lab expects, from llama-server's loop (tools/server/server-context.cpp, ``update_slots``):
    each step builds one batch, first the next token of every generating slot, then prompt tokens of
    slots still prefilling, until the batch holds ``-b`` tokens; the batch is decoded (in compute passes of
    ``-ub`` tokens) and only then is each slot's next token sampled and sent. So with the default
    ``-b 2048`` the whole long prompt joins one step with the short streams' tokens: no short stream gets
    a token while it is computed (one long gap in their ITL, about the long prompt's prefill time, ending
    with the long request's first token), two short tokens per stream fall between the long request's
    arrival and its first token (the step running when it arrived, and the one holding its prompt, sent
    together with its first token), three when the server's HTTP thread was still tokenizing the prompt
    as the next step began (busy cores: the arrival is the client's clock). With a small ``-b`` (64, 128) the prompt is prefilled
    ``-b`` minus the decoding streams' tokens at a time, one chunk per step, and every step still carries
    each short stream's next token: their ITL rises a little (each step computes a chunk too) but never
    stalls, they get about :func:`prefill_steps` tokens each during the prefill, and the long request's
    TTFT grows (more, smaller steps). That is chunked prefill (vLLM's ``--max-num-batched-tokens``,
    Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024): it trades the newcomer's TTFT for
    the running streams' ITL.

    Returns a :class:`HolRun`: rows (``role`` "short"/"long", ``batch_tokens``), the per-token table
    (:func:`token_table`) and the summary (:func:`hol_summary`, plus the warm-up's ``solo_*`` numbers,
    ``long_delay_s``, ``short_new_tokens``, ``server_steps``: the server's own step counter over the
    run, None without one, and ``step_counter``: its name). LabError for bad arguments or too few slots."""
    from lablib.checks import whole
    from lablib.measure.load import run_load
    from lablib.measure.workload import DISTINCT_GAP, distinct_prompts, prompt_of_length

    short_streams = whole(short_streams, "short_streams", "a whole number of short streams, at least 1")
    if short_new_tokens is not None:
        short_new_tokens = whole(short_new_tokens, "short_new_tokens", "a whole number of tokens, at least 2", lo=2)
    long_prompt_tokens = whole(long_prompt_tokens, "long_prompt_tokens", "a whole number of tokens, at least 1")
    short_prompt_tokens = whole(short_prompt_tokens, "short_prompt_tokens", "a whole number of tokens, at least 1")
    long_new_tokens = whole(long_new_tokens, "long_new_tokens", "a whole number of tokens, at least 1")
    if long_delay_s is not None and (
        isinstance(long_delay_s, bool) or not isinstance(long_delay_s, (int, float)) or not 0 <= long_delay_s < 600
    ):
        raise LabError(f"long_delay_s={long_delay_s!r}: expected seconds from 0 to 600 after the short streams start")
    slots = (getattr(server, "settings", None) or {}).get("parallel")
    if slots is not None and slots < short_streams + 1:
        raise LabError(
            f"{server.name} has {slots} slots: expected at least short_streams + 1 = {short_streams + 1} "
            "(start it with parallel=...), or the long request would wait for a slot instead of joining the batch"
        )
    budget = batch_tokens(server)
    shorts = distinct_prompts(model, short_prompt_tokens, short_streams)
    start = short_streams * (short_prompt_tokens + DISTINCT_GAP)
    long = prompt_of_length(model, long_prompt_tokens, offset=start)
    warm = prompt_of_length(model, long_prompt_tokens, offset=start + long_prompt_tokens + DISTINCT_GAP)
    warm_short = prompt_of_length(model, short_prompt_tokens, offset=start + 2 * (long_prompt_tokens + DISTINCT_GAP))
    warm_new = 8
    e = server.engine(model)
    try:
        e.check_context(long_prompt_tokens, max(warm_new, long_new_tokens))
        counter, before = step_counter(e.root_url)
        solo = e.generate(warm, GenerationConfig(max_new_tokens=warm_new))  # the warm-up: the long prompt alone
        after = server_steps(e.root_url)
        solo_prompt = solo.usage_prompt_tokens or solo.prompt_tokens
        tpot = max(solo.tpot_s or 0.0, 1e-3)
        if long_delay_s is None:  # the short streams' prefill, then 20 of their tokens
            first = e.generate(warm_short, GenerationConfig(max_new_tokens=2)).ttft_s
            long_delay_s = round(max(0.25, 2 * first + 20 * tpot), 3)
        steps = prefill_steps(long_prompt_tokens, budget, short_streams) or math.ceil(long_prompt_tokens / 32)
        if short_new_tokens is None:
            room = (server.n_ctx or 4096) - short_prompt_tokens
            short_new_tokens = max(2, min(room, math.ceil(3 * long_delay_s / tpot) + steps + 20))
        prompts = shorts + [long]
        schedule = [0.0] * short_streams + [float(long_delay_s)]
        budgets = [short_new_tokens] * short_streams + [long_new_tokens]
        run_before = server_steps(e.root_url)
        rows = run_load(
            e,
            prompts,
            "open",
            schedule=schedule,
            max_new_tokens=budgets,
            max_duration_s=max_duration_s,
            sweep="hol_blocking",
        )
        run_after = server_steps(e.root_url)
    finally:
        e.close()
    for r in rows:
        r["role"] = ROLES[1] if r["request_index"] == short_streams else ROLES[0]
        r["batch_tokens"] = budget
    rows.sort(key=lambda r: r["request_index"])
    summary = hol_summary(rows)
    summary.update(
        long_delay_s=float(long_delay_s),
        short_new_tokens=short_new_tokens,
        server_steps=None if run_before is None or run_after is None else run_after - run_before,
        solo_ttft_s=solo.ttft_s,
        solo_tpot_s=solo.tpot_s,
        solo_server_steps=None if before is None or after is None else after - before,
        solo_steps_predicted=steps_counted(counter, solo_prompt, budget, solo.output_tokens),
        step_counter=counter,
    )
    return HolRun(rows, token_table(rows), summary)


def engine_batch_tokens(engine) -> int | None:
    """The most tokens one step of an in-process ``engine``'s batch session computes: llama.cpp's
    ``n_batch`` (its :class:`~lablib.engines.llamacpp.LlamaCppBatchSession` puts the decoding sequences'
    tokens first, then prompt tokens up to ``n_batch``); None for an engine that does not say."""
    n = getattr(engine, "n_batch", None)
    return int(n) if n is not None else None


def hol_in_process(
    engine,
    short_streams: int = 2,
    long_prompt_tokens: int = 256,
    short_tokens_before: int = 8,
    short_prompt_tokens: int = 16,
    new_tokens: int | None = None,
) -> HolRun:
    """Head-of-line blocking inside this process, on ``engine``'s own continuous batching
    (``engine.batch_session``; llama.cpp: load it with ``n_seq_max >= short_streams + 1`` and the ``n_batch``
    to study). ``short_streams`` requests of ``short_prompt_tokens`` are submitted at once; once each has
    ``short_tokens_before`` tokens, one request of ``long_prompt_tokens`` is submitted, and the session steps
    until every request is done; each request makes ``new_tokens`` (one session has one generation config;
    greedy, end of text ignored), by default enough for the short streams to outlast the long prefill.
    No prompt shares a prefix with another.

    In process the lab drives the engine's steps, so the long prompt arrives between two steps and every
    count is the engine's own, without an HTTP thread in between (:func:`hol_blocking` on a server has one):
    ``steps_to_first_token`` counts the session's steps from the long request's submission to its first
    token, beside ``prefill_steps_predicted`` (:func:`prefill_steps` of its prompt with the short streams
    decoding); with llama.cpp both are equal, and each short stream gets exactly that many tokens while the
    long prompt is prefilled (the last in the step that also gives the long request its first token, stamped
    just before it).

    Returns a :class:`HolRun` whose rows are :func:`lablib.results.store.trace_row` rows (``sweep``
    "hol_in_process", ``mode`` "batched", ``role``, ``batch_tokens``) with the per-token table and the summary
    (:func:`hol_summary` plus ``steps_to_first_token``, ``engine_steps`` over the run, ``short_tokens_before``,
    ``new_tokens``).
    LabError for bad arguments, for an engine without a batched mode or with too few sequences."""
    from lablib.checks import whole
    from lablib.measure.workload import DISTINCT_GAP, distinct_prompts, prompt_of_length
    from lablib.results.store import engine_manifest, trace_row
    from lablib.results.trace import RequestTrace

    short_streams = whole(short_streams, "short_streams", "a whole number of short streams, at least 1")
    long_prompt_tokens = whole(long_prompt_tokens, "long_prompt_tokens", "a whole number of tokens, at least 1")
    before = whole(short_tokens_before, "short_tokens_before", "a whole number of tokens, at least 1")
    short_prompt_tokens = whole(short_prompt_tokens, "short_prompt_tokens", "a whole number of tokens, at least 1")
    budget = engine_batch_tokens(engine)
    during = prefill_steps(long_prompt_tokens, budget, short_streams) or math.ceil(long_prompt_tokens / 32)
    expected = f"a whole number of tokens, more than short_tokens_before={before} (the short streams must still decode)"
    new_tokens = whole(before + during + 4 if new_tokens is None else new_tokens, "new_tokens", expected)
    if new_tokens <= before:
        raise LabError(f"new_tokens={new_tokens}: expected {expected}")
    model = engine.model
    shorts = distinct_prompts(model, short_prompt_tokens, short_streams)
    long = prompt_of_length(model, long_prompt_tokens, offset=short_streams * (short_prompt_tokens + DISTINCT_GAP))
    cfg = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    session = engine.batch_session(
        cfg,
        max_sequences=short_streams + 1,
        max_seq_tokens=max(long_prompt_tokens, short_prompt_tokens) + cfg.max_new_tokens,
    )
    threads = engine.adapt_threads()
    traces = []
    try:
        for ids in shorts:
            traces.append(RequestTrace(prompt_tokens=len(ids), t_submit=now(), threads=threads))
            session.submit(ids, traces[-1])
        while min(t.output_tokens for t in traces) < before:
            session.step()
        long_trace = RequestTrace(prompt_tokens=len(long), t_submit=now(), threads=threads)
        traces.append(long_trace)
        session.submit(long, long_trace)
        steps_at_submit = session.stats["steps"]
        to_first = None
        while session.pending:
            session.step()
            if to_first is None and long_trace.output_tokens:
                to_first = session.stats["steps"] - steps_at_submit
        steps = session.stats["steps"]
    finally:
        session.close()
    manifest = engine_manifest(engine, {"short_streams": short_streams, "long_prompt_tokens": long_prompt_tokens})
    rows = []
    for i, t in enumerate(traces):
        t.request_index = i
        rows.append(
            trace_row(
                t,
                manifest,
                sweep="hol_in_process",
                mode="batched",
                concurrency=short_streams + 1,
                role=ROLES[1] if i == short_streams else ROLES[0],
                batch_tokens=budget,
            )
        )
    summary = hol_summary(rows)
    summary.update(steps_to_first_token=to_first, engine_steps=steps, short_tokens_before=before, new_tokens=new_tokens)
    return HolRun(rows, token_table(rows), summary)


def _frame(rows) -> pd.DataFrame:
    import pandas as pd

    return rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))


def _arrivals(row) -> list[float]:
    """The lab-clock times each token of ``row`` arrived: its first token, then each inter-token gap on."""
    t = [float(row["t_first_token"])]
    for gap in row["itl_s"] if row.get("itl_s") is not None else []:
        t.append(t[-1] + float(gap))
    return t


def _ok_records(rows, what: str) -> list[dict]:
    from lablib.results.tables import need, ok_rows

    df = _frame(rows)
    need(
        df,
        ("role", "request_index", "t_submit", "t_first_token", "itl_s"),
        what,
        "lablib.studies.scheduler.hol_blocking",
    )
    df = ok_rows(df)
    df = df[df["t_first_token"].notna()]
    if df.empty:
        raise LabError(f"{what}: no request of the run got a token; expected the rows of one hol_blocking run")
    return df.to_dict("records")


def token_table(rows) -> pd.DataFrame:
    """Every token of one head-of-line run, one row each: ``request_index``, ``role``, ``token_index`` (0 is
    the first), ``t_s`` (when it arrived, seconds since the run's first ``t_submit``), ``itl_s`` (the gap
    since the request's previous token; NaN for its first token) and ``batch_tokens`` where the rows have
    it. Failed requests are left out. Needs: role, request_index, t_submit, t_first_token, itl_s."""
    import pandas as pd

    recs = _ok_records(rows, "token_table")
    t0 = min(float(r["t_submit"]) for r in recs)
    out = []
    for r in recs:
        times = _arrivals(r)
        for i, t in enumerate(times):
            out.append(
                {
                    "request_index": int(r["request_index"]),
                    "role": r["role"],
                    "token_index": i,
                    "t_s": t - t0,
                    "itl_s": t - times[i - 1] if i else float("nan"),
                    "batch_tokens": r.get("batch_tokens"),
                }
            )
    return pd.DataFrame(out).sort_values(["t_s", "request_index"], kind="stable").reset_index(drop=True)


def hol_summary(rows) -> dict:
    """One head-of-line run in numbers, from its rows (:func:`hol_blocking`; seconds since the run's first
    ``t_submit``): ``batch_tokens``; the long request's ``long_prompt_tokens`` (as the server counted them
    where it said), ``long_arrival_s`` (its t_submit), ``long_first_token_s`` and ``long_ttft_s``; the
    short streams' ``short_itl_before_p50_s`` (median gap that ended before the long request arrived),
    ``short_itl_during_max_s`` (the longest gap overlapping the interval from the long request's arrival to
    its first token) and ``itl_ratio`` (the one over the other); ``short_tokens_during_min`` /
    ``short_tokens_during_max`` (tokens a short stream got strictly between that arrival and that first
    token, fewest and most over the short streams) beside ``prefill_steps_predicted``
    (:func:`prefill_steps` of the long prompt with the short streams decoding); and
    ``shorts_outlast_prefill`` (every short stream was still decoding when the long request's first token
    came: else the run says nothing of blocking, make the short streams longer). LabError unless the
    rows hold one long request and at least one short one, all with tokens."""
    import statistics

    recs = _ok_records(rows, "hol_summary")
    longs = [r for r in recs if r["role"] == ROLES[1]]
    shorts = [r for r in recs if r["role"] == ROLES[0]]
    if len(longs) != 1 or not shorts:
        raise LabError(
            f"hol_summary: {len(longs)} long and {len(shorts)} short requests with tokens; expected one long "
            "request and at least one short stream (a hol_blocking run whose requests all succeeded)"
        )
    long = longs[0]
    t0 = min(float(r["t_submit"]) for r in recs)
    arrive, first = float(long["t_submit"]), float(long["t_first_token"])
    before, during, counts, outlast = [], [], [], []
    for r in shorts:
        times = _arrivals(r)
        counts.append(sum(1 for t in times if arrive < t < first))
        outlast.append(times[-1] > first)
        for prev, cur in zip(times, times[1:]):
            if cur <= arrive:
                before.append(cur - prev)
            elif prev < first:
                during.append(cur - prev)
    p50 = statistics.median(before) if before else None
    worst = max(during) if during else None
    budget = long.get("batch_tokens")
    budget = None if budget is None or budget != budget else int(budget)
    prompt = long.get("usage_prompt_tokens")
    prompt = int(prompt) if prompt is not None and prompt == prompt else int(long["prompt_tokens"])
    return {
        "batch_tokens": budget,
        "long_prompt_tokens": prompt,
        "long_arrival_s": arrive - t0,
        "long_first_token_s": first - t0,
        "long_ttft_s": first - arrive,
        "short_itl_before_p50_s": p50,
        "short_itl_during_max_s": worst,
        "itl_ratio": worst / p50 if worst is not None and p50 else None,
        "short_tokens_during_min": min(counts),
        "short_tokens_during_max": max(counts),
        "prefill_steps_predicted": prefill_steps(prompt, budget, len(shorts)),
        "shorts_outlast_prefill": all(outlast),
    }


def hol_table(runs) -> pd.DataFrame:
    """The summaries of several :class:`HolRun` (or summary dicts), one row each, in the order given."""
    import pandas as pd

    return pd.DataFrame([r.summary if isinstance(r, HolRun) else dict(r) for r in runs])
