"""The roofline bounds a run by the weights its engine actually loaded, not the engine's defaults.

Real engines on the real default model (SmolLM2-135M), one or two short requests each:
- openvino reads the lab's F16 reference GGUF by default and the shipped Q4_1 GGUF with
  ``weights="source"``: its rows' bytes per step are that file's tensor bytes (the Q4_1 file's are
  llama.cpp's, 96,576,768), and its compute type is the inference precision it reports in its manifest;
- onnxruntime-genai loads float32 or int4 builds (``precision=``): the int4 rows' bytes per step are
  the built model's 4-bit blocks, counted here by two routes that do not read its graph: by hand
  from the model's shape, and from the size of the build's external-data file.

By hand, from the model's shape (tests/test_roofline.py): 134,479,872 weights in matrix products,
35,136 norm weights, 134,515,008 parameters. The int4 build stores every matrix in blocks of 32
weights, 16 bytes of nibbles and one float32 scale (20 bytes, 5 bits a weight), the norms in float32:
134,479,872 x 20 / 32 + 35,136 x 4 = 84,049,920 + 140,544 = 84,190,464 bytes. Its external data also
holds ONNX Runtime's rotary tables, cos_cache and sin_cache, [context 8192, head_dim / 2 = 32] float32
each (2,097,152 bytes), of which a step reads one row per position: not counted.
"""

import json

import pytest

from lablib.engines import ENGINES, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.openvino import OV_TYPES
from lablib.errors import LabError
from lablib.measure.sweep import context_sweep, measure, weights_load_kwargs
from lablib.measure.workload import prompt_of_length
from lablib.model import formats
from lablib.studies import roofline

PARAMETERS = 134_515_008
MATRIX_WEIGHTS = 134_479_872
NORMS = 35_136
Q4_1_FILE = 96_576_768  # llama.cpp's row: 210 Q4_1 matrices, the tied embedding in Q8_0, float32 norms
INT4_BUILD = MATRIX_WEIGHTS * 20 // 32 + NORMS * 4
KV_F16 = 23_040  # bytes of KV cache per position in float16 (2 x 30 layers x 3 heads x 64)
# a toy machine with a different roof per type, so that the roof a row is held against shows
MACH = {"name": "toy", "bytes_per_s": 10e9, "flop_per_s": {"float32": 50e9, "bfloat16": 80e9, "int8": 100e9}}


def _bound_rows(model, rows):
    import pandas as pd

    return roofline.add_bound_columns(pd.DataFrame(rows), model, machine_name=MACH)


def _decode_bound(weight_bytes, kv_per_position, row):
    depth = row["prompt_tokens"] + row["output_tokens"] / 2
    return MACH["bytes_per_s"] / (weight_bytes + depth * kv_per_position)


# --- openvino: the F16 reference by default, the shipped Q4_1 file with weights="source" --------------
@pytest.mark.engine
@pytest.mark.parametrize("weights", ["f16", "source"])
def test_openvino_rows_are_bounded_by_the_file_it_read(model, weights):
    from lablib.studies import quant

    e = load_engine("openvino", model, n_ctx=256, threads=2, weights=weights)
    try:
        info = e.info()
        rows = measure(e, prompt_of_length(model, 16), GenerationConfig(max_new_tokens=4), warmup=0, reps=1)
    finally:
        e.close()
    reported = OV_TYPES[info.flags["cpu_defaults"]["INFERENCE_PRECISION_HINT"]]  # bf16 on AVX-512 BF16 CPUs
    assert (info.weights, info.compute_dtype) == (weights, reported)
    row = _bound_rows(model, rows).iloc[0]
    assert (row["weights"], row["compute_dtype"]) == (weights, reported)  # the manifest's, in the row
    gguf = model.gguf_path if weights == "source" else quant.reference(model, "F16", log=lambda *_: None)
    file_bytes = sum(t[3] for t in formats.gguf_tensors(str(gguf)))  # every tensor: tied embedding
    assert roofline.weight_bytes_read(model, "openvino", weights) == file_bytes
    if weights == "source":
        assert file_bytes == Q4_1_FILE == roofline.weight_bytes_read(model, "llama.cpp")
    else:
        assert file_bytes > 2.5 * Q4_1_FILE  # F16: 16 bits a weight against Q4_1's 5 (Q8_0's 8.5)
    assert row["decode_bound_tps"] == pytest.approx(_decode_bound(file_bytes, KV_F16, row))
    assert row["bound_flop_per_s"] == MACH["flop_per_s"].get(reported, MACH["flop_per_s"]["float32"])
    # the class's expectation before loading agrees with what the loaded engine reported
    assert roofline.compute_dtype(model, "openvino", weights) == reported


# --- onnxruntime-genai: the fp32 or the int4 build ------------------------------------------------------
@pytest.mark.engine
def test_ortgenai_int4_rows_are_bounded_by_the_built_model(model):
    from lablib.engines.ortgenai import onnx_folder

    df = context_sweep(
        model,
        engines=["ort"],
        prompt_tokens=[16],
        max_new_tokens=4,
        reps=1,
        warmup=0,
        progress=False,
        weights="ort=int4",
    )
    assert (df["weights"].tolist(), df["compute_dtype"].tolist()) == (["int4"], ["int8"])
    row = roofline.add_bound_columns(df, model, machine_name=MACH).iloc[0]
    int4 = roofline.weight_bytes_read(model, "onnxruntime-genai", "int4")
    # route 1, by hand from the model's shape (module docstring)
    assert int4 == INT4_BUILD == 84_190_464
    # route 2, the build's files: its one external-data file holds every initializer, the rotary
    # tables included ([context, head_dim / 2] float32 each, from genai_config.json)
    folder = onnx_folder(model, "int4")
    cfg = json.loads((folder / "genai_config.json").read_text())["model"]
    rotary = 2 * cfg["context_length"] * cfg["decoder"]["head_size"] // 2 * 4
    assert int4 == (folder / "model.onnx.data").stat().st_size - rotary
    fp32 = roofline.weight_bytes_read(model, "onnxruntime-genai", "fp32")
    assert fp32 == 4 * PARAMETERS == roofline.weight_bytes_read(model, "transformers")
    assert int4 < fp32 / 6
    table = roofline.weight_table(model, "ort", "int4").set_index("type")
    assert table.loc["INT4", "bits_per_weight"] == 5.0 and table.loc["INT4", "elements"] == MATRIX_WEIGHTS
    # the row: int4 bytes, float32 KV cache, held against the int8 roof (MatMulNBits' accuracy_level 4)
    assert row["decode_bound_tps"] == pytest.approx(_decode_bound(int4, 2 * KV_F16, row))
    assert row["compute_dtype"] == "int8" and row["bound_flop_per_s"] == 100e9


# --- the engines' facts, and what they refuse -----------------------------------------------------------------
def test_weight_choices_are_engine_facts(model):
    assert (ENGINES["openvino"].weights_option, ENGINES["openvino"].weights_choices) == ("weights", ("f16", "source"))
    assert ENGINES["onnxruntime-genai"].weights_option == "precision"
    # transformers loaded in bfloat16 (its default on CUDA) holds 2 bytes a weight and multiplies in bfloat16
    bf16 = roofline.engine_profile(model, "transformers", "bfloat16")
    assert (bf16["weight_bytes"], bf16["compute_dtype"]) == (2 * PARAMETERS, "bfloat16")
    # a row that records no choice (written before the columns existed) gets the engine's default
    assert roofline.engine_profile(model, "transformers", float("nan"))["weights"] == "float32"
    with pytest.raises(LabError, match=r"weights='q4' for openvino: expected one of f16, source"):
        roofline.engine_profile(model, "openvino", "q4")
    with pytest.raises(LabError, match="llama.cpp: it has one choice"):
        roofline.weight_bytes_read(model, "llama.cpp", "int4")
    assert weights_load_kwargs(["openvino", "onnxruntime-genai"], "ov=source,ort=int4") == {
        "openvino": {"weights": "source"},
        "onnxruntime-genai": {"precision": "int4"},
    }
    with pytest.raises(LabError, match="not among this sweep's engines"):
        weights_load_kwargs(["llama.cpp"], {"openvino": "source"})
    with pytest.raises(LabError, match="engine=choice pairs"):
        weights_load_kwargs(["openvino"], "openvino")
    with pytest.raises(LabError, match="precision='int8' for onnxruntime-genai"):
        weights_load_kwargs(["ort"], "ort=int8")


def test_cli_sweep_refuses_a_weight_choice_before_any_work(tmp_path, capsys):
    from lablib.cli import main

    out = tmp_path / "r.jsonl"
    args = ["sweep", "context", "--engines", "llama.cpp", "--prompt-tokens", "16", "--max-new-tokens", "2"]
    assert main([*args, "--weights", "ort=int4", "--out", str(out), "--quiet"]) == 2
    assert "onnxruntime-genai is not among this sweep's engines (llama.cpp)" in capsys.readouterr().err
    assert not out.exists()
