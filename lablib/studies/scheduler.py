"""Lab 09's operations: what a production scheduler does under real traffic.

Three experiments on real servers the lab starts (:mod:`lablib.engines.servers`), each a function of tidy
rows and returning tables (pandas DataFrames):

- **head-of-line blocking** (:func:`hol_blocking`): a few short streams decoding, then one long prompt
  arrives; the short streams' inter-token latency over time shows whether the long prompt's prefill
  stalled them (one step that holds the whole prompt) or was cut into chunks between their decode steps
  (:func:`token_table`, :func:`hol_summary`, :func:`hol_table`);
- **the KV cache as the limit** (:func:`kv_capacity`): how many sequences of a length fit in a KV cache of
  N blocks (:func:`kv_prediction`, from the model's shape), beside what the server says at start
  (:func:`stated_capacity`, from its log) and what it does when concurrency rises (its ``/metrics``: running,
  waiting, KV cache used, preemptions);
- **the saturation knee** (:func:`find_knee`): the rate where throughput stops following the offered load
  and latency turns up, found from a rate sweep's table by a stated rule;
- **real traffic** (:func:`trace_replay`): a slice of Mooncake's trace on its own send times; the same slice
  with prefix caching on and off (:func:`prefix_reuse`: the server's own hit counters beside what a perfect
  cache could have reused, TTFT p50/p99), and multi-turn chats on and off (:func:`multi_turn`,
  :func:`turn_table`: TTFT and cached tokens by turn). One server serves both arms (:func:`_arm_engine`:
  llama-server per request, ``cache_prompt``; vLLM started with prefix caching on, through its
  ``cache_salt``), "on" first.

Seconds unless a name says otherwise; times on the lab's clock (:func:`lablib.results.trace.now`), a
run's times relative to its first ``t_submit``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import VLLM_BLOCK_TOKENS
from lablib.errors import LabError

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


# server-side step counters: llama-server's llama_decode() calls, vLLM's engine steps (its histogram of the
# tokens per step counts one sample per step); the first found is read
_STEP_COUNTERS = ("llamacpp:n_decode_total", "vllm:iteration_tokens_total_count")


def server_steps(root_url: str) -> int | None:
    """The server's own count of the steps it has run so far (``/metrics``: llama-server's
    ``n_decode_total``, vLLM's ``iteration_tokens_total`` count); None without /metrics or such a counter."""
    from lablib.engines.http.metrics import scrape

    try:
        samples = scrape(root_url)
    except LabError:
        return None
    by = {}
    for s in samples:
        by[s["name"]] = by.get(s["name"], 0.0) + s["value"]
    for name in _STEP_COUNTERS:
        if name in by:
            return int(by[name])
    return None


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
    ``solo_steps_predicted``: :func:`prefill_steps` of its prompt plus one step per later token). From
    them, when not given: ``long_delay_s`` = twice a short prompt's TTFT (one more warm-up request) plus 20
    TPOTs (the short streams have decoded for a while when the long prompt arrives) and ``short_new_tokens`` enough to outlast its prefill (3x the tokens they would
    make before it arrives, plus one per predicted prefill step, plus 20; at most the slot's context).

    What the lab expects, from llama-server's loop (tools/server/server-context.cpp, ``update_slots``):
    each step builds one batch, first the next token of every generating slot, then prompt tokens of
    slots still prefilling, until the batch holds ``-b`` tokens; the batch is decoded (in compute passes of
    ``-ub`` tokens) and only then is each slot's next token sampled and sent. So with the default
    ``-b 2048`` the whole long prompt joins one step with the short streams' tokens: no short stream gets
    a token while it is computed (one long gap in their ITL, about the long prompt's prefill time, ending
    with the long request's first token), at most two short tokens per stream fall between the long
    request's arrival and its first token (the step running when it arrived, and the one holding its
    prompt, sent together with its first token). With a small ``-b`` (64, 128) the prompt is prefilled
    ``-b`` minus the decoding streams' tokens at a time, one chunk per step, and every step still carries
    each short stream's next token: their ITL rises a little (each step computes a chunk too) but never
    stalls, they get about :func:`prefill_steps` tokens each during the prefill, and the long request's
    TTFT grows (more, smaller steps). That is chunked prefill (vLLM's ``--max-num-batched-tokens``,
    Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024): it trades the newcomer's TTFT for
    the running streams' ITL.

    Returns a :class:`HolRun`: rows (``role`` "short"/"long", ``batch_tokens``), the per-token table
    (:func:`token_table`) and the summary (:func:`hol_summary`, plus the warm-up's ``solo_*`` numbers,
    ``long_delay_s``, ``short_new_tokens`` and ``server_steps``: the server's own step counter over the
    run; None without one). LabError for bad arguments or too few slots."""
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
        before = server_steps(e.root_url)
        solo = e.generate(warm, GenerationConfig(max_new_tokens=warm_new))  # the warm-up: the long prompt alone
        after = server_steps(e.root_url)
        solo_prompt = solo.usage_prompt_tokens or solo.prompt_tokens
        solo_pred = prefill_steps(solo_prompt, budget)
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
        solo_steps_predicted=None if solo_pred is None else solo_pred + solo.output_tokens - 1,
    )
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


# --- the KV cache as the limit -----------------------------------------------------------------------------
def kv_prediction(
    model,
    kv_blocks: int,
    prompt_tokens: int,
    max_new_tokens: int,
    concurrency: int,
    max_num_seqs: int,
    bytes_per_element: float = 4,
    block_tokens: int = VLLM_BLOCK_TOKENS,
    max_model_len: int | None = None,
) -> dict:
    """What a paged KV cache of ``kv_blocks`` blocks of ``block_tokens`` tokens does with ``concurrency``
    closed-loop clients sending prompts of ``prompt_tokens`` for ``max_new_tokens`` each, predicted from
    ``model``'s shape (:func:`lablib.model.shape.kv_bytes_per_token`: 2 x layers x KV heads x head dim x
    ``bytes_per_element``) and vLLM's rules (vllm/v1/core: one block is the null block, the rest hold
    tokens; a request is admitted when blocks for its prompt are free, at most ``max_num_seqs`` run; a
    running sequence that needs a block when none is free preempts the newest running one, which waits
    and is recomputed later).

    Returns: ``kv_blocks``, ``usable_blocks`` (kv_blocks - 1), ``block_tokens``, ``kv_bytes_per_token``,
    ``kv_cache_bytes`` (all blocks), ``sequence_tokens`` (prompt + output), ``blocks_per_sequence``
    (ceil(sequence_tokens / block_tokens)), ``fit_sequences`` (whole sequences that fit at once: usable //
    blocks_per_sequence), ``predicted_running_max`` (admitted together: min(concurrency, max_num_seqs,
    usable // prompt blocks)), ``predicted_preemption`` (admitted sequences outgrow the cache), and
    ``predicted_waiting`` (a request waits at some point: more clients than admitted, or a preemption),
    ``predicted_kv_usage_max`` (0..1, of the usable blocks), and, with ``max_model_len``, what vLLM says at
    start: ``predicted_kv_tokens`` (kv_blocks x block_tokens, as its log counts them) and
    ``predicted_max_concurrency`` (kv_blocks / blocks of one max_model_len request)."""
    from lablib.checks import whole
    from lablib.model.shape import kv_bytes_per_token, model_dims

    kv_blocks = whole(kv_blocks, "kv_blocks", "a whole number of KV cache blocks, at least 2", lo=2)
    prompt_tokens = whole(prompt_tokens, "prompt_tokens", "a whole number of tokens, at least 1")
    max_new_tokens = whole(max_new_tokens, "max_new_tokens", "a whole number of tokens, at least 1")
    concurrency = whole(concurrency, "concurrency", "a whole number of clients, at least 1")
    max_num_seqs = whole(max_num_seqs, "max_num_seqs", "a whole number of sequences, at least 1")
    block_tokens = whole(block_tokens, "block_tokens", "a whole number of tokens per block, at least 1")
    per_token = kv_bytes_per_token(model_dims(model), bytes_per_element)
    usable = kv_blocks - 1
    seq = prompt_tokens + max_new_tokens
    per_seq = math.ceil(seq / block_tokens)
    admitted = min(concurrency, max_num_seqs, usable // math.ceil(prompt_tokens / block_tokens))
    preempt = admitted * per_seq > usable and admitted > 1
    out = {
        "kv_blocks": kv_blocks,
        "usable_blocks": usable,
        "block_tokens": block_tokens,
        "kv_bytes_per_token": per_token,
        "kv_cache_bytes": kv_blocks * block_tokens * per_token,
        "sequence_tokens": seq,
        "blocks_per_sequence": per_seq,
        "fit_sequences": usable // per_seq,
        "predicted_running_max": admitted,
        "predicted_preemption": preempt,
        "predicted_waiting": concurrency > admitted or preempt,
        "predicted_kv_usage_max": 1.0 if preempt else min(1.0, admitted * per_seq / usable),
    }
    if max_model_len is not None:
        max_model_len = whole(max_model_len, "max_model_len", "a whole number of tokens, at least 1")
        out["predicted_kv_tokens"] = kv_blocks * block_tokens
        out["predicted_max_concurrency"] = kv_blocks / math.ceil(max_model_len / block_tokens)
    return out


_STATED = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


def stated_capacity(log_text: str) -> dict:
    """What vLLM says of its KV cache at start, read from its log (vllm/v1/core/kv_cache_utils.py,
    ``update_kv_cache_capacity``: "CPU KV cache size: 23,296 tokens, Maximum concurrency for 512 tokens per
    request: 45.50x"): ``stated_kv_tokens``, ``stated_for_tokens`` (the request length it divides by: its
    max_model_len), ``stated_max_concurrency``; and, when it was started with ``--num-gpu-blocks-override``
    ("Overriding num_gpu_blocks=182 with num_gpu_blocks_override=5"), ``space_blocks`` (what its KV cache
    space would have given) and ``override_blocks``, else None. LabError when the log has no such line (not
    a vLLM log, or one of a start that did not get that far)."""
    found = _STATED.findall(log_text or "")
    if not found:
        raise LabError(
            "no 'KV cache size: N tokens, Maximum concurrency for M tokens per request: X.XXx' line in the log: "
            "expected the log of a vLLM server that started (RunningServer.log_path)"
        )
    tokens, per_request, conc = found[-1]
    over = _OVERRIDE.findall(log_text)
    return {
        "stated_kv_tokens": int(tokens.replace(",", "")),
        "stated_for_tokens": int(per_request.replace(",", "")),
        "stated_max_concurrency": float(conc),
        "space_blocks": int(over[-1][0]) if over else None,
        "override_blocks": int(over[-1][1]) if over else None,
    }


def server_kv_blocks(server, model) -> int:
    """The KV cache blocks of ``server`` (a RunningServer of a paged KV cache: its settings name
    ``kv_cache_space_gib``): ``num_gpu_blocks`` when the lab set it, else what its KV cache space gives
    (floor(space / (block_tokens x KV bytes per token)), as vLLM divides it). LabError for a server
    without a paged KV cache."""
    from lablib.model.shape import kv_bytes_per_token, model_dims

    s = getattr(server, "settings", None) or {}
    if s.get("num_gpu_blocks") is not None:
        return int(s["num_gpu_blocks"])
    if s.get("kv_cache_space_gib") is None:
        raise LabError(
            f"{getattr(server, 'name', server)!r} states no paged KV cache (its settings have no kv_cache_space_gib "
            "or num_gpu_blocks): kv_capacity needs a server with one, as the lab starts vLLM"
        )
    per_block = VLLM_BLOCK_TOKENS * kv_bytes_per_token(model_dims(model), _bytes_per_element(s))
    return int(s["kv_cache_space_gib"] * 2**30 // per_block)


def _bytes_per_element(settings: dict) -> int:
    return 4 if settings.get("dtype") == "float32" else 2


# the columns of a kv_capacity table that put each prediction beside its observation (lab 09 shows these)
KV_VIEW = (
    "concurrency",
    "usable_blocks",
    "blocks_per_sequence",
    "fit_sequences",
    "stated_kv_tokens",
    "predicted_kv_tokens",
    "predicted_running_max",
    "running_max",
    "predicted_waiting",
    "waiting_max",
    "predicted_preemption",
    "preemptions",
    "predicted_kv_usage_max",
    "kv_usage_max",
)


def kv_capacity(
    server,
    model,
    prompt_tokens: int = 200,
    max_new_tokens: int = 100,
    concurrencies=(1, 2),
    requests_per_client: int = 1,
    metrics_interval_s: float = 0.1,
    max_duration_s: float = 300.0,
) -> pd.DataFrame:
    """The KV cache as the limit, predicted beside observed: one row per concurrency of ``concurrencies``.

    ``server``: a RunningServer with a paged KV cache and ``/metrics`` (vLLM; to make the cache small enough
    to fill on a laptop, start it with ``options={"num_gpu_blocks": N}``: ``--num-gpu-blocks-override``, not
    part of vLLM's compile-cache key). Each concurrency C is a closed loop of C clients, each sending
    ``requests_per_client`` prompts of ``prompt_tokens`` for exactly ``max_new_tokens`` (distinct prompts:
    no prefix shared), sampled by :class:`lablib.engines.http.metrics.MetricsSampler` every
    ``metrics_interval_s``.

    Each row: ``concurrency``; the prediction (:func:`kv_prediction` with the server's blocks, dtype and
    ``max_num_seqs``: kv_blocks, usable_blocks, blocks_per_sequence, fit_sequences, predicted_running_max,
    predicted_waiting, predicted_preemption, predicted_kv_usage_max, predicted_kv_tokens,
    predicted_max_concurrency ...); what the server stated at start (:func:`stated_capacity` of its log:
    stated_kv_tokens, stated_max_concurrency, stated_for_tokens); and what it did (its /metrics:
    ``running_max``, ``waiting_max``, ``kv_usage_max`` (0..1), ``preemptions``), with ``errors`` and the
    run's ``ttft_p50_s`` and ``e2e_p50_s``. The request rows are in the result's ``attrs["rows"]``, the
    server's samples (with ``concurrency``) in ``attrs["server_rows"]``. LabError for a server without a
    paged KV cache or /metrics, or a sequence longer than its context."""
    import pandas as pd

    from lablib.checks import whole
    from lablib.engines.http.metrics import MetricsSampler, run_maxima
    from lablib.measure.load import run_load, summarize
    from lablib.measure.workload import distinct_prompts

    blocks = server_kv_blocks(server, model)
    s = server.settings or {}
    levels = [whole(c, "concurrency", "a whole number of clients, at least 1") for c in concurrencies]
    if not levels:
        raise LabError("concurrencies=(): expected one or more numbers of clients, e.g. (1, 2)")
    requests_per_client = whole(requests_per_client, "requests_per_client", "a whole number, at least 1")
    try:
        stated = stated_capacity(server.log_path.read_text(errors="replace"))
    except OSError as e:
        raise LabError(
            f"the server's log {server.log_path} cannot be read ({e}): expected a server the lab started"
        ) from None
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, 1 + requests_per_client * sum(levels))
    table, raw, server_rows = [], [], []
    e = server.engine(model)
    try:
        e.generate(prompts[0][:8], GenerationConfig(max_new_tokens=2))  # warm-up, nothing shared with the runs
        used = 1
        for c in levels:
            n = c * requests_per_client
            batch, used = prompts[used : used + n], used + n
            sampler = MetricsSampler(e.root_url, metrics_interval_s, concurrency=c)
            rows = run_load(
                e,
                batch,
                "closed",
                concurrency=c,
                cfg=cfg,
                max_duration_s=max_duration_s,
                server_metrics=sampler,
                sweep="kv_capacity",
            )
            raw += rows
            server_rows += sampler.rows()
            seen = sampler.deltas()
            summary = summarize(rows)
            predicted = kv_prediction(
                model,
                blocks,
                prompt_tokens,
                max_new_tokens,
                c,
                s.get("max_num_seqs") or s.get("parallel") or c,
                _bytes_per_element(s),
                max_model_len=s.get("max_model_len") or server.n_ctx,
            )
            table.append(
                {
                    "concurrency": c,
                    "prompt_tokens": prompt_tokens,
                    "max_new_tokens": max_new_tokens,
                    **predicted,
                    **stated,
                    **run_maxima(seen),
                    "errors": summary["errors"],
                    "ttft_p50_s": summary["ttft_p50_s"],
                    "e2e_p50_s": summary["e2e_p50_s"],
                }
            )
    finally:
        e.close()
    df = pd.DataFrame(table)
    df.attrs["rows"] = raw
    df.attrs["server_rows"] = server_rows
    return df


# --- the saturation knee -------------------------------------------------------------------------------------
KNEE_RULE = (
    "the knee is the lowest swept rate x_i (i >= 1) at which (a) throughput has stopped following the offered "
    "load: the throughput gained over the last step, (T_i - T_(i-1)) / (x_i - x_(i-1)), is below flat x the "
    "light-load slope T_0 / x_0 (below saturation an open loop's throughput is proportional to its rate), and "
    "(b) latency has turned up: L_i > rise x the light-load latency, the lowest L_j of the rates below it (j < i: "
    "the best the server did before, so one slow run at the lowest rate does not hide the rise)"
)


def kneedle(x, y) -> int | None:
    """The index of the knee of a concave, increasing curve (throughput against rate) by the Kneedle method
    (Satopaa, Albrecht, Irwin, Raghavan, "Finding a 'Kneedle' in a Haystack: Detecting Knee Points in
    System Behavior", ICDCS Workshops 2011), offline and without smoothing: x and y scaled to [0, 1], the
    point farthest above the chord from the first to the last (the largest y_n - x_n); None for fewer than
    3 points or a flat or straight curve (no point above the chord)."""
    if len(x) < 3 or len(x) != len(y):
        return None
    x0, x1, y0, y1 = min(x), max(x), min(y), max(y)
    if x1 == x0 or y1 == y0:
        return None
    diff = [(b - y0) / (y1 - y0) - (a - x0) / (x1 - x0) for a, b in zip(x, y)]
    best = max(range(len(diff)), key=lambda i: diff[i])
    return best if diff[best] > 1e-9 else None


def find_knee(
    table,
    x: str = "rate",
    throughput: str = "output_tps",
    latency: str = "ttft_p99_s",
    flat: float = 0.5,
    rise: float = 2.0,
) -> dict:
    """The saturation knee of a rate sweep's ``table`` (one row per rate: ``x``, ``throughput``, ``latency``;
    a DataFrame or dicts, e.g. :func:`lablib.studies.serving.rate_sweep_table` or ``lablib bench``'s
    summaries), by :data:`KNEE_RULE` with the fractions ``flat`` (0..1) and ``rise`` (> 1).

    Returns a dict: ``x`` (the knee's rate, None when the sweep has none), ``row`` (its row of ``table``, a
    dict, or None), ``index`` (its position in the sorted table), ``rule`` (the rule in words, with the
    fractions), ``reason`` (why this row, or why none: what the numbers say), ``kneedle_x`` (the Kneedle
    knee of throughput against rate, :func:`kneedle`, a cross-check: it marks the corner, the last rate
    still on the straight part, so it is usually the rate just below the rule's knee) and ``steps``: a
    DataFrame, one row per rate: x, throughput, latency, ``throughput_gain`` (the step's slope over the
    light-load slope; NaN for the first rate), ``latency_growth`` (L_i over the lowest latency of the rates
    below it; NaN for the first rate), ``is_knee``. LabError for
    missing columns, fewer than 3 rates, rates not positive or repeated, or a bad ``flat``/``rise``."""
    import pandas as pd

    from lablib.results.tables import need

    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    need(df, (x, throughput, latency), "find_knee", "a rate sweep (lablib.studies.serving.rate_sweep_table)")
    if isinstance(flat, bool) or not isinstance(flat, (int, float)) or not 0 < flat < 1:
        raise LabError(f"flat={flat!r}: expected a fraction of the light-load slope between 0 and 1 (e.g. 0.5)")
    if isinstance(rise, bool) or not isinstance(rise, (int, float)) or not rise > 1 or not math.isfinite(rise):
        raise LabError(f"rise={rise!r}: expected a factor of the light-load latency above 1 (e.g. 2)")
    d = df[[x, throughput, latency]].astype(float)
    if d.isna().any().any():
        bad = d[d.isna().any(axis=1)].index.tolist()
        raise LabError(f"find_knee: rows {bad} have no {x}, {throughput} or {latency}: expected numbers in every row")
    order = d[x].sort_values(kind="stable").index
    d = d.loc[order]
    xs, ts, ls = d[x].tolist(), d[throughput].tolist(), d[latency].tolist()
    if len(xs) < 3:
        raise LabError(f"find_knee: {len(xs)} rates; expected 3 or more (a knee needs a bend)")
    if xs[0] <= 0 or not all(math.isfinite(v) for v in xs):
        raise LabError(
            f"find_knee: {x} from {xs[0]} to {xs[-1]}; expected finite rates above 0 (inf: use a finite rate)"
        )
    if len(set(xs)) != len(xs):
        raise LabError(f"find_knee: repeated {x} values {sorted(xs)}: expected one row per rate (a median of repeats)")
    if ts[0] <= 0 or ls[0] <= 0:
        raise LabError(
            f"find_knee: at the lowest rate {xs[0]} {throughput}={ts[0]} and {latency}={ls[0]}; expected both above 0"
        )
    light = ts[0] / xs[0]
    gains = [float("nan")] + [((ts[i] - ts[i - 1]) / (xs[i] - xs[i - 1])) / light for i in range(1, len(xs))]
    growth = [float("nan")] + [ls[i] / min(ls[:i]) for i in range(1, len(ls))]
    knee = next((i for i in range(1, len(xs)) if gains[i] < flat and growth[i] > rise), None)
    kn = kneedle(xs, ts)
    steps = pd.DataFrame(
        {
            x: xs,
            throughput: ts,
            latency: ls,
            "throughput_gain": gains,
            "latency_growth": growth,
            "is_knee": [i == knee for i in range(len(xs))],
        }
    )
    rule = KNEE_RULE.replace("below flat", f"below {flat:g}").replace("rise x", f"{rise:g} x")
    if knee is None:
        flat_at = [xs[i] for i in range(1, len(xs)) if gains[i] < flat]
        risen_at = [xs[i] for i in range(1, len(xs)) if growth[i] > rise]
        if not flat_at and not risen_at:
            reason = (
                f"no knee up to {x}={xs[-1]:g}: throughput still follows the rate and latency stays within "
                f"{rise:g}x of its lowest below; sweep higher rates"
            )
        else:
            reason = (
                f"no knee: throughput flattens at {flat_at or 'no rate'} but latency exceeds {rise:g}x its "
                f"light-load value at {risen_at or 'no rate'}, never both at once (a noisy sweep: more requests "
                "per rate, or a finer rate step)"
            )
        row = None
    else:
        reason = (
            f"at {x}={xs[knee]:g} the step from {xs[knee - 1]:g} gained {gains[knee]:.2f}x the light-load slope "
            f"({light:.3g} {throughput} per unit of {x}), below {flat:g}, while {latency} is "
            f"{growth[knee]:.1f}x its light-load value ({ls[knee]:.3g} against {min(ls[:knee]):.3g}, the lowest below "
            f"{xs[knee]:g}), above {rise:g}"
        )
        row = df.loc[order[knee]].to_dict()
    return {
        "x": xs[knee] if knee is not None else None,
        "row": row,
        "index": knee,
        "rule": rule,
        "reason": reason,
        "kneedle_x": xs[kn] if kn is not None else None,
        "steps": steps,
    }


def rate_sweep(
    server,
    model,
    rates,
    requests: int = 6,
    prompt_tokens: int = 32,
    max_new_tokens: int = 16,
    arrival: str = "constant",
    seed: int = 0,
    metrics_interval_s: float = 0.1,
    max_duration_s: float = 120.0,
) -> pd.DataFrame:
    """An open-loop rate sweep of ``server`` (a RunningServer) for :func:`find_knee`: one row per rate of
    ``rates`` (requests/s, swept upwards), ``requests`` distinct prompts of ``prompt_tokens`` for exactly
    ``max_new_tokens`` each, arriving ``arrival`` (constant by default: below capacity no request waits
    for another, so waiting begins where the server saturates), each run sampled on its ``/metrics``.

    Each row: ``rate``, ``output_tps``, ``ttft_p50_s``, ``ttft_p99_s``, ``e2e_p50_s``, ``errors`` and the
    server's ``running_max``, ``waiting_max``, ``kv_usage_max``, ``preemptions`` (None without /metrics).
    The request rows are in ``attrs["rows"]``, the samples (with ``rate``) in ``attrs["server_rows"]``."""
    from lablib.studies.serving import rate_sweep_table

    rates = sorted(float(r) for r in rates)
    if not rates:
        raise LabError("rates=[]: expected requests-per-second values, e.g. [0.5, 1, 2, 4, 8]")
    df = rate_sweep_table(
        [server],
        model,
        rates,
        requests=requests,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        max_duration_s=max_duration_s,
        seed=seed,
        metrics_interval_s=metrics_interval_s,
        arrival=arrival,
    )
    cols = ["rate", "output_tps", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "errors"]
    out = df[cols + ["running_max", "waiting_max", "kv_usage_max", "preemptions"]].copy()
    out.attrs = df.attrs
    return out


# --- real traffic -------------------------------------------------------------------------------
def quick_defaults(quick: bool | None = None) -> dict:
    """Sizes for lab 09 (:data:`lablib.config.BUDGETS` ``"scheduler"``): small in quick mode (LABLIB_QUICK=1)."""
    from lablib.config import budgets

    return budgets("scheduler", quick)


def trace_replay(
    server,
    model,
    start: int = 0,
    count: int = 12,
    time_scale: float = 1.0,
    length_scale: float = 1 / 64,
    trace=None,
    metrics_interval_s: float = 0.1,
    max_duration_s: float = 300.0,
):
    """A slice of a request trace (``trace``; None: the shipped Mooncake slice, requests ``start`` ..
    ``start + count - 1``) replayed on ``server`` (a RunningServer) on its own send times, scaled by
    ``time_scale`` and ``length_scale`` (:func:`lablib.measure.replay.scale`, prompts cut to the server's
    context), with the server's ``/metrics`` sampled every ``metrics_interval_s`` when it has them.

    Returns ``(rows, samples, summary)``: the request rows (a DataFrame: run_load's columns with the trace's,
    ``t_scheduled`` and ``schedule_lag_s`` among them), the server's samples (a DataFrame of t_s, metric,
    value; empty without /metrics) for :func:`lablib.plots.server_timeline`, and
    :func:`lablib.measure.replay.replay_summary` (lag p50/p99, kept_up, drain_s, perfect_reuse_fraction ...)."""
    import pandas as pd

    from lablib.engines.http.metrics import MetricsSampler
    from lablib.measure.replay import read_trace, replay, replay_summary, scale
    from lablib.studies.serving import _metrics_root

    plan = scale(read_trace(trace, start=start, count=count), time_scale, length_scale, n_ctx=server.n_ctx)
    e = server.engine(model)
    try:
        e.generate(e.tokenize("Hello there, how are you?"), GenerationConfig(max_new_tokens=4))  # warm-up
        sampler = MetricsSampler(e.root_url, metrics_interval_s) if _metrics_root(e) else None
        rows = replay(e, plan, server_metrics=sampler, max_duration_s=max_duration_s)
    finally:
        e.close()
    samples = pd.DataFrame(sampler.rows() if sampler is not None else [], columns=["t_s", "metric", "value"])
    return pd.DataFrame(rows), samples, replay_summary(rows, plan)


# --- prefix reuse on real traffic, and multi-turn chats -------------------------------------------------
ARMS = ("on", "off")  # a reuse run's arms (the rows' ``prefix_cache``), in the order they run
REUSE_VIEW = (  # the columns of a prefix_reuse table that put the measured reuse beside its bounds (lab 09)
    "prefix_cache",
    "requests",
    "errors",
    "prompt_tokens",
    "reusable_tokens",
    "perfect_hit_rate",
    "seen_prefix_tokens",
    "cached_tokens",
    "hit_rate",
    "cached_above_bound",
    "ttft_p50_s",
    "ttft_p99_s",
    "same_output",
)


def _arm_engine(server, model, arm: str):
    """An http engine on ``server`` for one arm: "on" lets a request reuse the KV cache of the arm's earlier
    requests, "off" lets none reuse another's.

    How, by what the server was started with (its settings' ``prefix_caching``): a server-wide prefix cache
    that is on (vLLM started with prefix_caching=True) serves both arms through vLLM's ``cache_salt``, one
    salt for all the "on" arm's requests (they share blocks with each other, with nothing computed before the
    arm: a rerun on the same server finds nothing of the last), a salt per request for "off"; one that is
    off (the lab's default vLLM) serves "off" only; a server with no such switch (llama-server) is switched
    per request (``cache_prompt``, :class:`lablib.engines.http.HTTPEngine`'s ``prompt_cache``)."""
    import uuid

    from lablib.engines.http.engine import SALT_PER_REQUEST

    if arm not in ARMS:
        raise LabError(f"arm {arm!r}: expected one of {', '.join(ARMS)}")
    server_wide = (getattr(server, "settings", None) or {}).get("prefix_caching")
    if server_wide is None:
        return server.engine(model, prompt_cache=arm == "on")
    if server_wide:
        return server.engine(model, cache_salt=f"lab-run-{uuid.uuid4().hex[:12]}" if arm == "on" else SALT_PER_REQUEST)
    if arm == "on":
        raise LabError(
            f"{server.name} was started with its prefix cache off: no arm with caching on; start one with "
            f"start_server({server.name!r}, ..., prefix_caching=True) (one server then serves both arms, through "
            "vLLM's cache_salt), or give arms=('off',)"
        )
    return server.engine(model)


def cache_block_tokens(root_url: str) -> int:
    """The tokens a server's prefix cache reuses at a time: the ``block_size`` it states in ``/metrics``
    (vLLM's ``cache_config_info``: 128 on its CPU build, where reuse is per full block); 1 where it states
    none (llama-server reuses any common prefix, token by token)."""
    from lablib.engines.http.metrics import scrape, server_settings

    try:
        info = server_settings(scrape(root_url, only_view=True))
    except LabError:
        return 1
    for labels in info.values():
        size = str(labels.get("block_size", ""))
        if size.isdigit() and int(size) > 0:
            return int(size)
    return 1


def _common(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def seen_prefix(rows, prompts, before=(), block: int = 1) -> list[int]:
    """Per row of ``rows`` (one arm's replay rows, any order; ``request_index`` into ``prompts``, the
    token ids sent, and ``token_ids``, what came back), the prefix tokens a cache that kept everything could
    have reused: the longest common prefix of its prompt with any request sent before it (``t_start``
    order, ``t_submit`` where it has none; ``before``: (prompt, output) pairs sent ahead of the rows, a warm-up), that request's prompt and
    output together (a slot, or a paged cache, holds both), at most its prompt less one token (a server
    evaluates at least the last), rounded down to whole blocks of ``block`` tokens. An upper bound of what a
    server's own counter can show: it ignores eviction and requests still in flight. In the order of ``rows``."""

    def sent(i):  # when its headers went out (t_start), else when it was due; ties in schedule order
        r = rows[i]
        return (r.get("t_start") if r.get("t_start") is not None else r["t_submit"], r["request_index"])

    order = sorted(range(len(rows)), key=sent)
    held = [list(p) + list(o or []) for p, o in before]
    out = [0] * len(rows)
    for i in order:
        r = rows[i]
        ids = prompts[r["request_index"]]
        best = max((_common(ids, h) for h in held), default=0)
        out[i] = min(best, len(ids) - 1) // block * block
        held.append(list(ids) + [t for t in (r.get("token_ids") or []) if t is not None and t >= 0])
    return out


def _run_arms(server, model, plan, prompts, arms, max_duration_s: float, concurrency: int | None):
    """One replay of ``plan`` (``prompts``) per arm on ``server``: rows (with ``prefix_cache`` and
    ``seen_prefix_tokens``) and per arm the server's counter deltas, its summary and the cache's block."""
    from lablib.measure.replay import replay, replay_summary
    from lablib.studies.serving import _counters, _counters_after, _delta

    arms = tuple(arms)
    if not arms or any(a not in ARMS for a in arms) or len(set(arms)) != len(arms):
        raise LabError(f"arms={arms!r}: expected one or both of {ARMS}, each once")
    arms = tuple(a for a in ARMS if a in arms)  # "on" first: a llama-server's prompt cache then holds nothing of "off"
    cfg = GenerationConfig(max_new_tokens=4)
    rows, runs = [], {}
    for arm in arms:
        e = _arm_engine(server, model, arm)
        try:
            warm_ids = e.tokenize("Hello there, how are you?")
            warm = e.generate(warm_ids, cfg)  # warm-up, outside the rows
            block = cache_block_tokens(e.root_url)
            before = _counters(e)
            got = replay(e, plan, prompts, concurrency=concurrency, max_duration_s=max_duration_s)
            after = _counters_after(e, before, sum(len(p) for p in prompts)) if before is not None else {}
        finally:
            e.close()
        seen = seen_prefix(got, prompts, [(warm_ids, warm.token_ids)], block)
        for r, s in zip(got, seen):
            r["prefix_cache"] = arm
            r["seen_prefix_tokens"] = s
        got.sort(key=lambda r: r["request_index"])
        rows += got
        runs[arm] = {
            "summary": replay_summary(got, plan),
            "queries": _delta(after, before or {}, "prefix_cache_queries"),
            "hits": _delta(after, before or {}, "prefix_cache_hits"),
            "block": block,
            "cache_control": got[0].get("cache_control") if got else None,
        }
    return rows, runs


def _same_outputs(rows) -> int | None:
    """Requests whose output ids are the same in both arms (greedy decoding: caching must not change the
    answer); None with one arm."""
    if len({r["prefix_cache"] for r in rows}) < len(ARMS):
        return None
    by: dict = {}
    for r in rows:
        if not r.get("error"):
            by.setdefault(r["request_index"], {})[r["prefix_cache"]] = list(r.get("token_ids") or [])
    return sum(1 for v in by.values() if len(v) == len(ARMS) and v[ARMS[0]] == v[ARMS[1]])


def prefix_reuse(
    server,
    model,
    start: int = 0,
    count: int = 12,
    time_scale: float = 1.0,
    length_scale: float = 1 / 64,
    output_scale: float | None = None,
    trace=None,
    requests=None,
    arms=ARMS,
    concurrency: int | None = None,
    max_duration_s: float = 300.0,
):
    """A slice of a request trace replayed on ``server`` twice, with prefix caching on and off (``arms``):
    the shipped Mooncake slice by default (``trace``, requests ``start`` .. ``start + count - 1``; or
    ``requests``, trace indices in file order, e.g. the turns of a few conversations), scaled by
    ``time_scale``, ``length_scale`` and ``output_scale`` (None: ``length_scale``; :func:`lablib.measure.replay.scale`,
    prompts cut to the server's context), the same prompts in both arms (:func:`lablib.measure.replay.build_prompts`: requests sharing k
    hash ids share exactly k scaled blocks of tokens), on the trace's own send times (with at most
    ``concurrency`` in flight when given: later ones wait in the lab's queue, so each finds the ones before
    it done). How each arm is switched: :func:`_arm_engine` (rows' ``cache_control`` and ``server_settings``
    say so); "on" runs first.

    Returns ``(rows, table)``. ``rows``: a DataFrame, one row per request and arm: the replay's columns
    (``reusable_tokens``: what a perfect block cache could reuse, :func:`lablib.measure.replay.perfect_reuse`;
    ``t_scheduled``, ``schedule_lag_s``), ``prefix_cache`` ("on"/"off"), ``seen_prefix_tokens``
    (:func:`seen_prefix`: the token-level bound, at the server's block) and, where the server reports it per
    request, ``usage_cached_tokens`` (llama-server's ``timings.cache_n``; vLLM reports none). ``table``: one
    row per arm: ``prefix_cache``, ``server``, ``prefix_caching`` (the server's start switch; None: none),
    ``cache_control``, ``requests``, ``errors``, ``prompt_tokens`` (all sent), ``reusable_tokens`` and
    ``perfect_hit_rate`` (of the prompt tokens), ``seen_prefix_tokens`` (the sum), ``cache_block_tokens``,
    ``cached_tokens`` (the server's own counter: prefix_cache_hits over the arm; the rows' sum without
    /metrics) and ``hit_rate`` (cached over prompt tokens), ``prefix_cache_queries``, ``cached_above_bound``
    (cached tokens no earlier request of the arm can explain: reuse of something the server held before it;
    None without per-request counts), ``ttft_p50_s``, ``ttft_p99_s``, ``e2e_p50_s``, ``schedule_lag_p99_s``,
    ``kept_up``, ``drain_s`` and ``same_output`` (requests whose output ids equal the other arm's; None with
    one arm). LabError for a slice outside the trace, or an arm the server cannot serve."""
    import dataclasses

    import pandas as pd

    from lablib.measure.replay import build_prompts, read_trace, scale

    if requests is None:
        tr = read_trace(trace, start=start, count=count)
    else:
        picked = [int(i) for i in requests]
        if not picked or len(set(picked)) != len(picked):
            raise LabError(f"requests={requests!r}: expected distinct trace indices, e.g. [1, 10, 134, 137]")
        whole_trace = read_trace(trace)
        by = {r.index: r for r in whole_trace.requests}
        missing = [i for i in picked if i not in by]
        if missing:
            raise LabError(f"requests {missing}: the trace has requests 0 .. {len(by) - 1}")
        chosen = tuple(sorted((by[i] for i in picked), key=lambda r: r.arrival_s))
        tr = dataclasses.replace(whole_trace, requests=chosen, start=min(picked), params={"requests": sorted(picked)})
    plan = scale(tr, time_scale, length_scale, output_scale, n_ctx=server.n_ctx)
    prompts = build_prompts(model, plan)
    rows, runs = _run_arms(server, model, plan, prompts, arms, max_duration_s, concurrency)
    same = _same_outputs(rows)
    settings = getattr(server, "settings", None) or {}
    table = []
    for arm, run in runs.items():
        mine = [r for r in rows if r["prefix_cache"] == arm]
        s = run["summary"]
        per = [r.get("usage_cached_tokens") for r in mine]
        reported = all(v is not None for v in per) and bool(per)
        cached = run["hits"] if run["hits"] is not None else (sum(per) if reported else None)
        prompt_tokens = sum(r["prompt_tokens"] for r in mine)
        reusable = sum(r["reusable_tokens"] for r in mine)
        table.append(
            {
                "prefix_cache": arm,
                "server": getattr(server, "kind", None),
                "prefix_caching": settings.get("prefix_caching"),
                "cache_control": run["cache_control"],
                "requests": s["requests"],
                "errors": s["errors"],
                "prompt_tokens": prompt_tokens,
                "reusable_tokens": reusable,
                "perfect_hit_rate": reusable / prompt_tokens if prompt_tokens else None,
                "seen_prefix_tokens": sum(r["seen_prefix_tokens"] for r in mine),
                "cache_block_tokens": run["block"],
                "cached_tokens": cached,
                "hit_rate": cached / prompt_tokens if cached is not None and prompt_tokens else None,
                "prefix_cache_queries": run["queries"],
                "cached_above_bound": sum(max(0, v - r["seen_prefix_tokens"]) for v, r in zip(per, mine))
                if reported
                else None,
                "ttft_p50_s": s["ttft_p50_s"],
                "ttft_p99_s": s["ttft_p99_s"],
                "e2e_p50_s": s["e2e_p50_s"],
                "schedule_lag_p99_s": s["schedule_lag_p99_s"],
                "kept_up": s["kept_up"],
                "drain_s": s["drain_s"],
                "same_output": same,
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(table)


def multi_turn(
    server,
    model,
    n_sessions: int = 2,
    turns: int = 3,
    question_tokens=32,
    answer_tokens=12,
    system_tokens: int = 128,
    think_time_s: float = 3.0,
    rate: float = 0.5,
    seed: int = 0,
    arms=ARMS,
    concurrency: int | None = None,
    max_duration_s: float = 300.0,
):
    """Multi-turn chats on ``server``, with prefix caching on and off (``arms``): ``n_sessions`` sessions
    (:func:`lablib.measure.replay.sessions`, starting at ``rate`` sessions/s, Poisson, seeded) of ``turns``
    turns sent ``think_time_s`` apart; turn t's prompt is a system prompt of ``system_tokens`` shared by every
    session, the chat so far (every earlier question, and a placeholder of every earlier answer's length) and
    a new question of ``question_tokens``; its answer ``answer_tokens`` (EOS ignored). An open loop (a turn
    is sent on time even when the last one has not finished), with at most ``concurrency`` in flight when
    given. The same prompts in both arms; "on" runs first (:func:`_arm_engine` says how each is switched).

    Returns ``(rows, table)``: the rows (:func:`prefix_reuse`'s columns, with ``session`` and ``turn``) and
    :func:`turn_table` of them. LabError when a chat does not fit the server's context (a prompt cut to it
    would break the chat's shared prefix), or an arm the server cannot serve."""
    import pandas as pd

    from lablib.measure.replay import build_prompts, scale, sessions

    tr = sessions(
        n_sessions,
        turns,
        question_tokens=question_tokens,
        answer_tokens=answer_tokens,
        think_time_s=think_time_s,
        rate=rate,
        system_tokens=system_tokens,
        seed=seed,
    )
    plan = scale(tr, n_ctx=server.n_ctx)
    if plan.factors["capped"]:
        longest = max(r.prompt_tokens + r.output_tokens for r in tr.requests)
        raise LabError(
            f"the chats reach {longest} tokens, more than the server's {server.n_ctx} per request: expected fewer "
            "turns or shorter questions, or a server with a larger n_ctx"
        )
    prompts = build_prompts(model, plan)
    rows, _ = _run_arms(server, model, plan, prompts, arms, max_duration_s, concurrency)
    df = pd.DataFrame(rows)
    return df, turn_table(df)


def turn_table(rows) -> pd.DataFrame:
    """Multi-turn rows (:func:`multi_turn`) by arm and turn, one row each: ``prefix_cache``, ``turn``,
    ``requests``, ``errors``, ``prompt_tokens`` (median), ``cached_tokens`` (median of the server's own
    per-request count, ``usage_cached_tokens``; NaN where the server reports none, as vLLM),
    ``seen_prefix_tokens`` (median of the bound, :func:`seen_prefix`), ``ttft_p50_s`` and ``ttft_max_s``
    (of the successful requests). Needs: prefix_cache, turn, prompt_tokens, ttft_s, seen_prefix_tokens."""
    import pandas as pd

    from lablib.results.tables import need, nonempty

    df = _frame(rows)
    need(df, ("prefix_cache", "turn", "prompt_tokens", "ttft_s", "seen_prefix_tokens"), "turn_table", "multi_turn")
    nonempty(df, "turn_table", "run lablib.studies.scheduler.multi_turn first")
    if "usage_cached_tokens" not in df.columns:
        df = df.assign(usage_cached_tokens=None)
    failed = df["error"].notna() if "error" in df.columns else pd.Series(False, index=df.index)
    out = []
    for (arm, turn), g in df.groupby(["prefix_cache", "turn"], sort=False):
        ok = g[~failed.loc[g.index]]
        out.append(
            {
                "prefix_cache": arm,
                "turn": int(turn),
                "requests": len(g),
                "errors": int(failed.loc[g.index].sum()),
                "prompt_tokens": ok["prompt_tokens"].median(),
                "cached_tokens": pd.to_numeric(ok["usage_cached_tokens"], errors="coerce").median(),
                "seen_prefix_tokens": ok["seen_prefix_tokens"].median(),
                "ttft_p50_s": ok["ttft_s"].median(),
                "ttft_max_s": ok["ttft_s"].max(),
            }
        )
    order = {a: i for i, a in enumerate(ARMS)}
    out.sort(key=lambda r: (order.get(r["prefix_cache"], len(order)), r["turn"]))
    return pd.DataFrame(out)
