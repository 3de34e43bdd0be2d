"""Load shapes: seeded arrival schedules, goodput and percentiles, and closed/open loops over HTTP
against the scripted SSE server (failed requests are rows, the run goes on, the time limit holds)."""

import itertools
import math
import time

import numpy as np
import pandas as pd
import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.measure.load import arrival_schedule, run_load, summarize
from lablib.results.schema import SUMMARY
from lablib.results.tables import goodput, run_summary
from sse_server import cmpl, sse

DONE = sse("[DONE]")


def test_schedule_is_seeded_with_the_mean_rate():
    a = arrival_schedule(4001, 20.0, "poisson", seed=1)
    assert a == arrival_schedule(4001, 20.0, "poisson", seed=1)
    assert a != arrival_schedule(4001, 20.0, "poisson", seed=2)
    assert a[0] == 0.0 and all(y >= x for x, y in itertools.pairwise(a))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential: CV 1


def test_constant_gamma_and_burst_schedules():
    assert arrival_schedule(4, 2.0, "constant") == [0.0, 0.5, 1.0, 1.5]
    assert arrival_schedule(3, math.inf) == [0.0, 0.0, 0.0]
    bursty = np.diff(arrival_schedule(4001, 10.0, "gamma", burstiness=0.25, seed=3))
    smooth = np.diff(arrival_schedule(4001, 10.0, "gamma", burstiness=4.0, seed=3))
    assert bursty.mean() == pytest.approx(0.1, rel=0.1) and smooth.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)  # CV = 1/sqrt(shape)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.1)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"n": 0, "rate": 1.0}, "requests=0"),
        ({"n": 3, "rate": 0}, "rate=0"),
        ({"n": 3, "rate": 1.0, "arrival": "zipf"}, "arrival='zipf'"),
        ({"n": 3, "rate": 1.0, "arrival": "gamma", "burstiness": 0}, "burstiness=0"),
    ],
)
def test_schedule_refuses_bad_arguments(kw, msg):
    with pytest.raises(LabError, match=msg):
        arrival_schedule(**kw)


def rows_for_goodput():
    # four requests: made-up seconds, checkable by hand
    return [
        {
            "ttft_s": 0.1,
            "tpot_s": 0.02,
            "e2e_s": 0.5,
            "t_submit": 0.0,
            "t_last_token": 0.5,
            "output_tokens": 10,
            "queue_s": 0.0,
            "itl_s": [0.02] * 9,
            "error": None,
        },
        {
            "ttft_s": 0.3,
            "tpot_s": 0.02,
            "e2e_s": 0.7,
            "t_submit": 0.5,
            "t_last_token": 1.2,
            "output_tokens": 10,
            "queue_s": 0.1,
            "itl_s": [0.02] * 9,
            "error": None,
        },
        {
            "ttft_s": 0.1,
            "tpot_s": 0.05,
            "e2e_s": 1.0,
            "t_submit": 1.0,
            "t_last_token": 2.0,
            "output_tokens": 10,
            "queue_s": 0.0,
            "itl_s": [0.05] * 9,
            "error": None,
        },
        {"ttft_s": None, "error": "HTTP 500", "t_submit": 1.5, "output_tokens": 0},
    ]


def test_goodput_counts_requests_meeting_every_target():
    rows = rows_for_goodput()
    assert goodput(rows, ttft_s=0.2)["good"] == 2
    assert goodput(rows, ttft_s=0.2, tpot_s=0.03)["good"] == 1
    g = goodput(rows, e2e_s=0.8)
    assert g["good"] == 2 and g["fraction"] == 0.5 and g["rps"] == pytest.approx(2 / 2.0)  # makespan 0..2.0
    assert goodput(rows)["good"] == 3  # no targets: every successful request


def test_summarize_percentiles_throughput_and_errors():
    s = summarize(rows_for_goodput(), ttft_s=0.2)
    assert s["requests"] == 4 and s["errors"] == 1 and s["makespan_s"] == 2.0 and s["output_tokens"] == 30
    assert s["output_tps"] == pytest.approx(30 / 2.0) and s["requests_per_s"] == pytest.approx(1.5)
    assert s["ttft_p50_s"] == pytest.approx(0.1) and s["ttft_p99_s"] == pytest.approx(
        np.percentile([0.1, 0.3, 0.1], 99)
    )
    assert s["itl_p90_s"] == pytest.approx(np.percentile([0.02] * 18 + [0.05] * 9, 90))
    assert s["goodput_rps"] == pytest.approx(1.0) and s["goodput_fraction"] == 0.5
    assert s["chunk_gaps_p50_s"] is None  # these rows have no chunks
    assert s["schedule_lag_max_s"] is None  # nor a schedule (a closed loop)
    # the one run summary: its names are the schema's, in its order, and a DataFrame gives the same numbers
    assert list(s) == list(SUMMARY) and s == run_summary(rows_for_goodput(), ttft_s=0.2)
    assert run_summary(pd.DataFrame(rows_for_goodput()), ttft_s=0.2) == s


# --- real loops over HTTP (scripted server) --------------------------------------------------------
@pytest.fixture
def engine(server, model):
    server.script, server.queue = [], []
    server.requests.clear()
    e = load_engine("http", model, base_url=server.base_url, server="vllm", read_timeout_s=5)
    yield e
    e.close()


OK = [
    sse(cmpl("a", [1])),
    0.02,
    sse(cmpl("b", [2], finish="length")),
    sse(cmpl(usage={"prompt_tokens": 2, "completion_tokens": 2})),
    DONE,
]


def test_closed_loop_keeps_failed_requests_as_rows(engine, server, tmp_path):
    from lablib.results.store import ResultsWriter, load_results

    server.script = OK
    server.queue = [OK, [("status", 500, "boom")]]  # the second request fails
    out = tmp_path / "load.jsonl"
    writer = ResultsWriter(out)
    rows = run_load(
        engine,
        [[5, 6]] * 5,
        "closed",
        concurrency=2,
        cfg=GenerationConfig(max_new_tokens=2),
        max_duration_s=30,
        on_row=writer.append,
    )
    assert len(rows) == 5 and len(server.requests) == 5
    errors = [r for r in rows if r["error"]]
    assert len(errors) == 1 and "HTTP 500" in errors[0]["error"] and errors[0]["engine"] == "http"
    ok = [r for r in rows if not r["error"]]
    assert all(r["output_tokens"] == 2 and r["output_count_ok"] and r["mode"] == "closed" for r in ok)
    assert summarize(rows)["chunk_gaps_p50_s"] >= 0.02  # the script sleeps 0.02 s between its two chunks
    assert sorted(r["request_index"] for r in rows) == [0, 1, 2, 3, 4]
    assert {r["client"] for r in rows} == {0, 1}
    df = load_results(out)
    assert len(df) == 5 and df["error"].notna().sum() == 1  # every finished row on disk
    assert summarize(rows)["errors"] == 1


def test_a_closed_loop_client_sends_its_next_request_after_what_already_arrived():
    """A client whose request ended sends its next one after the loop has run what was already ready (here
    another stream's token, read in the same poll): a send costs the loop about 0.4 ms (aiohttp's), which
    would otherwise sit unseen in that token's stamp, its ITL. The ended request's row is handed to the rows'
    thread in the same turn as the next send, so that thread cannot take the GIL between them. The order of
    what the loop ran, from the driver's own loop (an engine stand-in: this is the driver's scheduling; the
    real engine on the fast server is benchmarks/client_capacity.py's)."""
    import asyncio

    from lablib.measure.load import _closed

    ran = []

    class Engine:  # what _closed asks of an engine: agenerate
        async def agenerate(self, ids, cfg, t_submit=None, _checked=False, box=None):
            ran.append(f"send {ids[0]}")
            await asyncio.sleep(0)  # the stream
            if ids[0] == 0:  # request 0 ends as another stream's token is read
                asyncio.get_running_loop().call_soon(ran.append, "another stream's token stamped")
            return f"trace {ids[0]}"

    class Rows:
        def request(self, trace, manifest, error, labels):
            ran.append(f"row of {trace} ({labels['request_index']}, {error})")

    asyncio.run(_closed(Engine(), [[0], [1]], 1, [GenerationConfig()] * 2, 30.0, {}, {}, Rows()))
    assert ran == [
        "send 0",
        "another stream's token stamped",
        "row of trace 0 (0, None)",
        "send 1",
        "row of trace 1 (1, None)",
    ]


def test_a_run_ends_after_the_rows_it_handed_over(monkeypatch):
    """A request whose last token is read in the same loop turn as the run's time limit: its row reaches the
    rows' queue before the run says it ended (an interrupt then drains that queue: a row handed over after it
    would be lost). Found by a helper: the run ended one turn before the row's call_soon. An engine stand-in
    (the driver's scheduling): its loop busy 0.2 s from 0.05 s, past the last read (0.09 s) and the limit (0.1 s)."""
    import asyncio
    import threading
    import types

    from lablib.measure import load as L
    from lablib.results.trace import RequestTrace, now

    ran = []

    class Engine:
        def __init__(self):
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()

        def submit(self, coro):
            return asyncio.run_coroutine_threadsafe(coro, self.loop)

        async def agenerate(self, ids, cfg, t_submit=None, _checked=False, box=None):
            t = RequestTrace(prompt_tokens=1, t_submit=t_submit, t_start=now())
            asyncio.get_running_loop().call_later(0.05, time.sleep, 0.2)
            await asyncio.sleep(0.09)
            t.token(1, now())
            return t

    class Ended(threading.Event):
        def set(self):
            ran.append("run ended")
            super().set()

    handed = L._Rows.request

    def request(self, *a):
        ran.append("row handed over")
        handed(self, *a)

    monkeypatch.setattr(L, "threading", types.SimpleNamespace(Event=Ended))
    monkeypatch.setattr(L._Rows, "request", request)
    engine = Engine()
    try:
        rows = L._drive(engine, [[0]], "open", None, [0.0], [GenerationConfig()], 0.1, {}, {}, None)
    finally:
        engine.loop.call_soon_threadsafe(engine.loop.stop)
    assert [(r["request_index"], r["error"], r["output_tokens"]) for r in rows] == [(0, None, 1)]
    assert ran == ["row handed over", "run ended"]


def test_a_runs_rows_flatten_each_manifest_they_carry():
    """The rows' thread flattens a run's manifest once for all its rows; a row carrying another manifest gets
    that one's columns, and every row equals request_row's own (the columns made per row)."""
    from lablib.measure.load import _Rows, request_row
    from lablib.results.trace import RequestTrace

    def trace():
        t = RequestTrace(prompt_tokens=2, t_submit=0.0, t_start=0.0)
        t.token(7, 0.5)
        t.token(8, 0.75)
        return t

    a = {"engine": {"name": "http", "version": "1"}, "model": {"id": "m-a"}}
    b = {"engine": {"name": "http", "version": "2"}, "model": {"id": "m-b"}}
    rows_q = _Rows()
    items = [(trace(), m, None, {"mode": "closed", "request_index": i}) for i, m in enumerate([a, a, b, a])]
    rows = [rows_q.row(it) for it in items]
    assert [(r["model"], r["engine_version"]) for r in rows] == [("m-a", "1"), ("m-a", "1"), ("m-b", "2"), ("m-a", "1")]
    assert rows == [request_row(t, m, e, **lb) for t, m, e, lb in items]
    assert rows[0]["itl_s"] == [0.25] and rows[0]["token_ids"] == [7, 8]


def test_open_loop_with_a_cap_queues_in_the_lab(engine, server):
    server.script = OK
    rows = run_load(
        engine,
        [[5, 6]] * 4,
        "open",
        rate=math.inf,
        concurrency=1,
        cfg=GenerationConfig(max_new_tokens=2),
        max_duration_s=30,
    )
    assert len(rows) == 4 and not any(r["error"] for r in rows)
    rows.sort(key=lambda r: r["t_start"])
    # all arrive at once; with one request in flight each waits for those before it
    assert all(r["t_scheduled"] == 0.0 for r in rows)
    queue = [r["queue_s"] for r in rows]
    assert queue == sorted(queue) and queue[-1] > queue[0]
    assert all(r["t_start"] >= prev["t_last_token"] for prev, r in itertools.pairwise(rows))


def test_the_time_limit_cancels_requests_in_flight(engine, server):
    server.script = [sse(cmpl("a", [1])), "hang"]
    rows = run_load(
        engine,
        [[5]] * 3,
        "open",
        rate=math.inf,
        concurrency=2,
        cfg=GenerationConfig(max_new_tokens=4),
        max_duration_s=0.5,
    )
    assert len(rows) == 3 and all(r["error"] for r in rows)
    sent = [r for r in rows if "cancelled" in r["error"]]
    assert len(sent) == 2 and all(r["output_tokens"] == 1 for r in sent)  # what arrived is kept
    assert sum("not sent" in r["error"] for r in rows) == 1


def test_rate_sweep_runs_each_rate(engine, server):
    from lablib.measure.load import parse_rates, rate_sweep

    server.script = OK
    rows = rate_sweep(
        engine,
        [[5, 6]] * 3,
        parse_rates("50,inf"),
        concurrency=2,
        cfg=GenerationConfig(max_new_tokens=2),
        max_duration_s=30,
    )
    assert [r["rate"] for r in rows] == [50.0] * 3 + [math.inf] * 3
    assert [r["t_scheduled"] for r in rows if r["rate"] == math.inf] == [0.0] * 3
    with pytest.raises(LabError, match="rate 'fast'"):
        parse_rates("1,fast")


def test_a_failing_writer_stops_the_run(engine, server):
    server.script = [sse(cmpl("a", [1])), 0.3, sse(cmpl("b", [2], finish="length")), DONE]

    def full_disk(row):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        run_load(
            engine,
            [[5]] * 20,
            "closed",
            concurrency=1,
            cfg=GenerationConfig(max_new_tokens=2),
            max_duration_s=60,
            on_row=full_disk,
        )
    assert engine.generate([5], GenerationConfig(max_new_tokens=2)).output_tokens == 2  # the engine still works
    n = len(server.requests)
    time.sleep(0.5)
    assert n <= 3 and len(server.requests) == n  # of 20 requests at most 2 went out; none go out later


def test_run_load_refuses_bad_arguments(engine):
    with pytest.raises(LabError, match="closed loop needs concurrency"):
        run_load(engine, [[5]], "closed")
    with pytest.raises(LabError, match="open loop needs rate"):
        run_load(engine, [[5]], "open")
    with pytest.raises(LabError, match="max_duration_s"):
        run_load(engine, [[5]], "closed", concurrency=1, max_duration_s=math.inf)
    with pytest.raises(LabError, match="prompt 1 is empty"):
        run_load(engine, [[5], []], "closed", concurrency=1)
