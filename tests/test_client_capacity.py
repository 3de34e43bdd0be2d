"""The client-capacity benchmark's parts, with values that can be checked by hand and no timing thresholds:

- benchmarks/fast_server.py streams exactly N tokens per request, and the lab's client counts exactly N
  (``count_method`` token_ids) with the ids the server sent;
- the server's send times and the lab's stamps are on one clock: every token is stamped after it was sent,
  and every request arrives after the lab wrote its headers;
- lablib.measure.headroom reports a lag injected into the loop (a blocking sleep of known length);
- the benchmark's matching of stamps to send times, and its extraction of the lab's own read loop;
- the parse path's fast paths (sse.py without carriage returns, protocol.loads) read what the slow ones read.
"""

import asyncio
import json
import threading
import time

import pytest

from benchmark_modules import load as _load
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.http.protocol import loads
from lablib.engines.http.sse import SSEParser
from lablib.errors import LabError
from lablib.measure import headroom
from lablib.measure.headroom import LoopLagProbe, client_headroom
from lablib.measure.load import run_load

fast_server = _load("fast_server")
capacity = _load("client_capacity")


@pytest.fixture(scope="module")
def paced():
    with fast_server.FastServer(itl_s=0.002) as srv:
        yield srv


def _engine(model, srv):
    return load_engine("http", model, base_url=srv.base_url, server="vllm")


def _tag(row) -> int:
    return int(capacity.TAG.match(row["text"]).group(1))


def test_the_server_sends_exactly_n_tokens_and_the_lab_counts_them_exactly(model, paced):
    n, c, requests = 25, 4, 8
    e = _engine(model, paced)
    try:
        paced.sendlog(clear=True)
        prompts = [[1000 + i, 7, 7] for i in range(requests)]
        rows = run_load(e, prompts, "closed", concurrency=c, cfg=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    finally:
        e.close()
    log = {r["rid"]: r for r in paced.sendlog(clear=True)}
    assert len(rows) == requests and not any(r["error"] for r in rows)
    assert len(log) == requests
    for r in rows:
        assert r["output_tokens"] == n and r["count_method"] == "token_ids"
        assert r["token_ids"] == list(range(fast_server.TOKEN_ID0, fast_server.TOKEN_ID0 + n))  # the ids sent
        assert r["usage_completion_tokens"] == n and r["usage_mismatch"] is False and r["output_count_ok"]
        assert r["chunk_tokens"] == [1] * n
        sent = log[_tag(r)]
        assert sent["n"] == n and len(sent["t_send"]) == n
        assert r["text"] == sent["tag"] + " a" * (n - 1)


def test_every_token_is_stamped_after_the_server_sent_it(model, paced):
    """perf_counter is CLOCK_MONOTONIC in both processes (Linux): one time line, no offset. So the server
    receives each request after the lab wrote its headers, and sends each token before the lab stamps it."""
    clock = paced.clock_check()
    assert clock["ok"] and clock["server_clock"] == clock["client_clock"]
    e = _engine(model, paced)
    try:
        paced.sendlog(clear=True)
        rows = run_load(e, [[5, 6], [7, 8], [9, 10]], "closed", concurrency=3, cfg=GenerationConfig(max_new_tokens=12))
    finally:
        e.close()
    log = {r["rid"]: r for r in paced.sendlog(clear=True)}
    pairs = []
    for r in rows:
        sent = log[_tag(r)]
        arrivals = capacity.lab_arrivals(r)
        assert r["t_start"] < sent["t_recv"] < sent["t_send"][0]
        assert all(s < a for s, a in zip(sent["t_send"], arrivals, strict=True))
        assert arrivals[0] == r["t_first_token"] and arrivals[-1] == pytest.approx(r["t_last_token"], abs=1e-9)
        pairs.append((arrivals, sent["t_send"]))
    m = capacity.compare(pairs)
    assert m["clock_ok"] and m["tokens_matched"] == 36 and m["mismatched"] == 0


def test_compare_splits_the_added_itl_at_requests_edges():
    """A token sent within edge_s of any request's first or last token counts at the edges (the client's work
    for a request starting or ending runs then), the others in the middle; by hand, 10 ms steps, edge 15 ms."""
    a_sent = [0.00, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06]  # request A: tokens 1-6 after its first
    a_arr = [s + 0.001 for s in a_sent]
    a_arr[4] += 0.003  # token 4 (sent 0.04) stamped 3 ms late: +3 then -3 ms added at tokens 4 and 5
    b_sent = [0.032, 0.042]  # request B starts and ends in A's middle: its edges are 0.032 and 0.042
    b_arr = [s + 0.001 for s in b_sent]
    m = capacity.compare([(a_arr, a_sent), (b_arr, b_sent)], edge_s=0.015)
    # edges: 0.00 and 0.06 (A), 0.032 and 0.042 (B): A's tokens at 0.01 and 0.05-0.06 and 0.02-0.04 all lie within
    # 15 ms of one: every added ITL is at an edge here, none in the middle
    assert m["edge_tokens"] == 7 and m["added_itl_p99_mid_s"] is None
    assert m["added_itl_p99_edge_s"] == pytest.approx(m["added_itl_p99_s"])
    m = capacity.compare([(a_arr, a_sent)], edge_s=0.015)  # A alone: edges 0.00 and 0.06
    # within 15 ms of 0.00: the token at 0.01; of 0.06: 0.05 and 0.06; the middle: 0.02, 0.03, 0.04 (+3 ms)
    assert m["edge_tokens"] == 3
    assert m["added_itl_p99_mid_s"] == pytest.approx(0.003 - 0.02 * 0.003, abs=1e-9)  # numpy's p99 of 0, 0, 3
    assert m["added_itl_p99_edge_s"] == pytest.approx(0.0, abs=1e-9)  # 0, -3, 0 ms: p99 is 0
    none = capacity.compare([(a_arr, a_sent)])
    assert none["added_itl_p99_edge_s"] is None and none["added_itl_p99_mid_s"] is None


def test_unpaced_streams_are_exact_too(model):
    """--itl-s 0: every stream written as fast as the socket takes it (drained past 64 KiB)."""
    with fast_server.FastServer(itl_s=0.0) as srv:
        e = _engine(model, srv)
        try:
            rows = run_load(
                e, [[1, 2]] * 4, "closed", concurrency=2, cfg=GenerationConfig(max_new_tokens=3000, ignore_eos=True)
            )
        finally:
            e.close()
        stats = srv.stats()
    assert [r["output_tokens"] for r in rows] == [3000] * 4
    assert {r["count_method"] for r in rows} == {"token_ids"} and not any(r["error"] for r in rows)
    assert stats["requests"] == 4 and stats["tokens"] == 12000


@pytest.mark.parametrize("keep_alive", [None, False])
def test_a_vllm_server_gets_pooled_connections_and_one_per_request_when_asked(model, paced, keep_alive):
    """vLLM's kind keeps connections (as vllm bench's client does): 12 requests at concurrency 3 open at
    most 3 connections after the probe; keep_alive=False opens one per request. The row says which."""
    e = load_engine("http", model, base_url=paced.base_url, server="vllm", keep_alive=keep_alive)
    try:
        before = paced.stats()["connections"]
        rows = run_load(
            e, [[1000 + i] for i in range(12)], "closed", concurrency=3, cfg=GenerationConfig(max_new_tokens=4)
        )
    finally:
        e.close()
    opened = paced.stats()["connections"] - before - 1  # the stats GET above opened one of its own
    assert not any(r["error"] for r in rows) and [r["output_tokens"] for r in rows] == [4] * 12
    if keep_alive is None:
        assert 1 <= opened <= 3 and {r["connections"] for r in rows} == {"pooled"}
    else:
        assert opened == 12 and {r["connections"] for r in rows} == {"one per request"}


def test_max_connections_and_keep_alive_are_checked(model, paced):
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(LabError, match=r"max_connections=.*expected a whole number >= 1 or None"):
            load_engine("http", model, base_url=paced.base_url, max_connections=bad)
    with pytest.raises(LabError, match=r"keep_alive='yes': expected True, False or None"):
        load_engine("http", model, base_url=paced.base_url, keep_alive="yes")


def test_compare_matches_stamps_to_send_times():
    sends = [10.0, 10.010, 10.020, 10.030]
    arrivals = [10.001, 10.011, 10.023, 10.031]  # delays 1, 1, 3, 1 ms: added ITL 0, +2, -2 ms
    m = capacity.compare([(arrivals, sends), ([1.0], [0.5, 0.6])])
    assert m["mismatched"] == 1 and m["tokens_matched"] == 4 and m["clock_ok"]
    assert m["delay_min_s"] == pytest.approx(0.001)
    assert m["delay_p50_s"] == pytest.approx(0.001)
    assert m["added_itl_p50_s"] == pytest.approx(0.0, abs=1e-12)
    assert m["added_itl_p99_s"] == pytest.approx(0.002 - 0.02 * 0.002, abs=1e-9)  # numpy's linear p99 of -2, 0, 2
    assert capacity.compare([([0.9], [1.0])])["clock_ok"] is False  # stamped before it was sent: clocks differ
    row = {"t_first_token": 2.0, "itl_s": [0.5, 0.25]}
    assert capacity.lab_arrivals(row) == [2.0, 2.5, 2.75]


@pytest.mark.parametrize("per_read", [1, 7, 600])
def test_the_lab_read_loop_taken_from_the_engine_counts_every_token(per_read):
    """The parse section runs HTTPEngine.agenerate's own loop body (read with ast) on the server's bytes."""
    n = 600
    run = capacity.lab_parser(n)
    p = fast_server.stream_payloads(n)
    assert run([b"".join(p[i : i + per_read]) for i in range(0, n, per_read)]) == (n, "token_ids")


# --- the headroom probe ----------------------------------------------------------------------------
class _Loop:
    """An event loop on a thread of its own, with submit(coro) as the http engine has."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _wait_for(cond, bound_s=30.0):
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < bound_s:  # a liveness bound, not a timing assertion
        time.sleep(0.01)
    assert cond()


@pytest.mark.parametrize("method", ["timerfd", "sleep"])
def test_a_blocked_loop_reports_the_lag_injected(monkeypatch, method):
    """The loop is blocked for L = 0.1 s (a blocking sleep in a callback): every tick due in that time is
    read after it, so the largest lag is at least L - interval (the first tick due after the block began
    was due at most one interval after it), and the ticks due in its first half each lag by L/2 or more."""
    if method == "sleep":
        monkeypatch.setattr(headroom, "_timerfd", lambda: None)
    elif headroom._timerfd() is None:
        pytest.fail("no timerfd through libc on this Linux machine")
    block, interval = 0.1, 0.005
    lp = _Loop()
    try:
        probe = LoopLagProbe(interval).start(lp)
        _wait_for(lambda: len(probe.lags_s) >= 3)
        done = threading.Event()
        lp.loop.call_soon_threadsafe(lambda: (time.sleep(block), done.set()))
        assert done.wait(30)
        n0 = len(probe.lags_s)
        _wait_for(lambda: len(probe.lags_s) > n0 + 2)
        h = probe.stop()
    finally:
        lp.close()
    assert h["method"] == method and h["interval_s"] == interval
    assert h["loop_lag_max_s"] >= block - interval
    assert sum(x >= block / 2 for x in probe.lags_s) >= int(block / 2 / interval) - 1
    assert h["near_limit"] is True and h["samples"] == len(probe.lags_s)
    assert 0.0 <= h["loop_cpu_fraction"] <= 1.0  # the sleep held the loop's thread off the CPU


def test_client_headroom_verdict_from_known_lags():
    quiet = client_headroom([0.0001] * 100, 0.005, 0.2)
    assert quiet["loop_lag_p99_s"] == pytest.approx(0.0001) and quiet["near_limit"] is False
    late = client_headroom([0.0001] * 90 + [0.004] * 10, 0.005, 0.2)
    assert late["loop_lag_p99_s"] == pytest.approx(0.004) and late["near_limit"] is True
    assert late["loop_lag_max_s"] == 0.004 and late["samples"] == 100
    busy = client_headroom([0.0001] * 100, 0.005, 0.95)  # lags small, but the loop never waited
    assert busy["near_limit"] is True
    assert client_headroom([0.002] * 10, threshold_s=0.003)["near_limit"] is False
    none = client_headroom([])
    assert none["near_limit"] is None and none["loop_lag_p99_s"] is None and none["samples"] == 0
    json.dumps(late)  # a manifest's field: plain JSON


# --- the parse path's fast paths read what the general ones read -------------------------------------
def _events(raw: bytes, split: int | None = None):
    p = SSEParser()
    parts = [raw] if split is None else [raw[i : i + split] for i in range(0, len(raw), split)]
    return [(e.event, e.data, e.id, e.retry) for part in parts for e in p.feed(part)], p.lines, p.comments


def test_sse_without_carriage_returns_reads_as_with_them():
    raw = b"".join(fast_server.stream_payloads(5)) + b": ping\nevent: x\nid: 7\nretry: 10\ndata: a\ndata: b\n\n"
    lf = _events(raw)
    assert lf == _events(raw.replace(b"\n", b"\r\n")) == _events(raw.replace(b"\n", b"\r"))
    assert lf == _events(raw, split=1) == _events(raw, split=13)
    assert lf[0][-1] == ("x", "a\nb", "7", 10) and lf[2] == 1
    chunks = [json.loads(d) for _, d, *_ in lf[0][:6]]
    assert [len(c["choices"]) for c in chunks] == [1, 1, 1, 1, 1, 0]  # five tokens, then the usage-only chunk
    assert [c["choices"][0]["token_ids"] for c in chunks[:5]] == [[1000], [1001], [1002], [1003], [1004]]
    assert lf[0][6][1] == "[DONE]" and len(lf[0]) == 8


LOADS_SAME = ['{"a": [1, 2.5, null, "x"]}', ' {"a": 1}', '{"a": 1} ', '{"a": NaN}', "[1]", '"s"', "7"]
LOADS_SAME += [
    '{"a": 1, "a": 2}',
    "-0.0",
    "1e400",
    "-1e400",
    "5e-324",
    '"\\ud800"',
    '"\\ud83d\\ude00"',
    '{"a": Infinity}',
]
LOADS_SAME += ["18446744073709551615", "-9223372036854775808", '"caf\u00e9"', '{"x": "\\u0000"}', "0.1", "1E5"]


@pytest.fixture(params=["orjson", "stdlib"])
def reader(request, monkeypatch):
    """protocol.loads as the serve extra installs it (orjson) and without orjson (the C scanner alone)."""
    import lablib.engines.http.protocol as protocol

    if request.param == "orjson":
        assert protocol._fast is not None, "the serve extra's orjson is missing: pip install 'lablib[serve]'"
    else:
        monkeypatch.setattr(protocol, "_fast", None)
    return request.param


@pytest.mark.parametrize("text", LOADS_SAME)
def test_loads_is_json_loads(text, reader):
    """The same object as json.loads (orjson where installed, its refusals read by json.loads): JSON text
    compared, so NaN, -0.0 and infinities count too."""
    assert json.dumps(loads(text)) == json.dumps(json.loads(text))
    assert type(loads(text)) is type(json.loads(text))


def test_loads_reads_vllms_chunks_as_json_loads_does(reader):
    for raw in fast_server.stream_payloads(3):
        for line in raw.decode().splitlines():
            if line.startswith("data: {"):
                assert loads(line[6:]) == json.loads(line[6:])


@pytest.mark.parametrize(
    "text", ["", "{", '{"a": 1} x', '{"a": tru}', "[DONE]", "{'a': 1}", '"a\tb"', "[1, 2,]", "\ufeff{}", "01"]
)
def test_loads_fails_as_json_loads_fails(text, reader):
    with pytest.raises(ValueError) as mine:
        loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(mine.value) == str(theirs.value)


def test_a_probe_stopped_at_once_returns_at_once():
    lp = _Loop()
    try:
        t0 = time.monotonic()
        h = LoopLagProbe().start(lp).stop()
        assert time.monotonic() - t0 < 5  # a bound on a hang (stop waits at most 5 s), not a timing claim
        lp.submit(asyncio.sleep(0)).result(5)  # the loop has run what was queued before it stops
    finally:
        lp.close()
    assert h["samples"] == 0 or h["loop_lag_p99_s"] is not None


def test_a_load_run_freezes_the_heap_it_found_and_thaws_it_after(model, paced):
    """headroom.frozen_heap around run_load: while requests stream, the objects made before the run are in
    the permanent generation (no collection walks them); after the run none is; nested, the outer one keeps
    them frozen."""
    import gc

    from lablib.measure.headroom import frozen_heap

    e = _engine(model, paced)
    before = gc.get_freeze_count()
    seen = []
    try:
        prompts = [[1000 + i, 7, 7] for i in range(4)]
        cfg = GenerationConfig(max_new_tokens=5, ignore_eos=True)
        rows = run_load(
            e, prompts, "closed", concurrency=2, cfg=cfg, on_row=lambda r: seen.append(gc.get_freeze_count())
        )
        after = gc.get_freeze_count()
        with frozen_heap():
            outer = gc.get_freeze_count()
            run_load(e, prompts[:1], "closed", concurrency=1, cfg=cfg)
            still = gc.get_freeze_count()
    finally:
        e.close()
    assert before == 0 and after == 0 and gc.get_freeze_count() == 0
    assert len(rows) == 4 and not any(r["error"] for r in rows)
    assert len(seen) == 4 and min(seen) > 10_000  # the test process's modules, at least
    assert outer > 10_000 and still > 10_000  # the inner run left the outer freeze in place (not thawed: 0)
