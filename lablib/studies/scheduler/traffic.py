"""Real traffic (lab 09): a slice of Mooncake's trace on its own send times (:func:`trace_replay`); the same
slice with prefix caching on and off (:func:`prefix_reuse`: the server's own hit counters beside what a
perfect cache could have reused, TTFT p50/p99); multi-turn chats on and off (:func:`multi_turn`,
:func:`turn_table`). One server serves both arms (:func:`_arm_engine`: llama-server per request,
``cache_prompt``; vLLM started with prefix caching on, through its ``cache_salt``), "on" first.

Seconds unless a name says otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.studies.scheduler.hol import _frame

if TYPE_CHECKING:
    import pandas as pd


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
    have reused: the longest common prefix of its prompt with any other request the server could have
    computed before it (``before``: (prompt, output) pairs sent ahead of the rows, a warm-up), that request's
    prompt and output together (a slot, or a paged cache, holds both), at most its prompt less one token (a
    server evaluates at least the last), rounded down to whole blocks of ``block`` tokens. An upper bound of
    what a server's own counter can show: it ignores eviction and requests still in flight.

    Which requests could come first: those sent before it (``t_start`` order, ``t_submit`` where it has none;
    ties in schedule order), and those sent after it but before its first token came back (``t_first_token``).
    Requests sent within the same millisecond reach the server over separate connections in an order the
    client does not see, and one that waits for a slot can find the later one's prompt cached: lab 09's
    replay on llama-server (8 requests, 2 slots, three sent within 0.2 ms) once showed 8 cached tokens above
    a bound that counted only the client's order. In the order of ``rows``."""

    def sent(i):  # when its headers went out (t_start), else when it was due; ties in schedule order
        r = rows[i]
        return (r.get("t_start") if r.get("t_start") is not None else r["t_submit"], r["request_index"])

    def held(i):  # what a cache holds of row i once it is done: its prompt and the ids it answered
        r = rows[i]
        return list(prompts[r["request_index"]]) + [t for t in (r.get("token_ids") or []) if t is not None and t >= 0]

    ahead = [list(p) + list(o or []) for p, o in before]
    out = [0] * len(rows)
    for i, r in enumerate(rows):
        first = r.get("t_first_token")
        could = [
            j
            for j in range(len(rows))
            if j != i and (sent(j) < sent(i) or (first is not None and first == first and sent(j)[0] < first))
        ]
        ids = prompts[r["request_index"]]
        best = max((_common(ids, h) for h in ahead + [held(j) for j in could]), default=0)
        out[i] = min(best, len(ids) - 1) // block * block
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
    request, ``usage_cached_tokens`` (llama-server's ``timings.cache_n``; vLLM's ``usage.prompt_tokens_details``, which
    the lab starts it to send). ``table``: one
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
    per-request count, ``usage_cached_tokens``; NaN where the server reports none),
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
