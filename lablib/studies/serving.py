"""Lab 05's operations: the servers it starts, in-process against a server, rate sweeps with goodput and
the server's own view, prefix caching read on the server's counters.

Thin wrappers over :mod:`lablib.engines.servers`, :mod:`lablib.engines.http` (its ``metrics``) and
:mod:`lablib.measure.load`, so the notebook stays a few calls. Every function that measures returns a
pandas DataFrame.
"""

from __future__ import annotations

import uuid

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import SERVERS, VLLM_BLOCK_TOKENS

# vLLM in lab 05: the test suite's configuration (tests/conftest.py's vllm_server), so the notebook starts
# from the compile cache the tests left (~/.cache/vllm: a new configuration compiles for minutes)
VLLM_PARALLEL = 2  # sequences scheduled together (--max-num-seqs)
VLLM_N_CTX = 512  # tokens per sequence (--max-model-len)


def _servers(servers) -> list:
    """``servers`` as a list: one RunningServer, or a list/tuple of them; LabError when there is none, or
    for one that is no RunningServer (a URL, say: it names its place in the list)."""
    from lablib.engines.servers import RunningServer
    from lablib.errors import LabError

    servers = list(servers) if isinstance(servers, (list, tuple)) else [servers]
    if not servers:
        raise LabError("no servers: expected one or more RunningServer objects (lablib.engines.servers.start_server)")
    for i, srv in enumerate(servers):
        if not isinstance(srv, RunningServer):
            raise LabError(
                f"servers[{i}]={srv!r}: expected a RunningServer (lablib.engines.servers.start_server): lab 05 "
                "measures servers the lab started; for another server use load_engine('http', model, base_url=...)"
            )
    return servers


# a Jupyter kernel sets FORCE_COLOR=1 for its children (ipykernel), so vLLM would colour its log lines and
# the progress lines start_server prints from that log would carry ANSI escapes; not a compile-cache factor
def quick_defaults(quick: bool | None = None) -> dict:
    """Sizes for the lab (:data:`lablib.config.BUDGETS` ``"serving"``): small in quick mode (LABLIB_QUICK=1)."""
    from lablib.config import budgets

    return budgets("serving", quick)


def start_vllm_pair(model, parallel: int = VLLM_PARALLEL, n_ctx: int = VLLM_N_CTX, threads=None, log=print):
    """Two vLLM servers of one configuration: ``(measured, cached)``, the lab's measured server (prefix
    caching off, the lab's rule) and one with prefix caching on (for the prefix-cache experiment only).

    vLLM's environment is installed first when missing (:func:`lablib.build.vllm.ensure`: minutes, progress
    lines through ``log``). Then both start together: a start is mostly single-threaded Python (three
    processes importing torch, then the model's compile-cache warm-up), so on two cores two starts take
    little longer than one (measured: 139 s for both, 118 s for one). Only when the lab has never started
    vLLM with this configuration here (no log of a start that finished, :func:`_vllm_started_before`) does
    the measured one start alone first: the first start compiles and writes vLLM's compile cache
    (~/.cache/vllm), which the second then reads (two starts compiling at once would both write it).
    ``log``: progress lines, each marked with the server's prefix caching; None: quiet."""
    from concurrent.futures import ThreadPoolExecutor

    from lablib.build.vllm import ensure
    from lablib.engines.servers import start_server, vllm_dtype
    from lablib.model.resolve import ResolvedModel, prepare

    model = model if isinstance(model, ResolvedModel) else prepare(model, log=lambda *_: None)
    ensure(log=log or (lambda *_: None))

    def start(prefix_caching: bool):
        mark = f"[prefix caching {'on' if prefix_caching else 'off'}] "
        say = None if log is None else (lambda m: log(mark + m))
        return start_server(
            "vllm",
            model,
            parallel=parallel,
            n_ctx=n_ctx,
            threads=threads,
            prefix_caching=prefix_caching,
            log=say,
        )

    if not _vllm_started_before(model, parallel, n_ctx, vllm_dtype()):
        if log is not None:
            log("vllm: first start of this configuration here: it compiles the model (minutes), then the second starts")
        measured = start(False)
        try:
            return measured, start(True)
        except BaseException:
            measured.stop()
            raise
    with ThreadPoolExecutor(2, thread_name_prefix="lablib-vllm-start") as pool:
        futures = [pool.submit(start, pc) for pc in (False, True)]
        try:
            measured, cached = (f.result() for f in futures)
        except BaseException:  # one failed (or Ctrl-C): the other is stopped once its start ends
            for f in futures:
                try:
                    f.result().stop()
                except BaseException:  # noqa: BLE001 - the one that failed has nothing to stop
                    pass
            raise
    return measured, cached


def _vllm_started_before(model, parallel: int, n_ctx: int, dtype: str) -> bool:
    """Has the lab started vLLM here on ``model``'s HF folder with this configuration, to the end (its log
    under ``$LABLIB_HOME/servers/`` starts with the same flags and says the application started)? Then
    vLLM's compile cache holds it (prefix caching is not part of its key)."""
    from lablib.config import lab_home

    folder = model.path_for("hf", "vLLM")
    flags = (f"--model {folder} ", f"--dtype {dtype} ", f"--max-model-len {n_ctx} ", f"--max-num-seqs {parallel} ")
    for log in (lab_home() / "servers").glob("vllm-*.log"):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        first = text.split("\n", 1)[0] + " "
        if all(f in first for f in flags) and "Application startup complete" in text:
            return True
    return False


def servers_table(servers):
    """What each server (RunningServer objects) was started with, one row each: server, version, parallel
    (slots or sequences scheduled together), threads, n_ctx (tokens per slot), and where the server's row
    sets them (:attr:`RunningServer.settings`): dtype, kv_cache_gib (KV cache space), cpus_bound,
    prefix_caching (None: the server has no switch); startup_s, base_url."""
    import pandas as pd

    rows = []
    for srv in servers:
        s = srv.settings or {}
        rows.append(
            {
                "server": srv.name,
                "version": srv.version,
                "parallel": s.get("parallel"),
                "threads": srv.threads,
                "n_ctx": srv.n_ctx,
                "dtype": s.get("dtype"),
                "kv_cache_gib": s.get("kv_cache_space_gib"),
                "cpus_bound": s.get("cpus_bound"),
                "prefix_caching": s.get("prefix_caching"),
                "startup_s": round(srv.startup_s, 1),
                "base_url": srv.base_url,
            }
        )
    return pd.DataFrame(rows)


def twin_load(server, twin_name: str, tokens: int) -> dict:
    """Load keywords of ``server``'s in-process twin ``twin_name`` for requests of ``tokens`` (prompt + output): a
    context of at least 2048 tokens, the server's threads (on a shared 2-core machine two threads can be far slower
    than one), its compute dtype where the twin's weights are chosen by dtype (vLLM: bfloat16 where the CPU has it)
    and its attention kernel where the twin has a choice (llama.cpp's ``flash_attn``, as the server's log says:
    llama-server fused, llama-cpp-python's server not): with another kernel the twin computes other numbers, not
    only at another speed (lab 04, worked example 5)."""
    from lablib.engines import engine_class
    from lablib.engines.servers.device import same_kernel

    settings = getattr(server, "settings", None) or {}
    load = {"n_ctx": max(2048, tokens), "threads": server.threads or None}
    if settings.get("dtype") and getattr(engine_class(twin_name), "weights_option", None) == "dtype":
        load["dtype"] = settings["dtype"]
    return {**load, **same_kernel(settings, twin_name)}


def in_process_vs_server(model, server, prompt_tokens: int = 32, max_new_tokens: int = 8, reps: int = 2):
    """The same requests on the in-process twin of ``server`` (a RunningServer), with the server's
    threads, dtype and attention kernel (:func:`twin_load`), and over HTTP.

    One row per request: ``where`` ("in-process" or "http"), ttft_s, tpot_s, e2e_s, output_tokens, plus
    the http rows' count_method and ``chunks`` (content events the tokens came in). Each request has its own prompt (no prefix reuse), after one warm-up each way.
    The server's http engine is opened first: a stopped server is named (RunningServer's message) before
    the twin is loaded and measured.
    """
    import pandas as pd

    from lablib.checks import whole
    from lablib.engines import load_engine
    from lablib.measure.sweep import measured_traces
    from lablib.measure.workload import distinct_prompts

    reps = whole(reps, "reps", "a whole number of measured requests each way, at least 1")
    prompt_tokens = whole(prompt_tokens, "prompt_tokens", "a whole number of tokens, at least 1")
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, reps + 1)
    rows = []
    # the server first: a stopped one is named before the twin is loaded and measured (seconds); its http
    # engine, idle meanwhile (no connection open), measures after the twin
    e = server.engine(model)
    try:
        twin_name = SERVERS[server.name].twin
        twin = load_engine(twin_name, model, **twin_load(server, twin_name, prompt_tokens + max_new_tokens))
        # each way: one warm-up on the prompt no measured request uses, then one distinct prompt per
        # repetition (on purpose: no request may reuse another's prefix, in process or on the server)
        warm, measured = [prompts[-1]], prompts[:reps]
        try:
            for i, t in enumerate(measured_traces(twin, measured, cfg, warmup=warm)):
                rows.append(dict(where="in-process", engine=twin.name, rep=i, **_times(t)))
        finally:
            twin.close()
        for i, t in enumerate(measured_traces(e, measured, cfg, warmup=warm)):
            rows.append(
                dict(
                    where="http",
                    engine=f"{server.name} server",
                    rep=i,
                    **_times(t),
                    count_method=t.count_method,
                    chunks=len(t.chunk_arrivals),
                )
            )
    finally:
        e.close()
    return pd.DataFrame(rows)


def _times(t) -> dict:
    return {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s, "e2e_s": t.e2e_s, "output_tokens": t.output_tokens}


def http_cost(model, servers, prompt_tokens: int = 32, max_new_tokens: int = 8, reps: int = 2):
    """:func:`in_process_vs_server` for each server of ``servers``, one row per server: its in-process twin
    (``in_process``), threads, the median TTFT and TPOT each way (``ttft_in_process_s``, ``ttft_http_s``,
    ``tpot_in_process_s``, ``tpot_http_s``), what the server adds (``ttft_added_s``, ``tpot_added_s``: HTTP
    minus in-process; negative where the server's engine is faster than the twin's loop), how the HTTP
    tokens were counted (``count_method``) and ``tokens_per_chunk_http`` (median output tokens per content
    event: above 1 the server merged tokens into one event, as vLLM's API process does when its engine
    made several while the API process was busy; those tokens reach the client together, so the HTTP
    TPOT is then below the engine's step, 0 when a whole answer came in one event). The request rows are
    in the result's ``attrs["rows"]``. Every server (a RunningServer still running), every argument and the
    request's fit in each server's context are checked before the first twin is loaded."""
    import pandas as pd

    from lablib.checks import whole

    # every server and argument checked before the first twin is loaded and measured (seconds each): a
    # stopped server by its own message (RunningServer.engine's), a request longer than a server's context
    servers = _servers(servers)
    whole(reps, "reps", "a whole number of measured requests each way, at least 1")
    prompt_tokens = whole(prompt_tokens, "prompt_tokens", "a whole number of tokens, at least 1")
    GenerationConfig(max_new_tokens=max_new_tokens)
    for srv in servers:
        e = srv.engine(model)
        try:
            e.check_context(prompt_tokens, max_new_tokens)
        finally:
            e.close()
    raw, table = [], []
    for srv in servers:
        df = in_process_vs_server(model, srv, prompt_tokens, max_new_tokens, reps).assign(server=srv.name)
        raw.append(df)
        local = df["where"] == "in-process"  # the other rows went over HTTP
        ip, http = df.loc[local, ["ttft_s", "tpot_s"]].median(), df.loc[~local, ["ttft_s", "tpot_s"]].median()
        table.append(
            {
                "server": srv.name,
                "in_process": df.loc[local, "engine"].iloc[0],
                "threads": srv.threads,
                "ttft_in_process_s": ip["ttft_s"],
                "ttft_http_s": http["ttft_s"],
                "ttft_added_s": http["ttft_s"] - ip["ttft_s"],
                "tpot_in_process_s": ip["tpot_s"],
                "tpot_http_s": http["tpot_s"],
                "tpot_added_s": http["tpot_s"] - ip["tpot_s"],
                "count_method": df.loc[~local, "count_method"].iloc[0],
                "tokens_per_chunk_http": (df.loc[~local, "output_tokens"] / df.loc[~local, "chunks"]).median(),
            }
        )
    out = pd.DataFrame(table)
    out.attrs["rows"] = pd.concat(raw, ignore_index=True) if raw else pd.DataFrame()
    return out


def _metrics_root(engine) -> str | None:
    """The engine's server root when it answers ``/metrics`` (vLLM; llama-server with --metrics), else None."""
    from lablib.engines.http.metrics import scrape
    from lablib.errors import LabError

    try:
        scrape(engine.root_url, only_view=True)
    except LabError:
        return None
    return engine.root_url


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
    metrics_interval_s: float = 0.1,
    arrival: str = "poisson",
    out=None,
):
    """A Poisson rate sweep on each server of ``servers`` (RunningServer objects, or one; ``arrival``: another
    process of :data:`lablib.measure.load.ARRIVALS`) at each of ``rates`` (requests/s: a list, or "0.5,1,2";
    every argument is checked before a request is sent); one row per (server, rate): output_tps, ttft
    p50/p95/p99, tpot p50 (and the requests without one: every token at one instant, ``decode_unseen_requests``;
    those whose first token came with others: ``first_bunched_requests``),
    e2e p50, goodput (requests/s meeting ``ttft_s``
    and ``tpot_s``) and its fraction, errors; and, from the server's own ``/metrics`` sampled every
    ``metrics_interval_s`` during the run (:class:`lablib.engines.http.metrics.MetricsSampler`; None for a
    server without it): running_max, waiting_max, kv_usage_max (0..1), preemptions; and the client's own headroom,
    as ``lablib bench`` prints it (:func:`lablib.measure.load.client_headroom_of`: a loop-lag probe on the loop that
    stamps the tokens): client_lag_p99_ms and client_near_limit (True: the run's ITL and TTFT p99 hold more than
    10 % of the client's own delay).

    The raw request rows are in the result's ``attrs["rows"]``, the server's samples (t_s on the lab's
    clock, metric, value, with the run's ``server`` and ``rate``) in ``attrs["server_rows"]``:
    :func:`one_run` picks one run of both for :func:`lablib.plots.server_timeline`.

    ``out`` (.jsonl or .parquet, checked before the first request): each request's row appended as it finishes,
    as ``lablib bench`` writes them (rows of one run share a ``run_id``), and each run's line of the table, with
    that ``run_id``, to ``<out>.runs.jsonl`` as the run ends: an error or a Ctrl-C later keeps the runs before it
    (and the requests of the run in flight that finished) on disk."""

    from lablib.checks import whole
    from lablib.engines.http.metrics import MetricsSampler, run_maxima
    from lablib.errors import LabError
    from lablib.measure.headroom import LoopLagProbe
    from lablib.measure.load import (
        MAX_REQUESTS,
        _check_max_duration,
        arrival_schedule,
        client_headroom_of,
        parse_rates,
        run_load,
        summarize,
    )
    from lablib.measure.workload import distinct_prompts
    from lablib.results.store import LOAD_SYNC_S, ResultsWriter, append_run
    from lablib.results.tables import check_targets

    # every argument checked before a request is sent (a bad rate was refused after the warm-up)
    servers = _servers(servers)
    rates = parse_rates(rates) if isinstance(rates, str) else list(rates)
    if not rates:
        raise LabError("rates is empty: expected one or more requests-per-second values, such as [0.5, 1, 2]")
    for r in rates:
        arrival_schedule(1, r, arrival, seed=seed)
    whole(requests, "requests", f"a whole number from 1 to {MAX_REQUESTS}", hi=MAX_REQUESTS)
    _check_max_duration(max_duration_s)
    check_targets(ttft_s, tpot_s)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, requests + 1)
    writer = ResultsWriter(out, sync_every_s=LOAD_SYNC_S) if out else None  # refused before any request
    table, raw, server_rows = [], [], []
    for srv in servers:
        e = srv.engine(model)
        try:
            e.generate(prompts[-1], cfg)  # warm-up on a prompt no measured request uses
            root = _metrics_root(e)
            for r in rates:
                sampler = None if root is None else MetricsSampler(root, metrics_interval_s, server=srv.name, rate=r)
                probe = LoopLagProbe()
                run_id = uuid.uuid4().hex[:12]
                rows = run_load(
                    e,
                    prompts[:-1],
                    "open",
                    rate=r,
                    arrival=arrival,
                    seed=seed,
                    cfg=cfg,
                    max_duration_s=max_duration_s,
                    server_metrics=sampler,
                    client_probe=probe,
                    on_row=writer.append if writer else None,
                    run_id=run_id,
                )
                raw += rows
                seen = sampler.deltas() if sampler is not None else {}
                if sampler is not None:
                    server_rows += sampler.rows()
                s = summarize(rows, ttft_s=ttft_s, tpot_s=tpot_s)
                head = client_headroom_of(probe, s.get("itl_p50_s"))
                lag = head.get("loop_lag_p99_s")
                table.append(
                    {
                        "server": srv.name,
                        "rate": r,
                        "output_tps": s["output_tps"],
                        "ttft_p50_s": s["ttft_p50_s"],
                        "ttft_p95_s": s["ttft_p95_s"],
                        "ttft_p99_s": s["ttft_p99_s"],
                        "tpot_p50_s": s["tpot_p50_s"],
                        "decode_unseen_requests": s["decode_unseen_requests"],
                        "first_bunched_requests": s["first_bunched_requests"],
                        "e2e_p50_s": s["e2e_p50_s"],
                        "goodput_rps": s["goodput_rps"],
                        "goodput_fraction": s["goodput_fraction"],
                        "errors": s["errors"],
                        **run_maxima(seen),
                        "client_lag_p99_ms": None if lag is None else lag * 1e3,
                        "client_near_limit": head.get("near_limit"),
                    }
                )
                if writer:
                    writer.sync()  # the run's rows made durable before its line is written
                    append_run(out, {**table[-1], "run_id": run_id})
        finally:
            try:
                if writer:
                    writer.sync()  # an interrupted run's finished rows too
            finally:
                e.close()
    from lablib.results.tables import table_with_rows

    return table_with_rows(table, raw, server_rows)


def one_run(table, server: str, rate: float | None = None):
    """One run of a :func:`rate_sweep_table`: ``(requests, samples)`` DataFrames, the request rows and the
    server's samples of ``server`` at ``rate`` (None: the highest rate swept), as
    :func:`lablib.plots.server_timeline` takes them. LabError when the table has no such run, or no
    samples of it (a server without ``/metrics``), and for a ``table`` that is no such DataFrame (a list, a
    table without its ``attrs``, which a file does not keep) or a ``server`` that is no name (a RunningServer)."""
    import pandas as pd

    from lablib.errors import LabError

    if not isinstance(table, pd.DataFrame) or not {"server", "rate"} <= set(table.columns):
        given = f"a DataFrame of columns {list(table.columns)}" if isinstance(table, pd.DataFrame) else repr(table)
        raise LabError(
            f"table={given[:200]}: expected the DataFrame rate_sweep_table returned (its columns server and rate, "
            "the request rows in its attrs): pass that table as it came"
        )
    if not isinstance(server, str):
        name = getattr(server, "name", None)
        shown = (
            f"<{name} at {server.base_url}>" if isinstance(name, str) and hasattr(server, "base_url") else repr(server)
        )
        raise LabError(
            f"server={shown}: expected a server's name as the table's server column gives it "
            f"({', '.join(sorted(map(str, set(table['server'])))) or 'none'}), such as srv.name"
        )
    if "rows" not in table.attrs:
        raise LabError(
            "this table carries no request rows (attrs['rows']): expected the DataFrame rate_sweep_table returned, "
            "as it came (a copy saved to a file and read back loses its attrs); run the sweep again"
        )
    rows = pd.DataFrame(table.attrs.get("rows", []))
    samples = pd.DataFrame(table.attrs.get("server_rows", []))
    have = sorted(set(table["server"])) if len(table) else []
    if server not in have:
        raise LabError(f"server={server!r}: this sweep has {', '.join(have) or 'no servers'}")
    if rate is None:
        rate = float(table.loc[table["server"] == server, "rate"].max())
    run = rows[(rows["server"] == server) & (rows["rate"] == rate)] if len(rows) else rows
    if run.empty:
        raise LabError(f"rate={rate!r}: {server} was swept at {sorted(table.loc[table['server'] == server, 'rate'])}")
    got = samples[(samples["server"] == server) & (samples["rate"] == rate)] if len(samples) else samples
    if got.empty:
        raise LabError(f"{server} at rate {rate}: no samples of its /metrics (the server has no /metrics endpoint)")
    return run.reset_index(drop=True), got.reset_index(drop=True)


def reference_rate_sweep(machine: str | None = None):
    """Lab 05's full rate sweep as measured on a real machine (``data/reference/serving-rates-<machine>.jsonl``, written
    by ``benchmarks/serving_reference.py``): the rows of :func:`rate_sweep_table` (server, rate, goodput, TTFT and
    TPOT percentiles, the server's maxima) with the sweep's settings (requests per rate, prompt and output tokens,
    the targets ``ttft_s`` and ``tpot_s``) and the machine (hostname, cpu_model, cores_logical, ram_bytes, and
    :mod:`lablib.results.reference`'s ``machine``); every machine's file, or the one named ``machine``. A
    DataFrame for :func:`lablib.plots.rate_sweep`. LabError when no such file is there."""
    from lablib.results.reference import reference_rows

    return reference_rows("serving-rates", machine)


def _counters(engine) -> dict | None:
    """The server's prefix-cache and prompt counters now (its /metrics), None without /metrics."""
    from lablib.engines.http.metrics import scrape, server_view
    from lablib.errors import LabError

    try:
        return server_view(scrape(engine.root_url, only_view=True))
    except LabError:
        return None


def _counters_after(engine, before: dict, prompt_tokens: int, timeout_s: float = 5.0) -> dict:
    """The counters once the server has counted this request's prompt (``prompt_tokens`` more; a server
    may record a step's counters just after it streamed the step's token), or at ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        after = _counters(engine) or {}
        grown = (after.get("prompt_tokens") or 0) - (before.get("prompt_tokens") or 0)
        if before.get("prompt_tokens") is None or grown >= prompt_tokens or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def _delta(after: dict, before: dict, key: str):
    a, b = after.get(key), before.get(key)
    return None if a is None or b is None else a - b


def prefix_cache_demo(
    model,
    servers,
    shared_tokens: int = 2 * VLLM_BLOCK_TOKENS,
    own_tokens: int = 16,
    max_new_tokens: int = 4,
):
    """A shared system prompt of ``shared_tokens`` and a short question of its own per request, sent
    three times to each server of ``servers`` (one RunningServer or several): the first request computes
    the whole prompt, the next ones may reuse the shared prefix if the server caches it.

    One row per request: ``server``, ``prefix_caching`` (the server's switch as started; None where it
    has none), ``request``, the labelled ``prefix`` ("cold" / "shared"), prompt_tokens, ttft_s,
    cached_tokens (as the server's usage reports it; None where it does not), and, where the server
    answers ``/metrics``, its own counters read before and after each request: ``prefix_cache_queries``
    (prompt tokens it looked up) and ``prefix_cache_hits`` (tokens it found cached; vLLM finds whole KV
    blocks, :data:`lablib.engines.servers.VLLM_BLOCK_TOKENS` tokens each), None without /metrics."""
    import pandas as pd

    from lablib.measure.workload import prompt_of_length

    servers = _servers(servers)
    shared = prompt_of_length(model, shared_tokens, offset=3000)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    rows = []
    for server in servers:
        e = server.engine(model)
        try:
            e.generate(prompt_of_length(model, own_tokens, offset=9000), cfg)  # warm-up, nothing shared
            for i in range(3):
                ids = shared + prompt_of_length(model, own_tokens, offset=5000 + 100 * i)
                before = _counters(e)
                t = e.generate(ids, cfg)
                after = _counters_after(e, before, len(ids)) if before is not None else {}
                rows.append(
                    {
                        "server": server.name,
                        "prefix_caching": (server.settings or {}).get("prefix_caching"),
                        "request": i,
                        "prefix": "cold" if i == 0 else "shared",
                        "prompt_tokens": t.prompt_tokens,
                        "ttft_s": t.ttft_s,
                        "cached_tokens": t.usage_cached_tokens,
                        "prefix_cache_queries": _delta(after, before or {}, "prefix_cache_queries"),
                        "prefix_cache_hits": _delta(after, before or {}, "prefix_cache_hits"),
                    }
                )
        finally:
            e.close()
    return pd.DataFrame(rows)
