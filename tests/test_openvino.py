"""The OpenVINO GenAI engine on the real default model (lablib/engines/openvino.py)."""

from __future__ import annotations

import pytest

from lablib.engines import ENGINES, canonical, load_engine
from lablib.engines.base import GenerationConfig
from lablib.errors import EngineUnavailable, LabError
from lablib.measure.workload import DEFAULT_MESSAGES, prompt_of_length

N_AGREE = 32  # greedy tokens compared with transformers


def _model():
    from lablib.model.resolve import resolve

    return resolve(None)


def test_aliases_and_facts():
    assert canonical("ov") == canonical("openvino-genai") == "openvino"
    cls = ENGINES["openvino"]
    assert (cls.format, cls.requires, cls.lab_default, cls.reserves_kv_at_load) == (
        "gguf",
        "openvino_genai",
        False,
        False,
    )
    assert "pip install" in cls.install_hint


def test_missing_package_names_the_install_command(monkeypatch):
    """load_engine and the doctor both check ``requires`` first: a class naming a missing module."""
    from lablib.engines import OpenVINOEngine, doctor

    class Missing(OpenVINOEngine):
        name = "openvino"
        requires = "openvino_genai_not_installed_here"

    monkeypatch.setitem(ENGINES, "openvino", Missing)
    with pytest.raises(EngineUnavailable, match=r"not installed .*openvino_genai_not_installed_here.*pip install"):
        load_engine("openvino")
    r = doctor.check_engine("openvino")
    assert r["usable"] is False and "not installed" in r["detail"] and "pip install" in r["detail"]


@pytest.fixture(scope="module")
def ov_engine():
    e = load_engine("openvino", None, n_ctx=1024)
    yield e
    e.close()


@pytest.fixture(scope="module")
def hf_engine():
    e = load_engine("transformers", None)
    yield e
    e.close()


@pytest.mark.engine
@pytest.mark.parametrize("prompt", ["chat", 64, 128])
def test_greedy_ids_agree_with_transformers(ov_engine, hf_engine, prompt):
    """On the F16 reference GGUF, OpenVINO's greedy tokens are transformers' for the first 16 at
    least; where the 32 diverge later, transformers' own top-2 margin there is a near-tie (the CPU
    plugin computes in bf16 on this CPU by default, and its thread count changes the rounding)."""
    from lablib.studies.compare import NEAR_TIE_NATS, check_generation

    ids = hf_engine.apply_chat_template(DEFAULT_MESSAGES) if prompt == "chat" else prompt_of_length(_model(), prompt)
    c = check_generation({"transformers": hf_engine, "openvino": ov_engine}, "transformers", ids, N_AGREE)
    if not c.ok:
        assert c.details["position"] >= 16, c.verdict
        assert c.details["margin_ref"] < NEAR_TIE_NATS, c.verdict


@pytest.mark.engine
def test_trace_one_stamp_per_token_and_engine_counters(ov_engine):
    ids = prompt_of_length(_model(), 64)
    tr = ov_engine.generate(ids, GenerationConfig(max_new_tokens=12))
    assert len(tr.t_tokens) == len(tr.token_ids) == 12
    assert tr.t_submit <= tr.t_start < tr.t_tokens[0]
    assert tr.t_tokens == sorted(tr.t_tokens) and tr.finish_reason == "length"
    c = ov_engine.engine_counters()
    assert (c["n_input"], c["n_generated"]) == (64, 12)
    info = ov_engine.info()  # no GPU here: the CPU plugin, with the lab's thread count as a property
    assert (ov_engine.ov_device, info.device) == ("CPU", "cpu") or ov_engine.ov_device.startswith("GPU")
    assert info.flags["properties"].get("INFERENCE_NUM_THREADS") == (info.threads if info.device == "cpu" else None)
    assert c["ttft_ms"] > 0 and c["tpot_ms"] > 0 and len(c["token_infer_ms"]) == 12
    # the engine's own token times are on the lab's clock (CLOCK_MONOTONIC); each token reaches the
    # lab after OpenVINO stamps it, and before the next one is ready
    for i, (lab, own) in enumerate(zip(tr.t_tokens, c["token_times_s"])):
        assert own <= lab, i
        if i + 1 < len(tr.t_tokens):
            assert lab <= c["token_times_s"][i + 1], i


@pytest.mark.engine
def test_tokenizer_and_template_agree_with_transformers(ov_engine, hf_engine):
    text = "The capital of France is Paris.\n  Indented, naïve café 123"
    assert ov_engine.tokenize(text) == hf_engine.tokenize(text)
    assert ov_engine.apply_chat_template(DEFAULT_MESSAGES) == hf_engine.apply_chat_template(DEFAULT_MESSAGES)
    assert ov_engine.detokenize(hf_engine.tokenize(text)) == text


@pytest.mark.engine
def test_batched_matches_serial(ov_engine):
    from lablib.measure.closed_loop import run_closed_loop

    prompts = [prompt_of_length(_model(), 32, offset=i) for i in range(4)]
    cfg = GenerationConfig(max_new_tokens=8)
    batched = run_closed_loop(ov_engine, prompts, 2, "batched", cfg)
    serial = run_closed_loop(ov_engine, prompts, 2, "serial", cfg)
    assert [t.token_ids for t in batched.traces] == [t.token_ids for t in serial.traces]
    assert batched.stats.max_sequences_per_step == 2 and batched.stats.generated_tokens == 32
    assert all(t.t_start < t.t_tokens[0] and t.output_tokens == 8 for t in batched.traces)


@pytest.mark.engine
def test_sampling_is_refused(ov_engine):
    with pytest.raises(LabError, match="greedy"):
        ov_engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=2, temperature=0.7))


@pytest.mark.engine
def test_compare_explains_the_shipped_gguf(hf_engine):
    """Read as shipped (Q4_1, Q8_0 tied embedding), OpenVINO's GGUF reader leaves transformers at
    once on a 128-token prompt where transformers' top-2 margin is over 1 nat: compare names it
    numerics beyond a near-tie, and says the logit check is not available."""
    from lablib.studies.compare import compare

    ov_src = load_engine("openvino", None, n_ctx=1024, weights="source")
    try:
        c = compare(
            engines=["openvino"],
            ids=prompt_of_length(_model(), 128),
            max_new_tokens=8,
            loaded={"transformers": hf_engine, "openvino": ov_src},
        )
    finally:
        ov_src.close()
    assert c.check("config").ok is True
    assert c.check("logits").ok is None and "not available" in c.check("logits").verdict
    assert c.verdict["layer"] == "numerics" and c.verdict["engine"] == "openvino"
    assert c.verdict["position"] == 0 and c.verdict["near_tie"] is False


def test_sampling_is_refused_before_the_engine_loads(monkeypatch, capsys):
    """`lablib run --engine ov --temperature 0.7` says greedy-only before preparing or loading
    anything (loading the pipeline, and on first use writing the F16 reference, takes seconds)."""
    from lablib import cli
    from lablib.cli import run

    cls = ENGINES["openvino"]
    with pytest.raises(LabError, match="greedy decoding only"):
        cls.check_generation(GenerationConfig(temperature=0.7))
    cls.check_generation(GenerationConfig())  # greedy: fine

    def not_reached(*a, **kw):
        raise AssertionError("the engine was loaded before the sampling settings were checked")

    monkeypatch.setattr(run, "load_engine", not_reached)
    monkeypatch.setattr(run, "prepare", not_reached)
    assert cli.main(["run", "--engine", "ov", "--max-new-tokens", "2", "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "engine openvino runs greedy decoding only" in err and "--temperature 0" in err


@pytest.mark.engine
def test_manifest_names_the_cpu_defaults_and_how_threads_were_chosen(ov_engine, monkeypatch):
    """The CPU plugin's defaults as OpenVINO spells its types (bf16, u8), not a Python repr; threads
    chosen automatically at load say so (as onnxruntime-genai's), and stay fixed."""
    flags = ov_engine.info().flags
    if ov_engine.ov_device == "CPU":
        assert flags["cpu_defaults"]["INFERENCE_PRECISION_HINT"] in ("bf16", "f16", "f32")
        assert flags["cpu_defaults"]["KV_CACHE_PRECISION"] in ("u8", "f16", "bf16", "f32")
    assert flags["threads_fixed_at_load"] is True and ov_engine.auto_threads is False
    monkeypatch.delenv("LABLIB_THREADS", raising=False)
    e = load_engine("openvino", None, n_ctx=64, threads=1)
    try:
        info = e.info()
        assert (info.threads, info.flags["threads_auto"]) == (1, False)
        # one thread on an AMX CPU whose plugin defaults to bf16 loads in f32 (it died with SIGFPE here,
        # an Intel Xeon with AMX, taking the test worker with it), and says so; elsewhere nothing changes
        from lablib.machine.identity import cpu_flags

        amx_bf16 = "amx_bf16" in cpu_flags() and info.flags["cpu_defaults"]["INFERENCE_PRECISION_HINT"] == "bf16"
        if amx_bf16:
            assert info.compute_dtype == "float32" and "openvino#33300" in info.flags["precision_changed"]
            trace = e.generate(
                e.tokenize("The capital of France is"), GenerationConfig(max_new_tokens=3, ignore_eos=True)
            )
            assert len(trace.token_ids) == 3
        else:
            assert info.flags["precision_changed"] is None
            assert info.compute_dtype == ov_engine.compute_dtype(None, "f16", "CPU", {})
    finally:
        e.close()
    e = load_engine("openvino", None, n_ctx=64)
    try:
        assert e.info().flags["threads_auto"] is True
    finally:
        e.close()


@pytest.mark.parametrize(
    "device, props, flags, default, want",
    [
        # the crash's conditions: CPU, one thread, AMX, the plugin's bf16 -> f32, said once
        ("CPU", {"INFERENCE_NUM_THREADS": 1}, {"avx512_bf16", "amx_bf16"}, "bf16", "f32"),
        # any one of them missing: the properties pass unchanged
        ("CPU", {"INFERENCE_NUM_THREADS": 2}, {"amx_bf16"}, "bf16", None),
        ("CPU", {"INFERENCE_NUM_THREADS": 1}, {"avx512_bf16"}, "bf16", None),  # AVX-512 BF16 EPYC: no AMX
        ("CPU", {"INFERENCE_NUM_THREADS": 1}, {"amx_bf16"}, "f32", None),
        ("CPU", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f16"}, {"amx_bf16"}, "bf16", None),
        ("GPU", {}, {"amx_bf16"}, "bf16", None),
    ],
)
def test_one_thread_on_amx_loads_in_f32_only_where_bf16_would_crash(device, props, flags, default, want):
    from lablib.engines.openvino import single_thread_amx_precision

    got, note = single_thread_amx_precision(device, dict(props), frozenset(flags), default)
    if want is None:
        assert (got, note) == (props, None)
    else:
        assert got == {**props, "INFERENCE_PRECISION_HINT": want}
        assert "SIGFPE" in note and "openvino#33300" in note and "threads=2" in note


def test_asking_for_bf16_on_one_amx_thread_is_refused_with_what_to_do():
    from lablib.engines.openvino import single_thread_amx_precision

    with pytest.raises(LabError, match=r"bf16 on 1 thread.*SIGFPE.*openvino#33300.*threads=2 or more.*f32 or f16"):
        single_thread_amx_precision(
            "CPU", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "bf16"}, {"amx_bf16"}
        )
