"""llama.cpp's llama-server, built from the in-process engine's source and flags, on the default model:
greedy ids equal to the in-process engine's, token ids per chunk, server timings, parallel slots.

The server comes from ``lablib.build.llama.llama_tool`` (built in the library's CMake tree on first
use: minutes); a build failure fails these tests.
"""

import pytest

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import start_server
from lablib.measure.load import run_load
from lablib.measure.workload import prompt_of_length
from stream_checks import decode_timed

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def llama_server(model):
    srv = start_server("llama-server", model, parallel=2, threads=1, n_ctx=1024, timeout_s=900)
    yield srv
    srv.stop()


@pytest.mark.parametrize("api", ["native", "completions"])
def test_greedy_ids_equal_the_in_process_engine(llama_server, model, llama, api):
    ids = prompt_of_length(model, 24)
    cfg = GenerationConfig(max_new_tokens=6)
    e = llama_server.engine(model, api=api)
    try:
        t = e.generate(ids, cfg)
    finally:
        e.close()
    ref = llama.generate(ids, cfg)
    assert t.token_ids == ref.token_ids  # ids exact: per chunk from `tokens` (native, or `__verbose`)
    assert t.count_method == "token_ids"  # no logprobs asked: they cost the server a softmax per token
    assert t.usage_completion_tokens == 6 and t.usage_prompt_tokens == 24 and t.cached_tokens == 0
    assert t.server_prompt_s > 0 and t.server_decode_tps > 0 and t.http_overhead_s is not None
    assert t.ttft_s > 0 and decode_timed(t) and t.output_count_ok


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
