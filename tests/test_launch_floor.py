"""The launch floor (the roofline's third line): the model's skeleton by hand, a floor measured on real engines
and cached per engine, device and threads, and rows held to max(bandwidth, compute, floor).

SmolLM2-135M's skeleton by hand (lablib.model.skeleton: 30 layers, 9 query and 3 key/value heads of 8, so a
hidden size of 72, MLP width 32, vocabulary 49,152, tied embeddings):
  embedding 49,152 x 72 = 3,538,944
  per layer q 72x72 + k, v 72x24 each + o 72x72 = 13,824; MLP 3 x 72 x 32 = 6,912; two norms 2 x 72 = 144
  30 layers: 30 x 20,880 = 626,400; final norm 72 -> 4,165,416 parameters
"""

import json

import pandas as pd
import pytest

from lablib.studies import launch_floor, roofline
from tests.test_roofline import rows

SKELETON_PARAMETERS = 4_165_416


@pytest.fixture(scope="module")
def skeleton(model):
    from lablib.model.skeleton import skeleton_of

    return skeleton_of(model, log=lambda *_: None)


@pytest.fixture()
def floors_here(tmp_path, monkeypatch):
    """Floors cached in a file of this test's own."""
    path = tmp_path / "floors.json"
    monkeypatch.setattr(launch_floor, "cache_path", lambda: path)
    return path


def test_the_skeleton_keeps_the_step_and_drops_the_bytes(model, skeleton):
    from lablib.engines import load_engine
    from lablib.model.formats import gguf_facts, read_config

    cfg, src = read_config(skeleton.hf_path), read_config(model.hf_path)
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size", "model_type"):
        assert cfg[key] == src[key], key
    assert (cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]) == (72, 8, 32)
    assert cfg.get("tie_word_embeddings") == src.get("tie_word_embeddings") is True
    assert skeleton.parameters == SKELETON_PARAMETERS
    # derived for the other engines by the lab's own prepare, as any model is
    assert gguf_facts(skeleton.gguf_path)["parameters"] == SKELETON_PARAMETERS
    # the same tokenizer: the same text gives the same ids
    text = "The capital of France is Paris, a city of bridges."
    eng = load_engine("llama.cpp", skeleton, threads=1)
    try:
        from lablib.model.tokenizer import lab_tokenizer

        assert eng.tokenize(text) == lab_tokenizer(model).encode(text, add_special_tokens=False)
    finally:
        eng.close()


def test_a_floor_is_measured_on_the_engine_and_cached_by_its_key(model, skeleton, floors_here):
    f = launch_floor.measure_floor(model, "llama.cpp", threads=1)
    assert f["key"] == f"llama.cpp|{model.sha256[:16]}|cpu|t1" and f["threads"] == 1 and f["device"] == "cpu"
    assert f["reps"] == launch_floor.REPS == len(f["step_s"]) and f["floor_s"] == f["min_s"] == min(f["step_s"])
    assert f["floor_s"] > 0 and f["skeleton_parameters"] == SKELETON_PARAMETERS
    # cached: the same measurement comes back; another thread count is another floor
    assert launch_floor.measure_floor(model, "llama.cpp", threads=1) == f
    assert json.loads(floors_here.read_text())["floors"][f["key"]] == f
    assert launch_floor.floor_for("llama.cpp", model.sha256, "cpu", 1.0) == f["floor_s"]
    assert launch_floor.floor_for("llama.cpp", model.sha256, "cpu", 2) is None
    assert launch_floor.floor_for("transformers", model.sha256, "cpu", 1) is None
    again = launch_floor.measure_floor(model, "llama.cpp", refresh=True, threads=1)
    assert again["key"] == f["key"] and again["step_s"] != f["step_s"]


def test_the_floor_binds_a_row_only_where_it_is_above_the_other_two_lines(model, floors_here):
    """transformers decoded this model at 18 ms a token on an H200 (issue 37), where its bytes allow 0.1 ms: held
    to bandwidth alone that row was at half a percent of its bound; held to its floor it is bound by launches."""
    floor = 0.017  # seconds a step, written as measure_floor writes it
    key_gpu = launch_floor.floor_key("transformers", model.sha256, "cuda", 16)
    key_cpu = launch_floor.floor_key("transformers", model.sha256, "cpu", 2)
    assert key_gpu == f"transformers|{model.sha256[:16]}|cuda" and key_cpu.endswith("|cpu|t2")
    floors = {key_gpu: {"floor_s": floor}, key_cpu: {"floor_s": 0.004}}
    floors_here.write_text(json.dumps({"version": launch_floor.FLOOR_VERSION, "floors": floors}))
    gpu = rows(model, {"device": "cuda", "accelerator": "NVIDIA H200", "threads": 16})
    cpu = rows(model, {"device": "cpu", "threads": 2})
    gpu["decode_tps"] = 1 / 0.018
    df = roofline.add_bound_columns(pd.concat([gpu, cpu], ignore_index=True), model)
    t_gpu = df[(df["device"] == "cuda") & (df["engine"] == "transformers")]
    assert (t_gpu["decode_bound_by"] == "launches").all() and (t_gpu["launch_floor_s"] == floor).all()
    assert t_gpu["decode_bound_tps"].tolist() == pytest.approx([1 / floor] * len(t_gpu))
    assert t_gpu["decode_pct_of_bound"].tolist() == pytest.approx([100 * floor / 0.018] * len(t_gpu))
    # llama.cpp has no floor cached: the two lines as before, bandwidth-bound at decode
    l_gpu = df[(df["device"] == "cuda") & (df["engine"] == "llama.cpp")]
    assert l_gpu["launch_floor_s"].isna().all() and (l_gpu["decode_bound_by"] == "bandwidth").all()
    # on this CPU, float32 weights read at the measured bandwidth take longer than the 4 ms floor: bandwidth binds
    t_cpu = df[(df["device"] == "cpu") & (df["engine"] == "transformers")]
    assert (t_cpu["launch_floor_s"] == 0.004).all() and (t_cpu["decode_bound_by"] == "bandwidth").all()
    assert (t_cpu["decode_bound_tps"] < 1 / 0.004).all()
    # another thread count has no floor
    other = roofline.add_bound_columns(rows(model, {"device": "cpu", "threads": 1}), model)
    assert other["launch_floor_s"].isna().all()
    # transformers' compiled decoding (rows with its compile_mode) is held to the compiled engine's own floor
    key_compiled = launch_floor.floor_key("transformers", model.sha256, "cpu", 2, {"compile": True})
    assert key_compiled == key_cpu + "|compile=True"
    # 45 ms: under the rows' 50 ms step (20 tok/s), over what their bytes take on a 100 GB/s machine
    floors[key_compiled] = {"floor_s": 0.045}
    floors_here.write_text(json.dumps({"version": launch_floor.FLOOR_VERSION, "floors": floors}))
    mach = {"name": "toy", "bytes_per_s": 100e9, "flop_per_s": {"float32": 1e12, "int8": 1e12}}
    compiled = roofline.add_bound_columns(
        rows(model, {"device": "cpu", "threads": 2, "compile_mode": "default"}), model, machine_name=mach
    )
    c = compiled[compiled["engine"] == "transformers"]
    assert (c["launch_floor_s"] == 0.045).all() and (c["decode_bound_by"] == "launches").all()
    # a floor above a row's own measured step was disturbed when it was measured: that row is not held to it
    floors[key_compiled] = {"floor_s": 0.5}
    floors_here.write_text(json.dumps({"version": launch_floor.FLOOR_VERSION, "floors": floors}))
    disturbed = roofline.add_bound_columns(
        rows(model, {"device": "cpu", "threads": 2, "compile_mode": "default"}), model, machine_name=mach
    )
    d = disturbed[disturbed["engine"] == "transformers"]
    assert d["launch_floor_s"].isna().all() and (d["decode_bound_by"] != "launches").all()
    assert (d["decode_pct_of_bound"] <= 100).all()


def test_a_broken_cache_or_an_engine_that_cannot_run_the_skeleton_is_said_not_raised(model, floors_here):
    """A floor cache that is not what this module writes is measured again; an engine that fails on the skeleton
    (onnxruntime-genai's attention wants heads of 16) gives its reason and the other engines go on."""
    for text in ("[]", "null", '"x"', '{"version": 2}', '{"version": 2, "floors": {"k": {"floor_s": "x"}}}'):
        floors_here.write_text(text)
        assert launch_floor.cached_floors() == {}
        assert launch_floor.floor_for("llama.cpp", model.sha256, "cpu", 1) is None
    got = launch_floor.measure_floors(model, ["no-such-engine", "llama.cpp"], log=lambda *_: None)
    assert "no-such-engine" in got["no-such-engine"]["error"] and got["llama.cpp"]["floor_s"] > 0
    assert launch_floor.floor_load("llama.cpp", "cpu", "auto") == {}  # words for threads: the engine's own
