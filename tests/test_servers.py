"""Real servers on the real default model, started and stopped by the lab, a few tokens each:
TTFT and TPOT present, output counts exact, the server gone after stop."""

import socket

import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.servers import free_port, start_server
from lablib.errors import LabError
from lablib.measure.load import run_load, summarize
from lablib.measure.workload import prompt_of_length
from stream_checks import decode_timed

pytestmark = pytest.mark.engine
N = 5


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def llama_cpp_python(model):
    srv = start_server("llama-cpp-python", model, threads=1, n_ctx=1024)
    yield srv
    srv.stop()


def check_trace(t, n_prompt):
    m = t.metrics()
    assert m["ttft_s"] > 0 and decode_timed(t) and m["e2e_s"] >= m["ttft_s"]
    assert t.output_tokens == N and t.output_count_ok and t.finish_reason == "length"
    assert sum(t.chunk_tokens) == N and t.count_method
    assert t.prompt_tokens == n_prompt
    return m


def test_llama_cpp_python_server_matches_the_in_process_engine(llama_cpp_python, model, llama):
    ids = prompt_of_length(model, 24)
    e = llama_cpp_python.engine(model)
    try:
        t = e.generate(ids, GenerationConfig(max_new_tokens=N))
        info = e.info()
    finally:
        e.close()
    check_trace(t, 24)
    auto = load_engine("http", model, base_url=llama_cpp_python.base_url)  # asks the server what it is
    assert auto.kind == "llama-cpp-python" and auto.server_version == "0.3.36" and auto.server_model == "lab-model"
    auto.close()
    assert t.count_method == "retokenized" and t.usage_completion_tokens is None  # no usage in its streams
    assert info.flags["fixed_length"] == "min_tokens" and info.version == "llama-cpp-python 0.3.36"
    ref = llama.generate(ids, GenerationConfig(max_new_tokens=N))
    assert t.text == llama.detokenize(ref.token_ids)  # greedy: the same text in-process and over HTTP
    # the same attention kernel as the in-process engine (llama-cpp-python's default: flash attention off), as the
    # server's log says, and so its twin's (lab 05)
    from lablib.studies.serving import twin_load

    assert llama_cpp_python.settings["flash_attn"] is False and llama.info().flags["flash_attn"] == "off"
    assert twin_load(llama_cpp_python, "llama.cpp", 40)["flash_attn"] is False


SHORT = [{"role": "user", "content": "What is 2+2? Answer with one number."}]  # the model stops early


def check_fixed_length(e, n=10):
    """Until EOS the short question ends early; fixed-length gives exactly n tokens."""
    free = e.generate([], GenerationConfig(max_new_tokens=n, ignore_eos=False), messages=SHORT)
    fixed = e.generate([], GenerationConfig(max_new_tokens=n), messages=SHORT)
    assert free.finish_reason == "stop" and free.output_tokens < n
    assert fixed.output_tokens == n and fixed.output_count_ok and fixed.finish_reason == "length"
    return free, fixed


def test_llama_cpp_python_server_fixed_length(llama_cpp_python, model):
    e = llama_cpp_python.engine(model, api="chat")
    try:
        check_fixed_length(e)
    finally:
        e.close()


def test_closed_loop_on_llama_cpp_python_server(llama_cpp_python, model):
    e = llama_cpp_python.engine(model)
    prompts = [prompt_of_length(model, 16, offset=100 * i) for i in range(3)]
    try:
        rows = run_load(e, prompts, "closed", concurrency=2, cfg=GenerationConfig(max_new_tokens=3), max_duration_s=120)
    finally:
        e.close()
    assert len(rows) == 3 and not any(r["error"] for r in rows)
    assert all(r["output_tokens"] == 3 and r["server"] == "llama-cpp-python" for r in rows)
    # the device from llama.cpp's weight buffers in its log (CPU_Mapped here), the threads it was started with
    from lablib.machine.identity import hardware_info

    assert {(r["device"], r["server_device"]) for r in rows} == {("cpu", f"{hardware_info()['cpu_model']}, 1 thread")}
    s = summarize(rows)
    assert s["output_tps"] > 0 and s["ttft_p50_s"] is not None and s["errors"] == 0


def test_mlx_server_chat_and_completions(model):
    with start_server("mlx", model) as srv:
        auto = load_engine("http", model, base_url=srv.base_url)
        assert auto.kind == "mlx" and auto.server_model == "default_model"
        auto.close()
        ids = prompt_of_length(model, 12)
        for api in ("completions", "chat"):
            e = srv.engine(model, api=api)
            try:
                t = e.generate(ids, GenerationConfig(max_new_tokens=N))
            finally:
                e.close()
            n_prompt = (
                12
                if api == "completions"
                else len(e.apply_chat_template([{"role": "user", "content": e.detokenize(ids)}]))
            )
            check_trace(t, n_prompt)
            # mlx_lm.server reports usage when asked: the server counted what the lab counted
            assert t.usage_completion_tokens == N and t.usage_mismatch is False and t.prompt_mismatch is False
        e = srv.engine(model, api="chat")
        try:
            _, fixed = check_fixed_length(e, 8)  # logit_bias against EOS
        finally:
            e.close()
        assert fixed.usage_completion_tokens == 8
    assert srv.proc.returncode is not None and _port_closed(srv.port)


def test_transformers_serve_role_chunk_is_not_the_first_token(model):
    with start_server("transformers", model, threads=1) as srv:
        e = srv.engine(model, api="chat")
        try:
            t = e.generate([], GenerationConfig(max_new_tokens=4), messages=SHORT)
        finally:
            e.close()
    # the role chunk comes before prefill: TTFT is the first content, and 4 content tokens arrived
    assert t.output_tokens == 4 and t.output_count_ok and t.usage_completion_tokens == 4
    assert t.t_tokens[0] == t.chunk_arrivals[0] and t.ttft_s > 0 and decode_timed(t)
    assert t.prompt_mismatch is False and t.server == "transformers"


def test_start_server_refuses_what_cannot_run(model):
    with pytest.raises(LabError, match="one request at a time"):
        start_server("llama-cpp-python", model, parallel=2)
    with pytest.raises(LabError, match="unknown server 'ollama'"):
        start_server("ollama", model)
    with pytest.raises(LabError, match="port=0"):
        start_server("mlx", model, port=0)
    assert _port_closed(free_port())


def test_free_port_never_gives_one_process_the_same_port_twice():
    """Two servers started at once from two threads (lab 05's vLLM pair) could be given the same port, the OS handing
    it out again once the first probe closed it; the second found it in use and lab 05 stopped (a fresh clone's CI).
    Ports from free_port in one process are distinct, from any thread."""
    from concurrent.futures import ThreadPoolExecutor

    from lablib.engines.servers.process import free_port

    with ThreadPoolExecutor(4) as pool:
        ports = list(pool.map(lambda _: free_port(), range(400)))
    assert len(set(ports)) == 400 and all(1024 <= p <= 65535 for p in ports)
