"""Each real engine on the real default model: same ids, per-token timestamps,
no KV-cache reuse, context checks, and the derived formats giving the same text."""

import re
from pathlib import Path

import pytest

from lablib.engines.base import GenerationConfig
from lablib.errors import ContextOverflowError, LabError
from lablib.measure.workload import chat_ids, prompt_of_length

CASES = Path(__file__).parent / "data" / "cases"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_every_engine_renders_the_chat_prompt_to_the_same_ids(engine, model, first_token_flip):
    assert engine.apply_chat_template(first_token_flip["messages"]) == first_token_flip["prompt_token_ids"]
    assert chat_ids(model, first_token_flip["messages"]) == first_token_flip["prompt_token_ids"]


def test_fixed_length_generation_gives_one_timestamp_per_token_id(engine, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    tr = engine.generate(ids, GenerationConfig(max_new_tokens=6))
    assert tr.output_tokens == 6 == len(tr.token_ids) == len(tr.t_tokens)
    assert tr.prompt_tokens == len(ids) and tr.cached_tokens == 0
    assert tr.t_submit <= tr.t_start < tr.t_tokens[0]
    assert all(b > a for a, b in zip(tr.t_tokens, tr.t_tokens[1:]))  # strictly increasing events
    assert tr.finish_reason == "length"
    assert all(0 <= t < 49152 for t in tr.token_ids)


def test_until_eos_stops_at_eos(engine, first_token_flip):
    tr = engine.generate(first_token_flip["prompt_token_ids"], GenerationConfig(max_new_tokens=48, ignore_eos=False))
    # the transformers/MLX answer ends "...Paris.<|im_end|>"; llama.cpp's Q4_1 runs on longer
    if tr.finish_reason == "stop":
        assert tr.token_ids[-1] in engine.eos_ids
        assert not set(tr.token_ids[:-1]) & engine.eos_ids
    else:
        assert tr.output_tokens == 48


def test_ignore_eos_generates_past_eos(hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    stop = hf.generate(ids, GenerationConfig(max_new_tokens=16, ignore_eos=False))
    assert stop.finish_reason == "stop" and stop.output_tokens < 16
    full = hf.generate(ids, GenerationConfig(max_new_tokens=16))
    # EOS is not masked: the same tokens, EOS included, then generation goes on
    assert full.output_tokens == 16 and full.token_ids[: stop.output_tokens] == stop.token_ids


def test_sampling_is_reproducible_with_a_seed(engine, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=7)
    a, b = engine.generate(ids, cfg), engine.generate(ids, cfg)
    assert a.token_ids == b.token_ids
    greedy = engine.generate(ids, GenerationConfig(max_new_tokens=8))
    c = engine.generate(ids, GenerationConfig(max_new_tokens=8, temperature=1.5, seed=1))
    d = engine.generate(ids, GenerationConfig(max_new_tokens=8, temperature=1.5, seed=2))
    assert len({tuple(greedy.token_ids), tuple(c.token_ids), tuple(d.token_ids)}) > 1


def test_hf_streamer_ids_are_the_generated_ids(hf, first_token_flip):
    """Words, not tokens: the trace holds exactly the ids generate() returns."""
    import torch

    ids = first_token_flip["prompt_token_ids"]
    tr = hf.generate(ids, GenerationConfig(max_new_tokens=10))
    with torch.inference_mode():
        out = hf.hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=[], pad_token_id=2)
    assert tr.token_ids == out[0, len(ids) :].tolist()


def test_llama_cpp_never_reuses_the_kv_cache(llama, first_token_flip):
    """Cached prefill: the same prompt twice on one Llama object is prefilled twice in full."""
    ids = first_token_flip["prompt_token_ids"]
    for _ in range(2):
        tr = llama.generate(ids, GenerationConfig(max_new_tokens=4))
        c = llama.engine_counters()
        assert c["n_p_eval"] == len(ids)  # every prompt token evaluated, nothing taken from cache
        assert c["n_eval"] == 3  # the 4 tokens need 3 single-token decode steps
        assert tr.cached_tokens == 0


def test_llama_cpp_context_is_sized_explicitly(model):
    from lablib.engines import load_engine

    e = load_engine("llama.cpp", model)  # default: the model's trained context, not 512
    try:
        assert e.n_ctx == 8192 and e.info().n_ctx == 8192
        assert e.threads >= 1
    finally:
        e.close()


@pytest.mark.parametrize("name", ["llama.cpp", "transformers", "mlx"])
def test_context_overflow_is_refused_before_running(name, model):
    """A 512-token context and a ~600-token prompt: one clear error naming the numbers."""
    from lablib.engines import load_engine

    e = load_engine(name, model, n_ctx=512)
    ids = prompt_of_length(model, 600)
    calls = []
    e._generate = lambda *a: calls.append(a)  # nothing may run
    with pytest.raises(ContextOverflowError) as err:
        e.generate(ids, GenerationConfig(max_new_tokens=16))
    assert calls == []
    msg = str(err.value)
    assert "prompt 600 + output 16 = 616 tokens" in msg and "holds 512" in msg
    e.close()


def test_invalid_generation_parameters():
    with pytest.raises(LabError, match="max_new_tokens=0"):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(LabError, match="temperature=-1"):
        GenerationConfig(temperature=-1)
    for bad in ("nan", "inf"):  # logits / NaN or infinity: no distribution (a CLI's --temperature nan sampled junk)
        with pytest.raises(LabError, match=rf"temperature={bad}: expected a finite number"):
            GenerationConfig(temperature=float(bad))
    with pytest.raises(LabError, match="top_p=0"):
        GenerationConfig(top_p=0)


def test_engines_describe_themselves(engine):
    info = engine.info().to_dict()
    assert info["name"] in ("transformers", "llama.cpp", "mlx")
    assert info["version"] and info["backend"] and info["dtype"]
    assert info["threads"] >= 1 and info["n_ctx"] == 2048
    # what the roofline bounds its rows by: the weights it loaded and the type it multiplies in
    # (the fixtures load each engine's defaults on the CPU: Q4_1 in llama.cpp runs int8 dot products)
    expect = {"transformers": ("float32", "float32"), "llama.cpp": (None, "int8"), "mlx": (None, "float32")}
    assert (info["weights"], info["compute_dtype"]) == expect[info["name"]]


def test_engines_record_the_device_they_compute_on(engine):
    """Every manifest names the device; on a machine without a GPU it is the CPU, in float32
    for transformers (the faithful reference) and with no llama.cpp layer offloaded."""
    from lablib.machine.identity import found
    from lablib.measure.sweep import engine_manifest

    info = engine.info()
    gpus = [d.kind for d in found() if d.kind != "cpu"]
    assert engine_manifest(engine)["engine"]["device"] == info.device
    if not gpus:
        assert info.device == "cpu"
        if info.name == "transformers":
            assert info.dtype == "float32" and "cpu" in info.backend
        if info.name == "llama.cpp":
            assert info.flags["n_gpu_layers"] == 0 and info.backend == "cpu (ggml)"
    else:
        assert info.device in ("cpu", "cuda", "mps", "metal")


def test_prompt_of_length_is_exact_real_text(model, hf):
    for n in (1, 64, 700):
        ids = prompt_of_length(model, n)
        assert len(ids) == n
    text = hf.detokenize(prompt_of_length(model, 40))
    assert text.startswith("A Short History of Lighthouses")


def test_derived_folders_give_the_same_greedy_text_as_transformers_on_the_gguf(model, hf, mlx, first_token_flip):
    """The HF folder (dequantized) and the float32 MLX folder are the same model as the GGUF
    read directly by transformers: same greedy text for the handed chat prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(model.gguf_path)
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = first_token_flip["prompt_token_ids"]
    with torch.inference_mode():
        out = direct.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=2)
    reference = out[0, len(ids) :].tolist()
    cfg = GenerationConfig(max_new_tokens=12)
    assert hf.generate(ids, cfg).token_ids == reference
    assert mlx.generate(ids, cfg).token_ids == reference
    assert hf.detokenize(reference).startswith(
        first_token_flip["observed"]["transformers_fp32_of_dequantized_weights"]["greedy_text"]
    )


def test_small_llama_context_is_enforced_as_asked(model, first_token_flip):
    """llama.cpp rounds n_ctx up to 256 but caps its batch at the requested size: a 37-token
    prompt in n_ctx=10 must be a clear error, and n_ctx=50 must run (it used to abort the process)."""
    from lablib.engines import load_engine

    ids = first_token_flip["prompt_token_ids"]
    e = load_engine("llama.cpp", model, n_ctx=10)
    try:
        assert e.n_ctx == 10
        with pytest.raises(ContextOverflowError, match="holds 10"):
            e.generate(ids, GenerationConfig(max_new_tokens=2))
    finally:
        e.close()
    e = load_engine("llama.cpp", model, n_ctx=50)
    try:
        assert e.n_batch <= 50
        assert e.generate(ids, GenerationConfig(max_new_tokens=2)).output_tokens == 2
    finally:
        e.close()


def test_token_ids_outside_the_vocabulary_are_one_clear_error(engine):
    with pytest.raises(LabError, match="token id 999999 is outside .* vocabulary of 49152"):
        engine.generate([1, 999999], GenerationConfig(max_new_tokens=2))
    with pytest.raises(LabError, match="token id -1"):
        engine.logits([1, -1])
    # ids that are no ids (was: int()'s "invalid literal" for text, [1.7, 2.2] run silently as [1, 2]), a config
    # that is no GenerationConfig (was: AttributeError ... 'constraint')
    for ids, want in (("hello", r"ids='hello': expected token ids \(a list of ints\)"), ([1.7, 2.2], r"token id 1.7")):
        with pytest.raises(LabError, match=want):
            engine.generate(ids, GenerationConfig(max_new_tokens=2))
    with pytest.raises(LabError, match=r"cfg=5: expected a GenerationConfig"):
        engine.generate([1, 2], 5)
    # and to render: llama.cpp's std::out_of_range aborted the process; transformers and MLX gave ""
    with pytest.raises(LabError, match="token id 1000000000 is outside .* vocabulary of 49152"):
        engine.detokenize([1, 10**9])
    # and what the tokenizer and the chat template take, checked before the library sees it (was: llama.cpp's
    # AttributeError "'int' object has no attribute 'encode'", transformers' ValueError, or a list tokenized as a
    # batch; jinja2's UndefinedError for a message without content)
    for text in (5, ["Hello"]):
        with pytest.raises(LabError, match=rf"text={re.escape(repr(text))}: expected text \(a str\) to tokenize"):
            engine.tokenize(text)
    with pytest.raises(LabError, match=r"text=None: expected text"):
        engine.tokenize(text=None)
    for messages, want in (("hi", r"messages='hi': expected a non-empty list"), ([{"role": "user"}], r"messages\[0\]")):
        with pytest.raises(LabError, match=want):
            engine.apply_chat_template(messages)
    assert engine.tokenize("Hello") and engine.apply_chat_template(messages=[{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("name", ["llama.cpp", "transformers"])
def test_a_closed_engine_refuses_a_request_in_one_message(model, name):
    """After close() (its model and context freed): one LabError saying so and what to do. Was: llama.cpp's
    generate read its freed context and the process died by SIGSEGV (a notebook's kernel with it); transformers
    raised AttributeError on None, from generate and from every verb that reads the model (Engine.needs_open)."""
    from lablib.engines import load_engine

    e = load_engine(name, model, n_ctx=256)
    ids = e.tokenize("Hello there")
    with e:
        assert e.generate(ids, GenerationConfig(max_new_tokens=2)).output_tokens == 2 and not e.closed
    assert e.closed
    calls = [
        lambda: e.generate(ids, GenerationConfig(max_new_tokens=2)),
        lambda: e.cache_prefix(ids),
        lambda: e.tokenize("Hello"),
        lambda: e.detokenize(ids),
        lambda: e.logits(ids),
        lambda: e.iter_logits(ids),
        lambda: e.info(),
        lambda: e.apply_chat_template([{"role": "user", "content": "Hi"}]),
        lambda: e.batch_session(GenerationConfig(max_new_tokens=2), 2, 64),
    ]
    for call in calls:
        with pytest.raises(LabError, match=rf"the {name} engine was closed .* load it again \(lablib.load_engine"):
            call()


def test_the_doctor_takes_a_prepared_model_and_refuses_what_is_no_model_or_engine(model):
    """check_engine(name, lablib.prepare()) checks that model (was: subprocess's TypeError on the object); a list of
    engine names given as the model, or an unknown engine, is one message (was: TypeError, KeyError)."""
    from lablib.engines.doctor import check_engine, check_engines

    r = check_engine("llama.cpp", model)
    assert r["usable"] and "generated 2 tokens" in r["detail"], r
    # the kernel prefill multiplies the shipped Q4_1 with here (lablib.engines.ggml_kernels): row by row on x86
    assert re.search(r"; prefill multiplies Q4_1 (row by row|repacked \w+|tinyBLAS) \(lab 06\)", r["detail"]), r
    with pytest.raises(LabError, match=r"model=\['llama.cpp'\]: expected a model's name or path, a prepared model"):
        check_engines(["llama.cpp"])
    with pytest.raises(LabError, match=r"unknown engine 'foo': expected one of transformers, llama.cpp"):
        check_engine("foo")


@pytest.mark.parametrize(
    "kw, want",
    [
        ({"threads": 100000}, r"threads=100000: expected a whole number of threads from 1 to"),
        ({"threads": -1}, r"threads=-1: expected a whole number of threads"),
        ({"n_batch": 0}, r"n_batch=0: expected a positive whole number"),
        ({"n_batch": "512"}, r"n_batch='512': expected a positive whole number"),
        ({"n_ctx": 512.0}, r"n_ctx=512.0: expected a positive whole number"),
        ({"n_ctx": True}, r"n_ctx=True: expected a positive whole number"),
    ],
)
def test_engine_arguments_are_checked_before_loading(model, kw, want):
    """Thousands of threads or a negative batch crash llama.cpp (SIGSEGV): refused first."""
    from lablib.engines import load_engine

    with pytest.raises(LabError, match=want):
        load_engine("llama.cpp", model, **kw)


def test_numpy_integers_are_whole_numbers_and_long_contexts_default_to_8192(model):
    import dataclasses

    import numpy as np

    from lablib.engines import load_engine

    e = load_engine("llama.cpp", model, n_ctx=np.int64(512), threads=np.int32(1))
    try:
        assert (e.n_ctx, e.threads) == (512, 1)
    finally:
        e.close()
    long_model = dataclasses.replace(model, max_position_embeddings=1_048_576)  # a 1M-token model
    e = load_engine("llama.cpp", long_model)
    try:
        assert e.n_ctx == 8192  # not a KV cache reserved for a million tokens
    finally:
        e.close()


def test_a_keyword_an_engine_does_not_take_is_refused_in_words_before_loading(model):
    """load_engine passed its keywords to the engine's class: one it does not take (llama.cpp has no device=; a
    typo) raised Python's TypeError from inside the class. Now one LabError names it and the keywords the engine
    takes, before anything loads; an engine name or model that is not text is refused in words too."""
    from lablib.engines import load_engine

    with pytest.raises(
        LabError, match=r"engine llama.cpp takes no device=, n_ctxx=: expected its own keywords, n_ctx,"
    ):
        load_engine("llama.cpp", model, device="cuda", n_ctxx=64)
    with pytest.raises(
        LabError, match=r"engine onnxruntime-genai takes no dtype=: expected its own keywords, precision"
    ):
        load_engine("ort", model, dtype="float32")
    with pytest.raises(LabError, match=r"engine None: expected an engine's name, one of transformers, llama.cpp"):
        load_engine(None, model)
    with pytest.raises(LabError, match=r"model=\[1\]: expected a model's name"):
        load_engine("llama.cpp", [1])
