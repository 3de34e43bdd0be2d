"""What the console shows: one ``key=value`` line per result, the same fields wherever it is printed.

Used by the CLI (:mod:`lablib.cli.bench`, ``quantize``, ``quality``), lab 05's panel (:class:`lablib.ui.serving.ServingPanel`)
and benchmarks/serving.py.
"""

from __future__ import annotations


def summary_line(server: str, mode: str, rate, c, s: dict) -> str:
    """One line: ``server=NAME mode=MODE rate=R c=C output_tps=X ttft_p50_s=Y goodput=Z`` and more, of a
    run summary ``s`` (:func:`lablib.results.tables.run_summary`: the same names)."""

    def f(x, nd=3):
        return "-" if x is None else f"{x:.{nd}f}"

    return (
        f"server={server} mode={mode} rate={'-' if rate is None else f'{rate:g}'} c={'-' if c is None else c} "
        f"output_tps={f(s['output_tps'], 2)} ttft_p50_s={f(s['ttft_p50_s'])} goodput={f(s['goodput_rps'], 3)} "
        f"ttft_p99_s={f(s['ttft_p99_s'])} tpot_p50_s={f(s['tpot_p50_s'], 4)} e2e_p99_s={f(s['e2e_p99_s'])} "
        f"errors={s['errors']}/{s['requests']}{_client_note(s.get('client_headroom'))}{_cost_note(s)}"
        + "".join(f" {k}={s[k]}" for k in ("decode_unseen_requests", "first_bunched_requests") if s.get(k))
    )


def stream_note(s: dict) -> str | None:
    """What ``decode_unseen_requests=N`` and ``first_bunched_requests=M`` of a run summary ``s`` mean, in a sentence
    each (None when both are 0): N requests got every token at one instant
    (:attr:`lablib.results.trace.RequestTrace.decode_unseen`), so their TTFT holds their decode too and they have no
    TPOT; M got their first token with others, so their TTFT holds some decode and their TPOT is low. Said for M only
    when it is most of the requests (one or two such reads happen on a busy machine)."""
    n, m = s.get("decode_unseen_requests") or 0, s.get("first_bunched_requests") or 0
    ok = s["requests"] - s["errors"]
    said = []
    if n:
        said.append(
            f"{n} of {ok} requests got all their tokens at one instant (one network read): the stream came whole, "
            "buffered by a proxy or by the server, or read late by this client (a busy machine); their TTFT holds "
            "their decode too, and they have no TPOT (left out of tpot_p50_s)"
        )
    if m and 2 * m > ok:
        said.append(
            f"{m} of {ok} requests got their first token together with others (first_arrival_tokens above 1): "
            "something held it back, a proxy that sends on in pieces or this client reading late; their TTFT holds "
            "the decode of the ones that came with it, and their TPOT, over a shorter span, is lower than the "
            "server's"
        )
    if not said:
        return None
    return (
        "; ".join(said) + ": to see the decode, measure the server directly (not through a proxy that buffers, "
        "such as nginx's proxy_buffering) on a machine with cores to spare"
    )


def _cost_note(s: dict) -> str:
    """`` cost_per_mtok=0.42`` (a price per hour was given), `` gpu_j_per_token=0.031`` (NVML's energy counter over
    a long enough window) and `` cpu_j_per_token=0.2`` (RAPL's package energy), else nothing
    (:func:`lablib.measure.load.bench`)."""
    out = ""
    if s.get("cost_per_mtok") is not None:
        out += f" cost_per_mtok={s['cost_per_mtok']:.4g}"
    for who in ("gpu", "cpu"):
        if s.get(f"{who}_j_per_output_token") is not None:
            out += f" {who}_j_per_token={s[f'{who}_j_per_output_token']:.4g}"
    return out


def processes_line(per_process: list[dict]) -> str:
    """``  client processes=2: #0 streams=64 rows=128 lag_p99_ms=0.8 | #1 ...``: each client process of a bench
    run (:func:`lablib.measure.load.run_load_processes`), its share and how late its stamping loop was
    (``near`` where that loop was near its limit)."""
    parts = []
    for p in per_process:
        h = p.get("client_headroom") or {}
        lag = h.get("loop_lag_p99_s")
        lag_s = "-" if lag is None else f"{lag * 1e3:.1f}"
        near = " near" if h.get("near_limit") else ""
        parts.append(f"#{p['process']} streams={p['streams']} rows={p['rows']} lag_p99_ms={lag_s}{near}")
    return f"  client processes={len(per_process)}: " + " | ".join(parts)


def _client_note(h: dict | None) -> str:
    """`` client_near_limit=loop_lag_p99_ms:X`` when the client's own stamping loop lagged (a bench summary's
    ``client_headroom``, :func:`lablib.measure.load.client_headroom_of`), else nothing."""
    if not h or not h.get("near_limit") or h.get("loop_lag_p99_s") is None:
        return ""
    return f" client_near_limit=loop_lag_p99_ms:{h['loop_lag_p99_s'] * 1e3:.1f}"


def server_line(c: dict) -> str:
    """The server's own counters of one run (a bench summary's ``server_counters``:
    :meth:`lablib.engines.http.metrics.MetricsSampler.deltas`): ``server_prompt_tokens=N
    server_generation_tokens=N prefix_cache_hits=H/Q preemptions=P running_max=R waiting_max=W
    kv_usage_max=X scrapes=S failures=F``; ``-`` where the server has no such metric."""

    def f(k, fmt="g"):
        v = c.get(k)
        return "-" if v is None else format(v, fmt)

    by_reason = c.get("waiting_by_reason") or {}
    reasons = "".join(f" waiting_{r}_max={v:g}" for r, v in sorted(by_reason.items()))
    return (
        f"  server_prompt_tokens={f('prompt_tokens')} server_generation_tokens={f('generation_tokens')} "
        f"prefix_cache_hits={f('prefix_cache_hits')}/{f('prefix_cache_queries')} preemptions={f('preemptions')} "
        f"running_max={f('running')} waiting_max={f('waiting')}{reasons} kv_usage_max={f('kv_usage', '.3f')} "
        f"scrapes={f('scrapes')} failures={f('scrape_failures')}"
    )


def ladder_line(row: dict) -> str:
    """One rung of the quantization ladder (:mod:`lablib.studies.ladder`): ``type=T bytes=B bpw=X ppl=P kl_mean=K top1=A prefill_tps=S decode_tps=D``."""

    def f(k, fmt):
        v = row.get(k)
        return "-" if v is None or v != v else format(v, fmt)

    return (
        f"type={row.get('type')} bytes={row.get('bytes')} bpw={f('bpw', '.2f')} "
        f"ppl={f('ppl', '.3f')} kl_mean={f('kl_mean', '.3g')} top1={f('top1', '.3f')} "
        f"prefill_tps={f('prefill_tps', '.1f')} decode_tps={f('decode_tps', '.1f')} engine={row.get('engine')}"
    )
