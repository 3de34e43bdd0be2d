"""Lab 05's operations: in-process against a server, rate sweeps with goodput, prefix caching, a panel.

Thin wrappers over :mod:`lablib.engines.servers`, :mod:`lablib.engines.http` and :mod:`lablib.measure.load`,
so the notebook stays a few calls. Every function returns a pandas DataFrame.
"""

from __future__ import annotations

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import SERVERS


def quick_defaults(quick: bool | None = None) -> dict:
    """Sizes for the lab (:data:`lablib.config.BUDGETS` ``"serving"``): small in quick mode (LABLIB_QUICK=1)."""
    from lablib.config import budgets

    return budgets("serving", quick)


def in_process_vs_server(model, server, prompt_tokens: int = 32, max_new_tokens: int = 8, reps: int = 2):
    """The same requests on the in-process twin of ``server`` (a RunningServer), with the server's
    threads, and over HTTP.

    One row per request: ``where`` ("in-process" or "http"), ttft_s, tpot_s, e2e_s, plus the http
    rows' count_method. Each request has its own prompt (no prefix reuse), after one warm-up each way.
    """
    import pandas as pd

    from lablib.engines import load_engine
    from lablib.measure.sweep import measured_traces
    from lablib.measure.workload import distinct_prompts

    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, reps + 1)
    rows = []
    # the twin gets the server's threads: on a shared 2-core machine two threads can be far slower than one
    twin = load_engine(
        SERVERS[server.name].twin,
        model,
        n_ctx=max(2048, prompt_tokens + max_new_tokens),
        threads=server.threads or None,
    )
    # each way: one warm-up on the prompt no measured request uses, then one distinct prompt per
    # repetition (on purpose: no request may reuse another's prefix, in process or on the server)
    warm, measured = [prompts[-1]], prompts[:reps]
    try:
        for i, t in enumerate(measured_traces(twin, measured, cfg, warmup=warm)):
            rows.append(dict(where="in-process", engine=twin.name, rep=i, **_times(t)))
    finally:
        twin.close()
    e = server.engine(model)
    try:
        for i, t in enumerate(measured_traces(e, measured, cfg, warmup=warm)):
            rows.append(
                dict(where="http", engine=f"{server.name} server", rep=i, **_times(t), count_method=t.count_method)
            )
    finally:
        e.close()
    return pd.DataFrame(rows)


def _times(t) -> dict:
    return {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s, "e2e_s": t.e2e_s, "output_tokens": t.output_tokens}


def rate_sweep_table(
    servers,
    model,
    rates,
    requests: int = 4,
    prompt_tokens: int = 32,
    max_new_tokens: int = 8,
    ttft_s: float = 2.0,
    tpot_s: float = 0.1,
    max_duration_s: float = 120.0,
    seed: int = 0,
):
    """A Poisson rate sweep on each server of ``servers`` (RunningServer objects); one row per
    (server, rate): output_tps, ttft p50/p95, tpot p50, goodput (requests/s meeting ``ttft_s``
    and ``tpot_s``) and its fraction. The raw request rows are in the result's ``attrs["rows"]``."""
    import pandas as pd

    from lablib.measure.load import rate_sweep, summarize
    from lablib.measure.workload import distinct_prompts

    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, requests + 1)
    table, raw = [], []
    for srv in servers:
        e = srv.engine(model)
        try:
            e.generate(prompts[-1], cfg)  # warm-up on a prompt no measured request uses
            rows = rate_sweep(e, prompts[:-1], rates, seed=seed, cfg=cfg, max_duration_s=max_duration_s)
        finally:
            e.close()
        raw += rows
        for r in rates:
            s = summarize([x for x in rows if x["rate"] == r], ttft_s=ttft_s, tpot_s=tpot_s)
            table.append(
                {
                    "server": srv.name,
                    "rate": r,
                    "output_tps": s["output_tps"],
                    "ttft_p50_s": s["ttft_p50_s"],
                    "ttft_p95_s": s["ttft_p95_s"],
                    "tpot_p50_s": s["tpot_p50_s"],
                    "goodput_rps": s["goodput_rps"],
                    "goodput_fraction": s["goodput_fraction"],
                    "errors": s["errors"],
                }
            )
    df = pd.DataFrame(table)
    df.attrs["rows"] = raw
    return df


def prefix_cache_demo(model, server, shared_tokens: int = 256, own_tokens: int = 16, max_new_tokens: int = 4):
    """A shared system prompt of ``shared_tokens`` and a short question of its own per request, sent
    three times to ``server``: the first request computes the whole prompt, the next ones may reuse
    the shared prefix if the server caches it. One row per request: ``request``, ttft_s, cached_tokens
    (as the server reports it; None where it does not), and the labelled ``prefix`` ("cold" / "shared")."""
    import pandas as pd

    from lablib.measure.workload import prompt_of_length

    shared = prompt_of_length(model, shared_tokens, offset=3000)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    e = server.engine(model)
    rows = []
    try:
        e.generate(prompt_of_length(model, own_tokens, offset=9000), cfg)  # warm-up, nothing shared
        for i in range(3):
            ids = shared + prompt_of_length(model, own_tokens, offset=5000 + 100 * i)
            t = e.generate(ids, cfg)
            rows.append(
                {
                    "server": server.name,
                    "request": i,
                    "prefix": "cold" if i == 0 else "shared",
                    "prompt_tokens": t.prompt_tokens,
                    "ttft_s": t.ttft_s,
                    "cached_tokens": t.usage_cached_tokens,
                }
            )
    finally:
        e.close()
    return pd.DataFrame(rows)
