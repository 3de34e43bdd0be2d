"""The closed loop on real engines: serial queueing, real continuous batching, clear errors.

Tiny budgets (a few clients, 16-token prompts, 4-6 output tokens): the machine
has two shared cores.
"""

import pytest

from lablib.engines.base import GenerationConfig
from lablib.errors import ContextOverflowError, LabError
from lablib.measure.closed_loop import SCHEDULING_MODES, run_closed_loop
from lablib.measure.workload import prompt_of_length


@pytest.fixture(scope="module")
def llama_batched(model):
    """llama.cpp with a context of 3 parallel sequences (the session fixture holds one)."""
    from lablib.engines import load_engine

    e = load_engine("llama.cpp", model, n_ctx=512, n_seq_max=3)
    yield e
    e.close()


@pytest.fixture(params=["llama_batched", "hf", "mlx"])
def batched_engine(request):
    """Each real engine in turn, able to run 3 sequences at once."""
    return request.getfixturevalue(request.param)


def _prompts(model, n, length=16):
    return [prompt_of_length(model, length, offset=97 * i) for i in range(n)]


def test_modes():
    assert SCHEDULING_MODES == ("serial", "batched")


def test_serial_requests_wait_their_turn(engine, model):
    """C=3 clients submit 3 identical prompts at once: first come first served, one at a time."""
    cfg = GenerationConfig(max_new_tokens=4)
    ids = prompt_of_length(model, 16)
    run = run_closed_loop(engine, [ids] * 3, concurrency=3, mode="serial", cfg=cfg)
    traces = run.traces
    assert [t.request_index for t in traces] == [0, 1, 2]
    assert [t.client for t in traces] == [0, 1, 2]
    assert len({t.t_submit for t in traces}) == 1  # submitted at the same instant
    queue = [t.queue_s for t in traces]
    assert all(b > a for a, b in zip(queue, queue[1:])), queue
    for prev, cur in zip(traces, traces[1:]):
        assert cur.t_start >= prev.t_tokens[-1]  # starts only once the previous one is done
    for t in traces:
        assert t.output_tokens == 4 == len(t.token_ids) and t.finish_reason == "length"
        assert t.token_ids == traces[0].token_ids  # same prompt, greedy, no KV reuse
    assert run.stats.max_sequences_per_step == 1 and run.stats.mode == "serial"


def test_serial_closed_loop_resubmits_on_finish(llama, model):
    """C=2, R=4: each client sends its next request the moment its previous one finished."""
    calls = []
    traces = run_closed_loop(
        llama, _prompts(model, 4), 2, "serial", GenerationConfig(max_new_tokens=3), on_trace=calls.append
    ).traces
    assert [t.request_index for t in calls] == [0, 1, 2, 3]  # finish order = arrival order
    assert [t.client for t in traces] == [0, 1, 0, 1]
    assert traces[2].t_submit == traces[0].t_tokens[-1]
    assert traces[3].t_submit == traces[1].t_tokens[-1]
    assert all(t.output_tokens == 3 for t in traces)


def test_batched_mode_really_batches(batched_engine, model):
    """C=2 clients, R=3 requests: the engine's own state shows several sequences per step,
    the third request joins when one finished, and every request gets its exact budget."""
    cfg = GenerationConfig(max_new_tokens=4)
    prompts = _prompts(model, 3)
    calls = []
    run = run_closed_loop(batched_engine, prompts, 2, "batched", cfg, on_trace=calls.append)
    traces, stats = run.traces, run.stats
    assert stats.mode == "batched" and stats.concurrency == 2 and stats.engine == batched_engine.name
    assert stats.max_sequences_per_step >= 2, stats
    assert stats.steps < 3 * 4, stats  # one request at a time would need a step per token
    assert stats.generated_tokens == 12
    assert [t.request_index for t in traces] == [0, 1, 2]
    for t in traces:
        assert t.output_tokens == 4 == len(t.token_ids) and t.finish_reason == "length"
        assert t.t_submit <= t.t_start < t.t_tokens[0]
        assert all(b > a for a, b in zip(t.t_tokens, t.t_tokens[1:]))
    # closed loop: request 2 is sent by the client whose request finished first, at that moment
    first = calls[0]
    assert traces[2].client == first.client and traces[2].t_submit == first.t_tokens[-1]
    # on_trace: once per request, in finish order, each trace complete when handed over
    assert sorted(t.request_index for t in calls) == [0, 1, 2]
    ends = [t.t_tokens[-1] for t in calls]
    assert ends == sorted(ends)
    # greedy: batching changes the floating-point order of reductions (other sequences in the
    # matmuls, a longer masked KV range), which can flip a near-tied argmax late in a
    # generation; the first tokens of these prompts agree with the one-at-a-time run.
    serial = run_closed_loop(batched_engine, prompts, 2, "serial", cfg).traces
    for b, s in zip(traces, serial):
        assert b.token_ids[:3] == s.token_ids[:3]


def test_a_multi_sequence_context_asks_llama_cpp_for_what_it_allocates(model, capfd):
    """llama.cpp gives each sequence GGML_PAD(n_ctx / n_seq_max, 256) cells; asked for another n_ctx it printed
    "n_ctx is not divisible by n_seq_max" on stderr (a red box in labs 03 and 07). 96 tokens for 2 sequences: 256
    cells each, 512 in all, no warning, and the lab still holds each request to the 96 asked for."""
    from lablib.engines import load_engine

    capfd.readouterr()
    e = load_engine("llama.cpp", model, n_ctx=96, n_seq_max=2, threads=1)
    try:
        lib = e._lib
        assert (lib.llama_n_ctx(e.ctx), lib.llama_n_ctx_seq(e.ctx), e.n_ctx) == (512, 256, 96)
    finally:
        e.close()
    assert "not divisible by n_seq_max" not in capfd.readouterr().err


def test_llama_cpp_batched_matches_serial_and_frees_its_sequences(llama_batched, model):
    """3 sequences in one llama_decode batch; each one's KV cells freed when it finishes."""
    lib = llama_batched._lib
    assert llama_batched.info().flags["n_seq_max"] == 3  # the context really holds 3 sequences
    cfg = GenerationConfig(max_new_tokens=6)
    prompts = _prompts(model, 3)
    run = run_closed_loop(llama_batched, prompts, 3, "batched", cfg)
    batched, stats = run.traces, run.stats.to_dict()
    assert stats["max_sequences_per_step"] == 3 and stats["max_decode_sequences_per_step"] == 3
    assert stats["steps"] == 6  # one prefill batch (3 x 16 tokens) that also samples token 0, then 5 decodes
    assert stats["prompt_tokens"] == 48 and stats["max_tokens_per_step"] == 48
    mem = lib.llama_get_memory(llama_batched.ctx)
    assert [lib.llama_memory_seq_pos_max(mem, s) for s in range(3)] == [-1, -1, -1]  # all freed
    serial = run_closed_loop(llama_batched, prompts, 3, "serial", cfg).traces
    # Greedy on Q4_1: the batched logits differ from the one-sequence ones in the last bits
    # (reduction order), so a near-tie late in the output may flip; the first tokens agree.
    for b, s in zip(batched, serial):
        assert b.token_ids[:3] == s.token_ids[:3]
    again = run_closed_loop(llama_batched, prompts, 3, "batched", cfg).traces
    assert [t.token_ids for t in again] == [t.token_ids for t in batched]  # no KV reuse between runs


def test_llama_cpp_batched_needs_room_for_every_sequence(llama, llama_batched, model):
    cfg = GenerationConfig(max_new_tokens=4)
    with pytest.raises(LabError, match=r"n_seq_max >= 2.*n_seq_max=1"):
        run_closed_loop(llama, _prompts(model, 2), 2, "batched", cfg)
    prompts = _prompts(model, 3, length=200)  # 200 + 4 tokens > 512 // 3 = 170 cells per sequence
    with pytest.raises(
        ContextOverflowError,
        match=r"a sequence needs prompt \+ output = 204 tokens.*each of the 3 sequences holds 170.*n_ctx >= 612",
    ):
        run_closed_loop(llama_batched, prompts, 3, "batched", cfg)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"concurrency": 0}, "concurrency=0"),
        ({"mode": "parallel"}, "unknown scheduling mode 'parallel'"),
        ({"prompts": []}, "no prompts"),
        ({"prompts": [[1, 2], []]}, "prompt 1 is empty"),
    ],
)
def test_invalid_parameters_are_refused(llama, kwargs, message):
    args = {"prompts": [[1, 2, 3]], "concurrency": 1, "mode": "serial", "cfg": GenerationConfig(max_new_tokens=1)}
    args.update(kwargs)
    calls = []
    llama._generate = lambda *a: calls.append(a)  # nothing may run
    try:
        with pytest.raises(LabError, match=message):
            run_closed_loop(llama, **args)
    finally:
        del llama._generate
    assert calls == []


def test_batched_session_is_released_when_the_caller_fails(batched_engine, model):
    """An error in on_trace (a full disk, a Ctrl-C) ends the run; the engine stays usable."""
    cfg = GenerationConfig(max_new_tokens=2)
    prompts = _prompts(model, 3)

    def fail(trace):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        run_closed_loop(batched_engine, prompts, 2, "batched", cfg, on_trace=fail)
    traces = run_closed_loop(batched_engine, prompts, 2, "batched", cfg).traces
    assert [t.output_tokens for t in traces] == [2, 2, 2]
