"""The HTTP engine against a scripted SSE server (a protocol fixture on 127.0.0.1): stream edge
cases give the right metrics, or one clear error that keeps what arrived."""

import sys

import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.http import HTTPEngineError, parse_chunk
from lablib.engines.http.sse import SSEParser
from sse_server import chat, cmpl, sse

DONE = sse("[DONE]")


# --- the SSE parser ------------------------------------------------------------------------
def feed_all(parts):
    p = SSEParser()
    out = []
    for part in parts:
        out += [(e.event, e.data) for e in p.feed(part)]
    return out, p


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_sse_line_ends(sep):
    raw = (
        b"data: one"
        + sep
        + b"data: two"
        + sep
        + sep
        + b": ping"
        + sep
        + sep
        + b"event: error"
        + sep
        + b"data: {}"
        + sep
        + sep
    )
    events, p = feed_all([raw])
    assert events == [("message", "one\ntwo"), ("error", "{}")]
    assert p.comments == 1
    # byte by byte: every split point, a \r\n split between reads included
    events, _ = feed_all([raw[i : i + 1] for i in range(len(raw))])
    assert events == [("message", "one\ntwo"), ("error", "{}")]


def test_sse_fields_bom_utf8_and_leftovers():
    raw = "\ufeffid: 7\nretry: 300\ndata:no-space\ndata\nunknown: x\n\ndata: é€\n\ndata: cut".encode()
    cut = raw.index("€".encode()) + 1  # a UTF-8 character split across reads
    events, p = feed_all([raw[:cut], raw[cut:]])
    assert events == [("message", "no-space\n"), ("message", "é€")]
    assert p.last_id == "7"
    assert p.close() is True  # the unfinished last event is discarded and reported


def test_sse_empty_event_is_not_dispatched():
    events, p = feed_all([b"event: x\n\n\n\ndata: a\n\n"])
    assert events == [("message", "a")]
    assert p.events == 1


def test_parse_chunk_reads_chat_completions_and_native():
    c = parse_chunk(chat(role="assistant"), "chat")
    assert c["text"] == "" and c["logprob_ids"] is None
    c = parse_chunk({"choices": [{"delta": {"reasoning_content": "hm"}, "finish_reason": None}]}, "chat")
    assert c["text"] == "hm"
    c = parse_chunk(cmpl("ab", logprob_ids=[5, 6]), "completions")
    assert c["text"] == "ab" and c["logprob_ids"] == [5, 6]
    c = parse_chunk(
        {
            "content": "x",
            "tokens": [9],
            "stop": True,
            "stop_type": "limit",
            "tokens_predicted": 3,
            "tokens_evaluated": 4,
            "tokens_cached": 0,
            "timings": {"prompt_ms": 2.0},
        },
        "native",
    )
    assert c["ids"] == [9] and c["finish_reason"] == "length" and c["usage"]["completion_tokens"] == 3


# --- the engine on scripted streams ------------------------------------------------------------
@pytest.fixture
def engine(server, model):
    server.script = []
    server.requests.clear()
    e = load_engine("http", model, base_url=server.base_url, server="openai", read_timeout_s=5)
    yield e
    e.close()


def test_logprob_entries_count_multi_token_chunks(engine, server):
    server.script = [
        sse(cmpl("A", [11])),
        sse(cmpl("BCD", [12, 13, 14])),
        sse(cmpl("E", [15], finish="length")),
        sse(cmpl(usage={"prompt_tokens": 3, "completion_tokens": 5})),
        DONE,
    ]
    t = engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=5))
    assert t.output_tokens == 5 and t.token_ids == [11, 12, 13, 14, 15]
    assert t.chunk_tokens == [1, 3, 1] and t.count_method == "logprobs"
    assert t.t_tokens[1] == t.t_tokens[2] == t.t_tokens[3] == t.chunk_arrivals[1]  # k tokens, one arrival
    assert len(t.chunk_gaps_s) == 2 and len(t.itl_s) == 4
    assert t.usage_mismatch is False and t.prompt_mismatch is False and t.output_count_ok
    assert t.text == "ABCDE" and t.finish_reason == "length"
    m = t.metrics()
    assert m["chunks"] == 3 and m["count_method"] == "logprobs"
    # the scripted chunks come at once: in one read (one stamp: no decode seen, no TPOT) or in more (a TPOT)
    assert (m["tpot_s"] is None) == m["decode_unseen"] == (len(set(t.t_tokens)) == 1)
    assert m["first_arrival_tokens"] == sum(x == t.t_tokens[0] for x in t.t_tokens) >= 1  # 5 when in one read


def test_cumulative_usage_per_chunk_counts_exactly(server, model):
    e = load_engine("http", model, base_url=server.base_url, server="vllm")
    u = [{"prompt_tokens": 2, "completion_tokens": n} for n in (1, 3, 4)]
    server.script = [
        sse(cmpl("a", usage=u[0])),
        sse(cmpl("bcd", usage=u[1])),
        sse(cmpl("e", finish="length", usage=u[2])),
        sse(cmpl(usage=u[2])),
        DONE,
    ]
    try:
        t = e.generate([5, 6], GenerationConfig(max_new_tokens=4))
    finally:
        e.close()
    assert t.chunk_tokens == [1, 2, 1] and t.count_method == "usage" and t.output_tokens == 4
    assert t.usage_mismatch is False and t.output_count_ok
    body = server.requests[-1][2]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_role_first_chunk_is_not_the_first_token(server, model):
    e = load_engine("http", model, base_url=server.base_url, server="openai", api="chat")
    server.script = [sse(chat(role="assistant")), 0.3, sse(chat("Hi")), sse(chat(" there", finish="stop")), DONE]
    try:
        t = e.generate(
            [], GenerationConfig(max_new_tokens=8, ignore_eos=False), messages=[{"role": "user", "content": "Hello"}]
        )
    finally:
        e.close()
    assert t.ttft_s >= 0.3  # the role chunk came 0.3 s before any content
    assert t.chunk_tokens == [1, 1] and t.count_method == "retokenized" and t.text == "Hi there"
    assert t.prompt_tokens == len(e.apply_chat_template([{"role": "user", "content": "Hello"}]))
    path, _, body = server.requests[-1]
    assert path == "/v1/chat/completions" and body["messages"][0]["content"] == "Hello"


def test_usage_only_last_chunk_is_checked_not_counted(engine, server):
    server.script = [
        sse(cmpl("x", [1])),
        sse(cmpl("y", [2], finish="length")),
        sse(cmpl(usage={"prompt_tokens": 2, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 1}})),
        DONE,
    ]
    t = engine.generate([5, 6], GenerationConfig(max_new_tokens=2))
    assert t.output_tokens == 2 and t.usage_completion_tokens == 3
    assert t.usage_mismatch is True  # the server says 3, the stream carried 2
    assert t.output_count_ok is False  # flagged: the counts disagree
    assert t.cached_tokens == 1 and t.usage_cached_tokens == 1


def test_crlf_framing_and_pings(engine, server):
    server.script = [
        b": ping\r\n\r\n",
        sse(cmpl("a", [1]), "\r\n"),
        b":keepalive\r\n\r\n",
        sse(cmpl("b", [2], finish="length"), "\r\n"),
        sse("[DONE]", "\r\n"),
    ]
    t = engine.generate([5], GenerationConfig(max_new_tokens=2))
    assert t.token_ids == [1, 2] and t.pings == 2


def test_json_split_across_reads(engine, server):
    raw = sse(cmpl("hello", [7]))
    server.script = [raw[:17], 0.1, raw[17:], sse(cmpl("!", [8], finish="length")), DONE]
    t = engine.generate([5], GenerationConfig(max_new_tokens=2))
    assert t.token_ids == [7, 8] and t.reads >= 2


def test_several_events_in_one_write_share_one_arrival(engine, server):
    server.script = [
        sse(cmpl("a", [1])) + sse(cmpl("b", [2])) + sse(cmpl("c", [3])),
        0.05,
        sse(cmpl("d", [4], finish="length")),
        DONE,
    ]
    t = engine.generate([5], GenerationConfig(max_new_tokens=4))
    assert t.max_events_per_read >= 3
    assert t.t_tokens[0] == t.t_tokens[1] == t.t_tokens[2] < t.t_tokens[3]
    assert t.chunk_tokens == [1, 1, 1, 1]


def test_error_event_is_one_clear_error_with_what_arrived(engine, server):
    server.script = [sse(cmpl("a", [1])), b'event: error\ndata: {"error": {"message": "slot crashed"}}\n\n']
    with pytest.raises(HTTPEngineError, match="slot crashed") as e:
        engine.generate([5], GenerationConfig(max_new_tokens=4))
    assert e.value.trace.output_tokens == 1 and "slot crashed" in e.value.trace.error


def test_disconnect_mid_stream_keeps_the_tokens(engine, server):
    server.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2])), 0.05, "close"]
    with pytest.raises(HTTPEngineError, match="after 2 tokens") as e:
        engine.generate([5], GenerationConfig(max_new_tokens=4))
    assert e.value.trace.token_ids == [1, 2]


def test_stream_without_end_marker_is_an_error(engine, server):
    server.script = [sse(cmpl("a", [1]))]  # then a clean end of body, no [DONE], no finish_reason
    with pytest.raises(HTTPEngineError, match="ended before its end"):
        engine.generate([5], GenerationConfig(max_new_tokens=4))


@pytest.mark.parametrize("status,advice", [(429, "lower the rate"), (500, "read its log")])
def test_http_error_status(engine, server, status, advice):
    server.script = [("status", status, "busy" if status == 429 else "boom")]
    with pytest.raises(HTTPEngineError, match=advice) as e:
        engine.generate([5], GenerationConfig(max_new_tokens=4))
    assert e.value.status == status and f"HTTP {status}" in str(e.value)


def test_a_json_answer_instead_of_a_stream_is_one_clear_error(engine, server):
    server.script = [("json", 200, '{"error": "streaming is off"}')]
    with pytest.raises(HTTPEngineError, match="answered with JSON, not an event stream.*streaming is off"):
        engine.generate([5], GenerationConfig(max_new_tokens=4))


def test_a_server_that_never_answers_times_out(server, model):
    e = load_engine("http", model, base_url=server.base_url, server="openai", read_timeout_s=0.5)
    server.script = ["hang"]
    try:
        with pytest.raises(HTTPEngineError, match="read_timeout_s"):
            e.generate([5], GenerationConfig(max_new_tokens=4))
    finally:
        e.close()


def test_no_server_is_one_clear_error(model):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(Exception, match="no OpenAI-compatible server answers") as e:
        load_engine("http", model, base_url=f"http://127.0.0.1:{port}/v1")
    assert type(e.value).__name__ == "LabError"


def test_retokenized_counts_and_one_per_chunk_fallback(server, model, engine):
    text = ["The", " capital", " of France", " is Paris"]
    script = [sse(cmpl(x)) for x in text[:-1]] + [sse(cmpl(text[-1], finish="length")), DONE]
    server.script = script
    t = engine.generate([5], GenerationConfig(max_new_tokens=6))
    assert t.count_method == "retokenized"
    assert t.output_tokens == len(engine.tokenize("".join(text))) == sum(t.chunk_tokens)
    assert t.chunk_tokens[2] == len(engine.tokenize(" of France"))
    bare = load_engine("http", model, base_url=server.base_url, server="vllm", tokenizer=False)
    try:
        t = bare.generate([5], GenerationConfig(max_new_tokens=6))
    finally:
        bare.close()
    assert t.count_method == "one_per_chunk" and t.output_tokens == 4 and not t.output_count_ok


def test_request_fields_per_server_kind(server, model, monkeypatch):
    monkeypatch.setenv("LABLIB_API_KEY", "sk-secret-123")
    server.props = {"build_info": "b9999-test", "default_generation_settings": {"n_ctx": 4096}}
    server.script = [
        sse(
            cmpl(
                "a",
                [1],
                finish="length",
            )
        ),
        sse(
            cmpl(
                usage={"prompt_tokens": 2, "completion_tokens": 1},
                timings={"prompt_ms": 20.0, "predicted_per_second": 50.0, "cache_n": 0},
            )
        ),
        DONE,
    ]
    try:
        e = load_engine("http", model, base_url=server.base_url)  # auto: /props says llama-server
        t = e.generate([5, 6], GenerationConfig(max_new_tokens=1))
    finally:
        server.props = None
    assert e.kind == "llama-server" and e.server_version == "b9999-test" and e.n_ctx == 4096
    path, headers, body = server.requests[-1]
    assert path == "/v1/completions"
    assert body["prompt"] == [5, 6] and body["ignore_eos"] is True and body["cache_prompt"] is False
    assert body["verbose"] is True and "logprobs" not in body and body["stream_options"] == {"include_usage": True}
    assert headers["Authorization"] == "Bearer sk-secret-123"
    assert t.server_prompt_s == 0.02 and t.http_overhead_s == pytest.approx(t.ttft_s - 0.02)
    assert t.server_decode_tps == 50.0 and t.cached_tokens == 0
    info = e.info().to_dict()
    assert "sk-secret" not in repr(info) and "sk-secret" not in repr(t.metrics())
    # a server the lab did not start says nothing of its device: unknown, not this client's cpu
    assert info["device"] == "unknown" and info["flags"]["server_device"] == "unknown"
    e.close()
    for kind, want in [
        ("llama-cpp-python", {"min_tokens": 4}),
        ("mlx", {"logit_bias": {"2": -100}}),
        ("vllm", {"ignore_eos": True, "min_tokens": 4}),
        ("transformers", {"generation_config": '{"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": false}'}),
    ]:
        server.script = [sse(cmpl("a", finish="length")), DONE]
        e = load_engine("http", model, base_url=server.base_url, server=kind)
        try:
            t = e.generate([5, 6], GenerationConfig(max_new_tokens=4))
        finally:
            e.close()
        assert t.output_tokens == 1 and t.output_count_ok is False  # asked 4, got 1: flagged
        body = server.requests[-1][2]
        for k, v in want.items():
            if k == "logit_bias":
                assert set(body[k]) >= set(v) and all(b == -100 for b in body[k].values())
            else:
                assert body[k] == v, (kind, k, body)
        assert isinstance(body["prompt"], list if kind == "vllm" else str)


def test_native_llama_server_stream_carries_token_ids(server, model):
    server.props = {"build_info": "b1-test"}
    server.script = [
        sse({"content": "a", "tokens": [10], "stop": False}),
        sse({"content": "bc", "tokens": [11, 12], "stop": False}),
        sse(
            {
                "content": "",
                "tokens": [],
                "stop": True,
                "stop_type": "limit",
                "tokens_predicted": 3,
                "tokens_evaluated": 2,
                "tokens_cached": 0,
                "timings": {"prompt_ms": 5.0},
            }
        ),
    ]
    try:
        e = load_engine("http", model, base_url=server.base_url, api="native")
        t = e.generate([5, 6], GenerationConfig(max_new_tokens=3))
        e.close()
    finally:
        server.props = None
    path, _, body = server.requests[-1]
    assert path == "/completion" and body["prompt"] == [5, 6] and body["n_predict"] == 3
    assert t.token_ids == [10, 11, 12] and t.count_method == "token_ids" and t.chunk_tokens == [1, 2]
    assert t.usage_mismatch is False and t.output_count_ok and t.finish_reason == "length"


def test_bad_arguments_are_one_clear_error(server, model):
    from lablib.errors import LabError

    with pytest.raises(LabError, match="the http engine needs base_url"):
        load_engine("http", model)
    with pytest.raises(LabError, match="api='rest'"):
        load_engine("http", model, base_url=server.base_url, api="rest")
    with pytest.raises(LabError, match="expected an http"):
        load_engine("http", model, base_url="127.0.0.1:8080")
    with pytest.raises(LabError, match="llama-server's /completion"):
        load_engine("http", model, base_url=server.base_url, api="native", server="mlx")


def test_llama_servers_verbose_chunks_give_each_chunks_ids(server, model):
    """llama-server asked for `verbose` adds each partial chunk's native form (`__verbose`: its `tokens`,
    `stop` false); the final chunk's native form (`stop` true) holds no new token."""
    server.props = {"build_info": "b9999-test", "default_generation_settings": {"n_ctx": 4096}}

    def chunk(text, ids, stop=False, finish=None):
        obj = cmpl(text, finish=finish)
        obj["__verbose"] = {"content": text, "tokens": ids, "stop": stop}
        return sse(obj)

    server.script = [
        chunk("The", [504]),
        chunk(" sky", [6178]),
        chunk("", [504, 6178], stop=True, finish="length"),  # a final form listing all: not counted again
        sse(cmpl(usage={"prompt_tokens": 2, "completion_tokens": 2})),
        DONE,
    ]
    try:
        e = load_engine("http", model, base_url=server.base_url)
        t = e.generate([5, 6], GenerationConfig(max_new_tokens=2))
        e.close()
    finally:
        server.props = None
    assert t.count_method == "token_ids" and t.token_ids == [504, 6178] and t.chunk_tokens == [1, 1]
    assert t.usage_completion_tokens == 2 and t.output_count_ok


@pytest.mark.parametrize("event_loop", ["auto", "asyncio", "uvloop"])
def test_the_event_loop_that_stamps_the_streams_is_chosen_and_recorded(server, model, event_loop):
    """uvloop (installed with the serve extra where it has a build) or the standard library's loop: the same
    stream, the same tokens; the manifest names the loop that read it, with its version."""
    import uvloop

    e = load_engine("http", model, base_url=server.base_url, server="openai", event_loop=event_loop)
    server.script = [sse(cmpl("A", [11])), sse(cmpl("B", [12], finish="length")), DONE]
    try:
        t = e.generate([1, 2], GenerationConfig(max_new_tokens=2))
        flags = e.info().flags
        loop = e._loop
    finally:
        e.close()
    assert t.token_ids == [11, 12] and t.output_tokens == 2
    if event_loop == "asyncio":
        assert not isinstance(loop, uvloop.Loop)
        assert flags["event_loop"] == f"asyncio (Python {sys.version.split()[0]})"
    else:
        assert isinstance(loop, uvloop.Loop)
        assert flags["event_loop"] == f"uvloop {uvloop.__version__}"


def test_an_event_loop_that_is_missing_or_unknown_is_one_message(server, model, monkeypatch):
    from lablib.errors import LabError

    with pytest.raises(LabError, match=r"event_loop='trio': expected one of auto, uvloop, asyncio"):
        load_engine("http", model, base_url=server.base_url, server="openai", event_loop="trio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on Windows, where uvloop has no build
    with pytest.raises(LabError, match=r"event_loop='uvloop': the uvloop package is not installed"):
        load_engine("http", model, base_url=server.base_url, server="openai", event_loop="uvloop")
    e = load_engine("http", model, base_url=server.base_url, server="openai")  # auto: asyncio there
    try:
        assert e.event_loop == "asyncio"
    finally:
        e.close()
