"""llama.cpp's llama-server, built from the in-process engine's source and flags, on the default model:
greedy ids equal to the in-process engine's, token ids per chunk, server timings, parallel slots.

The server comes from ``lablib.build.llama.llama_tool`` (built in the library's CMake tree on first
use: minutes); a build failure fails these tests.
"""

import pytest

import lablib
from lablib.engines.base import GenerationConfig
from lablib.engines.servers import start_server
from lablib.errors import LabError
from lablib.measure.load import run_load
from lablib.measure.workload import prompt_of_length
from stream_checks import decode_timed

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def llama_server(model):
    srv = start_server("llama-server", model, parallel=2, threads=1, n_ctx=1024, timeout_s=900)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llama_fa(model):
    """The in-process engine with llama-server's attention kernel: flash attention, which llama-server turns on for
    the CPU ("auto") and llama-cpp-python leaves off; one thread, as the server."""
    from lablib.engines import load_engine

    e = load_engine("llama.cpp", model, flash_attn=True, threads=1)
    yield e
    e.close()


@pytest.mark.parametrize("api", ["native", "completions"])
def test_greedy_ids_equal_the_in_process_engine(llama_server, model, llama_fa, api):
    ids = prompt_of_length(model, 24)
    cfg = GenerationConfig(max_new_tokens=6)
    e = llama_server.engine(model, api=api)
    try:
        t = e.generate(ids, cfg)
    finally:
        e.close()
    ref = llama_fa.generate(ids, cfg)
    assert llama_fa.info().flags["flash_attn"] == "on"
    assert t.token_ids == ref.token_ids  # ids exact: per chunk from `tokens` (native, or `__verbose`)
    assert t.count_method == "token_ids"  # no logprobs asked: they cost the server a softmax per token
    assert t.usage_completion_tokens == 6 and t.usage_prompt_tokens == 24 and t.cached_tokens == 0
    assert t.server_prompt_s > 0 and t.server_decode_tps > 0 and t.http_overhead_s is not None
    assert t.ttft_s > 0 and decode_timed(t) and t.output_count_ok


def test_the_same_attention_kernel_gives_llama_servers_texts(llama_server, model, llama_fa):
    """Lab 04, worked example 5: in process with flash attention, each of the eight questions' 24 greedy ids equal
    llama-server's, request by request; the same library on the same file computes the same numbers only with the
    same kernels (with it off, llama-cpp-python's default, 7 of the 8 parted within 32 tokens on the lab's Xeon)."""
    from lablib.studies.batch_invariance import QUESTIONS

    cfg = GenerationConfig(max_new_tokens=24)
    e = llama_server.engine(model)
    try:
        for q in QUESTIONS:
            ids = lablib.chat_ids(model, [{"role": "user", "content": q}])
            assert e.generate(ids, cfg).token_ids == llama_fa.generate(ids, cfg).token_ids, q
    finally:
        e.close()


def test_batch_invariance_of_a_server_through_its_own_slots(llama_server, model, llama_fa):
    """lablib.batch_invariance on a server: each question alone twice, then as 1 and 2 clients of a closed loop the
    server batches in its 2 slots; its ids come from the server's own tokens, the verdict names the server."""
    from lablib.studies.batch_invariance import QUESTIONS, batch_invariance

    e = llama_server.engine(model)
    try:
        r = batch_invariance(model, e, concurrency="1,2", max_new_tokens=8, prompts=QUESTIONS[:4], margins=llama_fa)
    finally:
        e.close()
    assert r.engine == "llama-server" and r.verdict.startswith("llama-server ")
    assert r.repeat_parted == [] and r.batched[1] == r.alone and len(r.table) == 8
    cfg = GenerationConfig(max_new_tokens=8)  # the server's ids alone: the in-process engine's with its kernel
    assert r.alone == [
        llama_fa.generate(lablib.chat_ids(model, [{"role": "user", "content": q}]), cfg).token_ids
        for q in QUESTIONS[:4]
    ]
    e = llama_server.engine(model)
    try:  # it batches at most its 2 slots: a run of 4 clients would be labelled 4 and measure 2
        with pytest.raises(LabError, match=r"concurrency 4 on llama-server with 2 slots \(parallel=2\)"):
            batch_invariance(model, e, concurrency="1,4", prompts=QUESTIONS[:4])
    finally:
        e.close()


def test_two_slots_serve_two_requests_together(llama_server, model):
    e = llama_server.engine(model)
    prompts = [prompt_of_length(model, 16, offset=50 * i) for i in range(2)]
    try:
        rows = run_load(e, prompts, "closed", concurrency=2, cfg=GenerationConfig(max_new_tokens=8), max_duration_s=120)
    finally:
        e.close()
    assert len(rows) == 2 and not any(r["error"] for r in rows)
    # the server's device, as its log states it: this machine's CPU (llama.cpp's name for it) and its 1 thread
    from lablib.machine.identity import hardware_info

    assert {r["device"] for r in rows} == {"cpu"} and llama_server.settings["device_source"] == "its log (llama.cpp)"
    # its attention kernel, as its log says (-fa auto: on for the CPU), and so its in-process twin's (lab 05)
    from lablib.studies.serving import twin_load

    assert llama_server.settings["flash_attn"] is True
    assert twin_load(llama_server, "llama.cpp", 40) == {"n_ctx": 2048, "threads": 1, "flash_attn": True}
    assert {r["server_device"] for r in rows} == {f"{hardware_info()['cpu_model']}, 1 thread"}
    a, b = sorted(rows, key=lambda r: r["t_first_token"])
    assert b["t_first_token"] < a["t_last_token"]  # the second started before the first ended


def test_requests_one_after_another_on_one_client_all_succeed(llama_server, model):
    """llama-server closes a connection after a streamed answer: a client that pooled it failed
    every second request ("Can not write request body") until each request got its own."""
    e = llama_server.engine(model)
    prompts = [prompt_of_length(model, 16, offset=40 * i) for i in range(4)]
    try:
        rows = run_load(e, prompts, "closed", concurrency=1, cfg=GenerationConfig(max_new_tokens=4), max_duration_s=120)
    finally:
        e.close()
    assert [r["error"] for r in rows] == [None] * 4
    assert [r["output_tokens"] for r in rows] == [4] * 4


def test_bench_through_a_proxy_that_buffers_says_the_decode_was_not_seen(llama_server, model, tmp_path, capsys):
    """llama-server behind a reverse proxy that buffers each answer whole (nginx's proxy_buffering, its default;
    lablib.engines.servers.proxy, a process of its own): every token arrives in one read, at one instant. The rows
    said TPOT 0 (an instant decode) and TTFT the whole answer's time, with nothing else said; tpot_p50_s was 0. Now
    each such row has no TPOT and says decode_unseen, the summary counts them, and bench says in a sentence what
    that means and what to do."""
    from lablib.cli import main
    from lablib.engines.servers import start_buffering_proxy
    from lablib.results.store import load_results

    proxy = start_buffering_proxy(llama_server)
    out = tmp_path / "proxied.jsonl"
    args = ["bench", "--base-url", proxy.base_url, "--server", "llama-server", "--concurrency", "1"]
    args += ["--requests", "3", "--prompt-tokens", "16", "--max-new-tokens", "8", "--warmup", "0", "--out", str(out)]
    try:
        rc = main(args)
    finally:
        assert proxy.stop() == 0 and llama_server.alive()  # the proxy stopped by its pid; the server runs on
    printed = capsys.readouterr()
    df = load_results(out)
    assert rc == 0 and len(df) == 3 and df["error"].isna().all(), list(df["error"])  # what failed, if one did
    assert (df["output_tokens"] == 8).all()
    assert (df["reads"] == 1).all() and df["decode_unseen"].all() and df["tpot_s"].isna().all()
    assert (df["ttft_s"] == df["e2e_s"]).all() and (df["first_arrival_tokens"] == 8).all()  # first came with last
    assert "tpot_p50_s=- " in printed.out and "decode_unseen_requests=3" in printed.out
    assert "lablib bench: 3 of 3 requests got all their tokens at one instant" in printed.err
    assert "proxy" in printed.err and "TTFT holds their decode" in printed.err


def test_a_proxy_that_sends_on_in_pieces_delivers_the_tokens_in_bursts(llama_server, model, tmp_path, capsys):
    """With chunk_bytes the proxy sends the answer on as each piece fills (nginx's 4-8 KiB buffers): the tokens come
    in bursts, fewer arrivals than tokens, but more than one (the decode is seen, coarsely: a TPOT), and the ids are
    the server's own, exactly. The first token waits for its piece to fill: TTFT holds the decode of the tokens that
    came with it and TPOT is low, and nothing said so; now bench counts such requests and says it."""
    from lablib.cli import main
    from lablib.engines.servers import start_buffering_proxy

    ids = prompt_of_length(model, 24)
    cfg = GenerationConfig(max_new_tokens=32)  # about 0.5 s of decode: a client late by less still sees bursts
    out = tmp_path / "pieces.jsonl"
    args = ["--server", "llama-server", "--concurrency", "1", "--requests", "3", "--prompt-tokens", "16"]
    args += ["--max-new-tokens", "32", "--warmup", "0", "--out", str(out)]
    proxy = start_buffering_proxy(llama_server, chunk_bytes=2048)
    try:
        assert proxy.settings["proxy"]["buffering"] == "answers sent on in pieces of 2048 bytes"
        e = proxy.engine(model)
        try:
            t = e.generate(ids, cfg)
        finally:
            e.close()
        assert main(["bench", "--base-url", proxy.base_url, *args]) == 0
    finally:
        proxy.stop()
    printed = capsys.readouterr()
    assert "first_bunched_requests=3" in printed.out and "decode_unseen_requests" not in printed.out
    assert "lablib bench: 3 of 3 requests got their first token together with others" in printed.err
    direct = llama_server.engine(model)
    try:
        ref = direct.generate(ids, cfg)
    finally:
        direct.close()
    assert t.token_ids == ref.token_ids and t.count_method == "token_ids"
    assert 1 < len(set(t.t_tokens)) < t.output_tokens and t.tpot_s > 0 and not t.decode_unseen
    # the first piece held the first token back until more came: they arrived with it, and TTFT holds their decode
    assert t.first_arrival_tokens > 1 and t.metrics()["first_arrival_tokens"] == t.first_arrival_tokens


@pytest.mark.parametrize("chunk_bytes", [0, -1, 2.5, "4k"])
def test_a_proxy_of_a_bad_piece_size_is_refused_before_it_starts(llama_server, chunk_bytes):
    from lablib.engines.servers import start_buffering_proxy
    from lablib.errors import LabError

    with pytest.raises(LabError, match=r"chunk_bytes.*expected a whole number of bytes, at least 1"):
        start_buffering_proxy(llama_server, chunk_bytes=chunk_bytes)


def test_a_proxy_whose_server_is_gone_says_so_in_one_line(model):
    """The server behind a proxy stopped: the proxy answered aiohttp's bare 500 ("Server got itself in trouble") and
    the lab said "the server failed the request: read its log", naming no log; the proxy's engine was made as if all
    were well. Now the proxy's engine is refused naming the server that is gone, and a request through the proxy
    gets a 502 that says it; a proxy asked of something that is not a started server is refused in words."""
    from lablib.engines import load_engine
    from lablib.engines.servers import start_buffering_proxy
    from lablib.errors import LabError

    srv = start_server("llama-server", model, threads=1, n_ctx=512)
    proxy = start_buffering_proxy(srv)
    try:
        srv.stop()
        with pytest.raises(
            LabError,
            match=r"behind a proxy \(whole answers\): the server behind it \(llama-server, pid \d+, .*\) is not running",
        ):
            proxy.engine(model)
        with pytest.raises(LabError) as e:  # the proxy's URL as any URL: its own answer, a 502 in words
            load_engine("http", model, base_url=proxy.base_url, server="llama-server").close()
        said = str(e.value)
        assert "502" in said and f"the server behind this proxy, {srv.base_url.removesuffix('/v1')}" in said
        assert "does not answer" in said and "Server got itself in trouble" not in said
    finally:
        proxy.stop()
        srv.stop()
    for wrong in (srv.base_url, None):
        with pytest.raises(LabError, match=r"expected a server the lab started, what start_server\(\.\.\.\) returns"):
            start_buffering_proxy(wrong)
