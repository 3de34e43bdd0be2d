"""lablib.engines.ggml_kernels: the kernel llama.cpp's prefill multiplies each type of a GGUF's weights with on
this CPU, read from what llama.cpp logs while loading (re-laid tensors) and its system info (tinyBLAS), on the
real default model and a Q4_0 of it made by llama.cpp's own quantizer.

On x86 with AVX2 (every CPU the lab's CI runs on) the shipped Q4_1 takes the row-by-row dot product and the Q4_0
is re-laid as q4_0_8x8 (ggml/src/ggml-cpu/repack.cpp); on a 2-core Xeon with AVX-512 that made Q4_0's prefill
2.2 times Q4_1's (lab 06)."""

import platform
import re

import pytest

from lablib.engines import ggml_kernels as gk

X86 = platform.machine().lower() in ("x86_64", "amd64")
# the layers' weight matrices of SmolLM2-135M: q, k, v, o, gate, up, down in each of its 30 layers
LAYER_MATRICES = 30 * 7


@pytest.fixture(scope="module")
def q4_0(model):
    from lablib.studies import quant

    rec = quant.rung(quant.reference(model, "F32"), "Q4_0", quant.quant_home(model.sha256), model.sha256)
    return quant.rung_model(rec["path"], model, "Q4_0")


def _loaded(model):
    from lablib.engines import load_engine

    eng = load_engine("llama.cpp", model, n_ctx=128)
    try:
        sysinfo = eng._lib.llama_print_system_info().decode()
        return eng.info().flags, eng.load_log, sysinfo, eng._path
    finally:
        eng.close()


def _x86_avx2_repack(sysinfo: str) -> bool:
    return X86 and {"AVX2", "REPACK", "LLAMAFILE"} <= gk._flags(sysinfo)


def test_the_shipped_q4_1_is_multiplied_row_by_row_and_a_q4_0_is_re_laid(model, q4_0):
    from lablib.model.formats import gguf_tensors

    flags, log, sysinfo, path = _loaded(model)
    if not _x86_avx2_repack(sysinfo):
        pytest.skip(f"expected values are x86 AVX2's; this CPU and build say {sysinfo!r}")
    assert flags["matmul_kernels"] == "Q4_1 row by row"
    matrices = gk.layer_matrices(path)  # the 2-D layer weights: no norms, no embeddings
    assert len(matrices) == LAYER_MATRICES and {m[0].split(".")[2] for m in matrices} == {
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    }
    assert gk.matmul_kernels(matrices, log, sysinfo) == {"Q4_1": {"row by row": LAYER_MATRICES}}
    assert gk.repacked_tensors(log) == {}

    flags, log, sysinfo, path = _loaded(q4_0)
    assert flags["matmul_kernels"] == "Q4_0 repacked q4_0_8x8"
    repacked = gk.repacked_tensors(log)
    assert len(repacked) == LAYER_MATRICES and set(repacked.values()) == {"q4_0_8x8"}
    # the re-laid tensors are all the bytes llama.cpp put in its repack buffer (a line it prints apart, MiB to 2
    # decimals): none of the log's repack lines was missed (progress dots run into some of them)
    tensors = {name: nbytes for name, _kind, _n, nbytes in gguf_tensors(path)}
    mib = float(re.search(r"CPU_REPACK model buffer size =\s+([\d.]+) MiB", log).group(1))
    assert sum(tensors[n] for n in repacked) / 2**20 == pytest.approx(mib, abs=0.006)


def test_the_ladder_rows_name_each_rungs_kernels(model):
    import llama_cpp

    from lablib.studies.ladder import run_ladder

    sysinfo = llama_cpp.llama_print_system_info().decode()
    if not _x86_avx2_repack(sysinfo):
        pytest.skip(f"expected values are x86 AVX2's; this CPU and build say {sysinfo!r}")
    rows = run_ladder(
        ["Q8_0", "Q4_K_M"],
        model=model,
        speed=False,
        include_reference=False,
        n_ctx=128,
        n_chunks=2,
        log=lambda *_: None,
    )
    by = {r["type"]: r["matmul_kernels"] for r in rows}
    assert by["Q8_0"] == "Q8_0 tinyBLAS"
    # Q4_K_M of a 576-wide model is mostly Q5_0 (tinyBLAS); its ffn_down keeps Q4_K, re-laid as q4_K_8x8 on AVX2
    parts = dict(p.split(" ", 1) for p in by["Q4_K_M"].split(", "))
    assert list(parts)[0] == "Q5_0" and parts["Q5_0"] == "tinyBLAS" and parts["Q4_K"] == "repacked q4_K_8x8"


def test_tinyblas_types_follow_the_build_and_the_cpu():
    x86 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
    assert gk.tinyblas_types(x86) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"}
    assert gk.tinyblas_types(x86.replace("LLAMAFILE = 1 | ", "")) == set()  # a build without llamafile
    assert "F16" not in gk.tinyblas_types("CPU : AVX = 1 | LLAMAFILE = 1 |")  # no F16C, no AVX-512
    arm = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | LLAMAFILE = 1 | ACCELERATE = 1 |"
    assert gk.tinyblas_types(arm) == {"F32", "F16", "Q8_0", "Q4_0"}
    assert gk.tinyblas_types(arm.replace("DOTPROD = 1 | ", "")) == {"F32", "F16"}


def test_a_type_split_over_paths_gives_each_its_count_and_experts_never_take_tinyblas():
    log = "".join(f".repack: repack tensor blk.{i}.ffn_up.weight with q4_0_8x8\n" for i in range(3))
    matrices = [(f"blk.{i}.ffn_up.weight", "Q4_0") for i in range(4)] + [("blk.0.ffn_down.weight", "Q6_K")]
    x86 = "CPU : AVX = 1 | AVX2 = 1 | LLAMAFILE = 1 |"
    found = gk.matmul_kernels(matrices, log, x86)
    assert found == {"Q4_0": {"repacked q4_0_8x8": 3, "tinyBLAS": 1}, "Q6_K": {"row by row": 1}}
    assert gk.kernels_summary(found) == "Q4_0 repacked q4_0_8x8 3 + tinyBLAS 1, Q6_K row by row"
    # a mixture of experts' weights go through ggml's mul_mat_id: one dot product per row, whatever the type
    experts = [(f"blk.0.ffn_{w}_exps.weight", "Q8_0") for w in ("gate", "up", "down")] + [
        ("blk.0.attn_q.weight", "Q8_0")
    ]
    assert gk.matmul_kernels(experts, "", x86) == {"Q8_0": {"row by row": 3, "tinyBLAS": 1}}


def test_layer_matrices_leave_out_vectors_and_convolutions(tmp_path):
    """Layer tensors named *.weight that no matrix product takes: norms of any name, scales, sinks (vectors) and
    convolution kernels (2-D); a gguf file written with the gguf package's own writer."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    for name, shape in (
        ("blk.0.attn_q.weight", (8, 16)),
        ("blk.0.ffn_up_exps.weight", (4, 8, 16)),
        ("blk.0.attn_norm_2.weight", (16,)),
        ("blk.0.post_ffw_norm_1.weight", (16,)),
        ("blk.0.attn_sinks.weight", (4,)),
        ("blk.0.layer_output_scale.weight", (1,)),
        ("blk.0.ssm_conv1d.weight", (32, 4)),
        ("blk.0.shortconv.conv.weight", (16, 3)),
        ("blk.0.attn_q.bias", (8,)),
        ("token_embd.weight", (32, 16)),
    ):
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert [(n, t) for n, t, _ in gk.layer_matrices(tmp_path / "t.gguf")] == [
        ("blk.0.attn_q.weight", "F32"),
        ("blk.0.ffn_up_exps.weight", "F32"),
    ]


def test_lablib_quantize_prints_each_rungs_kernels(model, capsys):
    import llama_cpp

    from lablib.cli import main

    if not _x86_avx2_repack(llama_cpp.llama_print_system_info().decode()):
        pytest.skip("expected values are x86 AVX2's")
    assert main(["quantize", "--types", "Q8_0", "--no-speed", "--n-ctx", "128", "--chunks", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" kernels=")[-1] for ln in lines] == ["[F32 tinyBLAS]", "[Q8_0 tinyBLAS]"]
