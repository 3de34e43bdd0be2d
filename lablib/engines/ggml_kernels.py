"""Which matrix kernel llama.cpp's CPU backend multiplies a GGUF's weights with in prefill: why two files of
one model and nearly one size prefill at speeds a factor of two apart.

A prompt of n tokens goes through each weight matrix as one matrix product (n columns). ggml's CPU backend
(``ggml_compute_forward_mul_mat``, ggml/src/ggml-cpu/ggml-cpu.c) takes the first of three paths that
applies to the weight's type, on the CPU and build it runs on:

1. **repacked**: at load, ggml re-lays the tensors of some types into interleaved blocks of several rows
   (ggml/src/ggml-cpu/repack.cpp, ``ggml_repack_get_optimal_repack_type``: on x86 with AVX2, Q4_0 as
   ``q4_0_8x8``, Q4_K as ``q4_K_8x8``, IQ4_NL and MXFP4, Q2_K with AVX-512; on ARM other layouts) and multiplies them with a
   kernel that works on 8 rows at a time. llama.cpp logs each tensor it re-lays ("repack: repack tensor
   blk.0.attn_q.weight with q4_0_8x8"): this module reads that log, and keeps no list of its own.
2. **tinyBLAS**: llamafile's tiled matrix product (ggml/src/ggml-cpu/llamafile/sgemm.cpp,
   ``llamafile_sgemm``), in builds with ``LLAMAFILE = 1``, for products of 2 or more columns, for the types
   its ``switch`` has a kernel for on this CPU (:data:`TINYBLAS`).
3. **row by row**: ``ggml_vec_dot_<type>``, one dot product per weight row and prompt token, the kernel
   decode uses for every type (decode multiplies by one column: paths 1 and 2 add little there).

Measured on a 2-core Intel Xeon with AVX-512 (llama-cpp-python 0.3.36; ``lablib quantize``, the default model's
full ladder: 256 prompt tokens, 64 output tokens, medians of 3): prefill Q4_0 (repacked) 813 prompt tokens/s,
F32 (tinyBLAS) 670, Q8_0 (tinyBLAS) 646, Q5_0 (tinyBLAS) 524, Q4_1 (row by row) 340; ``perf`` put 75% of Q4_1's
prefill in ``ggml_vec_dot_q4_1_q8_1``. Decode 103, 34, 78, 73 and 94 tokens/s: there the bytes per token
weigh more than the path.
"""

from __future__ import annotations

import re

REPACKED, TINYBLAS_PATH, ROW_BY_ROW = "repacked", "tinyBLAS", "row by row"

# the weight types llamafile_sgemm has a kernel for (its switch on the weights' type, sgemm.cpp, as in the
# llama.cpp of llama-cpp-python 0.3.36), by the instruction sets llama.cpp's system info names: x86 with AVX (F16 with F16C or
# AVX512; BF16 with AVX2 or AVX512); ARM with NEON (Q8_0 and Q4_0 with the dot-product extension)
TINYBLAS = (
    ("AVX", None, ("F32",)),
    ("AVX", ("F16C", "AVX512"), ("F16",)),
    ("AVX", ("AVX2", "AVX512"), ("BF16",)),
    ("AVX", None, ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL")),
    ("NEON", None, ("F32", "F16")),
    ("NEON", ("DOTPROD",), ("Q8_0", "Q4_0")),
)

_REPACK_LINE = re.compile(r"repack tensor (\S+) with (\w+)")
# 2-D layer weights that no matrix product takes: convolution kernels (Mamba's ssm_conv1d, LFM2's shortconv.conv)
_NOT_MULTIPLIED = re.compile(r"conv")
# a mixture of experts' weights (ffn_gate_exps, ffn_up_exps, ffn_down_exps): ggml_compute_forward_mul_mat_id takes
# them one dot product per row, never through tinyBLAS (ggml-cpu.c); a re-laid expert tensor has its own kernel
_EXPERTS = "_exps."


def _flags(system_info: str) -> set[str]:
    """The features llama.cpp's system info reports on (:func:`lablib.build.llama.system_info_flags`)."""
    from lablib.build.llama import system_info_flags

    return set(system_info_flags(system_info))


def tinyblas_types(system_info: str) -> frozenset:
    """The weight types llamafile's tinyBLAS multiplies on the CPU and build ``system_info`` describes
    (llama.cpp's ``llama_print_system_info()``); empty when the build has no ``LLAMAFILE``."""
    flags = _flags(system_info)
    if "LLAMAFILE" not in flags:
        return frozenset()
    return frozenset(
        t for isa, extra, types in TINYBLAS if isa in flags and (extra is None or flags & set(extra)) for t in types
    )


def repacked_tensors(load_log: str) -> dict[str, str]:
    """{tensor name: layout} of the tensors llama.cpp re-laid at load, as its log says."""
    return dict(_REPACK_LINE.findall(load_log))


def layer_matrices(path) -> list[tuple[str, str, tuple]]:
    """(name, type, shape) of the layers' weight matrices of GGUF ``path``: its ``blk.*.weight`` tensors of two or
    more dimensions whose first two exceed 1 (norms, scales and sinks are vectors), convolution kernels left out
    (:data:`_NOT_MULTIPLIED`). Shapes as gguf reads them (ne0 first); read through the lab's one GGUF reader."""
    from lablib.model.formats import open_gguf

    reader, _ = open_gguf(path)
    out = []
    for t in reader.tensors:
        shape = tuple(int(d) for d in t.shape)
        if not (t.name.startswith("blk.") and t.name.endswith(".weight")) or _NOT_MULTIPLIED.search(t.name):
            continue
        if len(shape) >= 2 and shape[0] > 1 and shape[1] > 1:
            out.append((t.name, t.tensor_type.name, shape))
    return out


def matmul_kernels(matrices, load_log: str, system_info: str) -> dict[str, dict[str, int]]:
    """{weight type: {path: tensors}} of the layers' weight matrices of a GGUF llama.cpp loaded on the CPU.
    ``matrices``: (name, type, ...) of them (:func:`layer_matrices`); ``load_log``: what llama.cpp logged while
    loading it; ``system_info``: its ``llama_print_system_info()``. A path is ``repacked <layout>``,
    ``tinyBLAS`` or ``row by row`` (see the module's doc; a mixture of experts' weights never take tinyBLAS)."""
    repacked = repacked_tensors(load_log)
    tiny = tinyblas_types(system_info)
    out: dict[str, dict[str, int]] = {}
    for name, kind, *_ in matrices:
        if name in repacked:
            path = f"{REPACKED} {repacked[name]}"
        else:
            path = TINYBLAS_PATH if kind in tiny and _EXPERTS not in name else ROW_BY_ROW
        paths = out.setdefault(kind, {})
        paths[path] = paths.get(path, 0) + 1
    return out


def kernels_summary(kernels: dict[str, dict[str, int]]) -> str:
    """One line of :func:`matmul_kernels`, the most tensors first: 'Q5_0 tinyBLAS, Q4_K repacked q4_K_8x8';
    a type split over paths gives each its count: 'Q4_0 repacked q4_0_8x8 200 + tinyBLAS 10'."""
    parts = []
    for kind, paths in sorted(kernels.items(), key=lambda kv: -sum(kv[1].values())):
        ranked = sorted(paths.items(), key=lambda kv: -kv[1])
        text = ranked[0][0] if len(ranked) == 1 else " + ".join(f"{p} {n}" for p, n in ranked)
        parts.append(f"{kind} {text}")
    return ", ".join(parts)
