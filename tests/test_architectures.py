"""Models of other architectures, as a user brings them: Qwen 3, Phi-3 and a Gemma 3 with sliding-window
layers, made here with random weights (tests/tiny_models.py) and handed to the lab as GGUF files, then a
Hugging Face folder in bfloat16 and an MLX folder made by mlx-lm, and a GGUF of an architecture no engine
knows. Each goes through prepare, doctor, run, compare and a context sweep on every engine that reads it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_models
from lablib.engines import ENGINES, engines_for, load_engine
from lablib.engines.base import GenerationConfig
from lablib.model.resolve import prepare
from lablib.model.shape import kv_cache_bytes, model_dims
from tiny_models import GEMMA3_WINDOW

ARCHS = tuple(tiny_models.ARCHITECTURES)
# each architecture as its GGUF header names it and as its Hugging Face config does
GGUF_ARCH = {"qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3"}


def lablib(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "lablib.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def made(tmp_path_factory, model):
    """{arch: (GGUF path, ResolvedModel)}: each tiny model converted to GGUF and prepared from it. The Gemma 3
    one has no chat template (a base model, as Gemma 3 270M's pretrained checkpoint)."""
    root = tmp_path_factory.mktemp("architectures")
    out = {}
    for arch in ARCHS:
        hf = tiny_models.make_hf(arch, root / f"{arch}-hf", model.hf_path, chat_template=arch != "gemma3")
        gguf = tiny_models.to_gguf(hf, root / f"{arch}.gguf")
        out[arch] = (gguf, prepare(str(gguf), log=lambda *_: None))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_prepare_reads_the_architecture_and_derives_every_format(made, arch):
    gguf, rm = made[arch]
    assert rm.architecture == GGUF_ARCH[arch]
    assert (rm.gguf_path, bool(rm.hf_path), bool(rm.mlx_path)) == (str(gguf), True, True), rm.unavailable
    d = model_dims(rm)
    assert (d["layers"], d["heads"], d["kv_heads"], d["head_dim"]) == (
        tiny_models.EXTRA[arch]["num_hidden_layers"],
        4,
        2,
        16,
    )
    if arch == "gemma3":  # five sliding layers, then a full one (transformers' and llama.cpp's rule alike)
        assert d["layer_types"] == ("sliding",) * 5 + ("full",) and d["sliding_window"] == GEMMA3_WINDOW
    else:
        assert set(d["layer_types"]) == {"full"} and d["sliding_window"] == 0
    assert engines_for(rm) == ["transformers", "llama.cpp", "mlx"]


@pytest.mark.parametrize("arch", ARCHS)
def test_compare_gives_a_verdict_and_every_engine_builds_the_configuration_the_files_state(made, arch):
    """Each engine's configuration read back from what it built (RoPE bases per kind of layer, the sliding
    window and how many layers use it) agrees with the GGUF and the config.json; greedy text and logits agree,
    or differ at a position the verdict names."""
    from lablib.studies.compare import compare

    _, rm = made[arch]
    result = compare(rm, max_new_tokens=8)
    config = result.check("config")
    assert config.ok, config.verdict
    table = config.table.set_index("setting")
    assert list(table.columns[:2]) == ["gguf file", "config.json"]
    if arch == "gemma3":
        for col in ("gguf file", "config.json", "transformers", "llama.cpp", "mlx"):
            assert table.loc["sliding_layers", col] == 5, col
            assert table.loc["sliding_window", col] == GEMMA3_WINDOW, col
            assert table.loc["rope_theta", col] == pytest.approx(1_000_000.0, rel=1e-3), col
            assert table.loc["rope_theta_sliding", col] == pytest.approx(10_000.0, rel=1e-3), col
        assert result.check("template").ok is None  # a base model: no template in any engine
        assert result.verdict["prompt_format"] == "text"
    else:
        assert result.check("template").ok, result.check("template").verdict
        assert result.verdict["prompt_format"] == "chat"
    v = result.verdict
    assert v["layer"] in ("none", "numerics"), v
    if v["layer"] == "numerics" and v["position"] is not None:
        assert isinstance(v["near_tie"], bool) and v["margin_ref"] >= 0
    logits = result.check("logits").table.set_index("engine")
    assert logits.loc["mlx", "argmax_agreement"] == 1.0  # the same float32 weights, the same arithmetic order


def test_doctor_and_run_on_a_base_model_gguf(made):
    """doctor lists what reads the model and what does not (exit 0: its default set runs); run sends the
    default question as raw text to a model without a chat template, and says so."""
    gguf, rm = made["gemma3"]
    p = lablib("doctor", "--model", str(gguf))
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("transformers", "llama.cpp", "mlx"):
        assert f"{name}" in p.stdout and "generated 2 tokens" in p.stdout
    assert "does not run this model: OpenVINO GenAI's GGUF reader builds llama, qwen2, qwen3 models only" in p.stdout
    p = lablib("run", "--engine", "llama.cpp", "--model", str(gguf), "--max-new-tokens", "3", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["prompt_format"] == "text" and out["output_tokens"] == 3
    assert "has no chat template (a base model): the question goes in as raw text" in p.stderr
    assert "Traceback" not in p.stderr
    p = lablib("run", "--engine", "llama.cpp", "--model", str(gguf), "--chat", "Hi", "--max-new-tokens", "3")
    assert p.returncode == 2 and "no chat template in its tokenizer (a base model" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_context_sweep_past_the_window_on_every_engine(made, tmp_path):
    """A prompt longer than the sliding window through each engine's prefill and decode: rows for each."""
    from lablib.measure.sweep import context_sweep

    _, rm = made["gemma3"]
    df = context_sweep(rm, prompt_tokens=[8, 3 * GEMMA3_WINDOW], max_new_tokens=4, reps=1, progress=False)
    assert sorted(set(df["engine"])) == ["llama.cpp", "mlx", "transformers"]
    assert len(df) == 6 and df["error"].isna().all() if "error" in df else len(df) == 6
    assert (df["output_tokens"] == 4).all() and set(df["prompt_tokens"]) == {8, 3 * GEMMA3_WINDOW}


def test_each_engine_holds_the_kv_cache_the_lab_predicts_for_sliding_layers(made):
    """At a context three windows long: llama.cpp's KV buffers as it reports them (full-size SWA cache in
    process, window + micro-batch as llama-server keeps them), transformers' cache tensors (window - 1 per
    sliding layer) and mlx-lm's prompt cache (its rotating window) are what Engine.kv_cache_bytes says."""
    _, rm = made["gemma3"]
    d = model_dims(rm)
    context = 3 * GEMMA3_WINDOW
    for swa_full in (True, False):
        e = load_engine("llama.cpp", rm, n_ctx=512, swa_full=swa_full)
        try:
            report = e.kv_report()
            assert (
                report["bytes"]
                == report["predicted_bytes"]
                == ENGINES["llama.cpp"].kv_cache_bytes(rm, 512, swa_full=swa_full)
            )
            assert {c["kind"]: c["layers"] for c in report["caches"]} == {"full": 1, "sliding": 5}
            assert report["swa_full"] is swa_full
        finally:
            e.close()
    ids = list(range(100, 100 + context - 2))
    cfg = GenerationConfig(max_new_tokens=2)
    held = {}
    for name in ("transformers", "mlx"):
        e = load_engine(name, rm)
        try:
            e.generate(ids, cfg)
            held[name] = e.last_kv_bytes
        finally:
            e.close()
    assert held["transformers"] == ENGINES["transformers"].kv_cache_bytes(rm, context - 1)  # the last token's K, V
    assert held["mlx"] == ENGINES["mlx"].kv_cache_bytes(rm, context, prompt_tokens=len(ids))  # one step ahead
    # what the model needs: one full layer of every position, five of the window
    need = kv_cache_bytes(d, 4, context)
    assert need == 2 * 2 * 16 * 4 * (context + 5 * GEMMA3_WINDOW)
    assert held["transformers"] < need < ENGINES["llama.cpp"].kv_cache_bytes(rm, context)


def test_a_published_bfloat16_folder_and_a_user_made_mlx_folder(made, model, tmp_path):
    """A Hugging Face folder in bfloat16 (as models are published) gets a BF16 GGUF from llama.cpp's own
    converter and runs on all three engines; an MLX folder mlx-lm quantized runs on mlx, and the engines that
    cannot read it say so before loading anything."""
    import mlx_lm

    hf = tiny_models.make_hf("qwen3", tmp_path / "qwen3-bf16", model.hf_path, dtype="bfloat16")
    rm = prepare(str(hf), log=lambda *_: None)
    assert rm.source_format == "hf" and Path(rm.gguf_path).name == "model-bf16.gguf"
    from lablib.model.formats import gguf_facts

    assert gguf_facts(rm.gguf_path)["quantization"] == "BF16"
    cfg = GenerationConfig(max_new_tokens=4)
    ids = [1, 504, 3458, 282]
    outs = {}
    for name in engines_for(rm):
        e = load_engine(name, rm)
        try:
            outs[name] = e.generate(ids, cfg).token_ids
        finally:
            e.close()
    assert set(outs) == {"transformers", "llama.cpp", "mlx"} and all(len(o) == 4 for o in outs.values())

    q = tmp_path / "qwen3-mlx-q8"
    mlx_lm.convert(str(hf), mlx_path=str(q), quantize=True, q_bits=8, q_group_size=32)
    mrm = prepare(str(q), log=lambda *_: None)
    assert mrm.source_format == "mlx" and engines_for(mrm) == ["mlx"]
    e = load_engine("mlx", mrm)
    try:
        assert len(e.generate(ids, cfg).token_ids) == 4
    finally:
        e.close()
    from lablib.errors import FormatError

    for name in ("transformers", "llama.cpp"):
        with pytest.raises(FormatError, match=f"{name} needs a"):
            load_engine(name, mrm)


def test_a_model_no_engine_can_read_stops_with_one_message(tmp_path):
    """A GGUF of an architecture no engine knows: prepare says which formats it could not make, and each
    command stops before any work with one message, exit 2 (doctor: exit 1), no traceback."""
    gguf = tiny_models.made_up_gguf(tmp_path / "made-up.gguf")
    said = []
    rm = prepare(str(gguf), log=said.append)
    assert rm.hf_path is None and "hf" in rm.unavailable and "mlx" in rm.unavailable
    assert any("no HF format" in s for s in said)
    why = ENGINES["llama.cpp"].unsupported(rm)
    assert why and "does not know the GGUF architecture 'made-up-arch'" in why
    for args in (
        ("run", "--engine", "llama.cpp", "--max-new-tokens", "2"),
        ("run", "--engine", "transformers", "--prompt", "Hi", "--max-new-tokens", "2"),
        ("compare",),
        ("sweep", "context", "--prompt-tokens", "8", "--out", str(tmp_path / "s.jsonl")),
    ):
        p = lablib(*args, "--model", str(gguf))
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.strip().splitlines()[-1].startswith("lablib: "), p.stderr
        assert "made-up" in p.stderr, p.stderr
    p = lablib("doctor", "--model", str(gguf))
    assert p.returncode == 1 and "no engine of the lab's default set" in p.stdout and "Traceback" not in p.stderr
