"""ONNX Runtime GenAI on the real default model: the ONNX model built from the lab's Hugging Face
folder (fp32 and int4, cached), greedy ids against transformers, the trace, EOS kept under
ignore_eos, and the errors a missing package or a failing build give."""

import json
from dataclasses import replace

import pytest

from lablib.engines import ENGINES, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.ortgenai import BUILD_RECORD, OnnxRuntimeGenAIEngine, onnx_folder
from lablib.errors import EngineUnavailable, LabError

pytestmark = pytest.mark.engine

NAME = OnnxRuntimeGenAIEngine.name


@pytest.fixture(scope="module")
def ort(model):
    e = load_engine(NAME, model, n_ctx=2048)
    yield e
    e.close()


def test_greedy_ids_agree_with_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    cfg = GenerationConfig(max_new_tokens=8)
    assert ort.generate(ids, cfg).token_ids == hf.generate(ids, cfg).token_ids


def test_teacher_forced_logits_and_config_agree_with_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"][:24]
    a, b = ort.logits(ids), hf.logits(ids)
    assert a.shape == b.shape == (24, 49152)
    assert abs(a - b).max() < 1e-3  # float32 both; measured 6e-5
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert ort.effective_config() == hf.effective_config()  # RoPE base read back from the graph's cos_cache


def test_trace_has_one_timestamp_per_id_and_prefill_first(ort, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    tr = ort.generate(ids, GenerationConfig(max_new_tokens=5))
    assert tr.output_tokens == 5 == len(tr.token_ids) == len(tr.t_tokens)
    assert tr.prompt_tokens == len(ids) and tr.cached_tokens == 0 and tr.finish_reason == "length"
    assert tr.t_submit <= tr.t_start < tr.t_tokens[0]
    assert all(b > a for a, b in zip(tr.t_tokens, tr.t_tokens[1:]))
    assert tr.threads == ort.threads == ort.info().flags["intra_op_num_threads"]


def test_ignore_eos_keeps_the_eos_and_goes_on_as_transformers(ort, hf, first_token_flip):
    ids = first_token_flip["prompt_token_ids"]
    stop = ort.generate(ids, GenerationConfig(max_new_tokens=16, ignore_eos=False))
    assert stop.finish_reason == "stop" and stop.token_ids[-1] in ort.eos_ids and stop.output_tokens < 16
    full = ort.generate(ids, GenerationConfig(max_new_tokens=16))
    assert full.output_tokens == 16 and full.token_ids[: stop.output_tokens] == stop.token_ids
    assert full.token_ids == hf.generate(ids, GenerationConfig(max_new_tokens=16)).token_ids


def test_the_build_is_cached(model, ort):
    logged = []
    folder = onnx_folder(model, "fp32", log=logged.append)
    assert folder == ort.folder and logged == []  # no build, nothing printed
    before = (folder / "model.onnx").stat().st_mtime_ns
    e = load_engine(NAME, model, n_ctx=256)
    e.close()
    assert (folder / "model.onnx").stat().st_mtime_ns == before
    record = json.loads((folder / BUILD_RECORD).read_text())
    assert record["precision"] == "fp32" and "onnxruntime_genai.models.builder" in record["command"]


def test_int4_builds_smaller_and_generates(model, first_token_flip):
    e = load_engine(NAME, model, precision="int4", n_ctx=512)
    try:
        fp32 = onnx_folder(model, "fp32")
        assert e.folder != fp32 and e.info().dtype.startswith("int4")
        # 4-bit weights in blocks of 32 with float32 scales: about 6x smaller than float32
        assert (fp32 / "model.onnx.data").stat().st_size > 5 * (e.folder / "model.onnx.data").stat().st_size
        tr = e.generate(first_token_flip["prompt_token_ids"], GenerationConfig(max_new_tokens=4))
        assert tr.output_tokens == 4 and all(0 <= t < 49152 for t in tr.token_ids)
    finally:
        e.close()


def test_serial_only(ort, model):
    from lablib.sweep import concurrency_sweep

    assert OnnxRuntimeGenAIEngine.modes == ("serial",)
    with pytest.raises(LabError, match="no batched mode"):
        ort.batch_session(GenerationConfig(max_new_tokens=2), max_sequences=2, max_seq_tokens=64)
    # a sweep asked for both modes runs it serial only: 2 clients, 4 requests
    df = concurrency_sweep(
        model,
        engines=["ort"],
        concurrency=[2],
        modes="serial,batched",
        prompt_tokens=16,
        max_new_tokens=2,
        warmup=0,
        progress=False,
    )
    assert list(df["mode"]) == ["serial"] * 4 and (df["output_tokens"] == 2).all()


def test_a_missing_package_says_not_installed_and_how_to_install(monkeypatch, model):
    from lablib.doctor import check_engine

    class Missing(OnnxRuntimeGenAIEngine):
        requires = "onnxruntime_genai_not_here"

    monkeypatch.setitem(ENGINES, NAME, Missing)
    with pytest.raises(EngineUnavailable, match="not installed.*onnxruntime_genai_not_here.*pip install"):
        load_engine("ort", model)
    r = check_engine(NAME)
    assert not r["usable"] and r["detail"].startswith("not installed") and Missing.install_hint in r["detail"]


def test_a_failing_build_names_the_command(monkeypatch, tmp_path, model):
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    broken = tmp_path / "hf"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # no weights, no model type: the builder fails
    with pytest.raises(LabError, match=r"building the ONNX model failed .*onnxruntime_genai\.models\.builder -i "):
        onnx_folder(replace(model, hf_path=str(broken)), "fp32", log=lambda *_: None)
    assert not [p for p in (tmp_path / "home" / "onnx").iterdir() if not p.name.endswith((".tmp", ".lock"))]


def test_a_context_beyond_the_models_is_capped_and_refused_before_work(model):
    """The builder's model holds genai_config.json's context_length (8192 for SmolLM2) and ORT
    GenAI refuses a longer generator (a RuntimeError mid-request): n_ctx is capped there, so a
    request past it is a ContextOverflowError before any work."""
    from lablib.errors import ContextOverflowError

    e = load_engine(NAME, model, n_ctx=9000)
    try:
        assert e.n_ctx == e.info().n_ctx == 8192
        with pytest.raises(ContextOverflowError, match="8190 \\+ output 8 = 8198 tokens, but the context holds 8192"):
            e.generate([1] * 8190, GenerationConfig(max_new_tokens=8))
    finally:
        e.close()
