"""CMake flags from the probed extensions: x86-64-v3 for a portable wheel, CUDA where nvcc is found,
and the order in which extension families are switched off when a build dies here.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lablib.build.llama.probe import _PROBES, _is_x86

# Extension families switched off, in this order, when the built library crashes the smoke test.
FALLBACK: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AMX", ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")),
    ("AVX-512", ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")),
    ("AVX-VNNI", ("GGML_AVX_VNNI",)),
)


# x86-64-v3 (the x86-64 psABI's microarchitecture level 3, Intel Haswell / AMD Excavator and
# later, 2013-15): what a build for *other* machines may assume. Binder builds its image on one
# node and serves it on others; a wheelhouse built on the facilitator's laptop runs on the room's.
PORTABLE = frozenset({"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"})
# QEMU's model of an x86-64-v3 CPU (Intel Haswell: exactly those extensions), to check a portable
# wheel on a CPU other than this one (:func:`emulator`)
PORTABLE_CPU = "Haswell"


def cmake_args(features: dict[str, bool], portable: bool = False) -> str:
    """CMAKE_ARGS for llama-cpp-python from probed features ('' keeps defaults).

    ``portable``: only the extensions of :data:`PORTABLE` that also run here (no AVX-512,
    AVX-VNNI or AMX), for a wheel that runs on other x86-64-v3 machines too.
    """
    if portable and not features and _is_x86():
        # nothing probed (no compiler to probe with): still never ggml's -march=native default
        features = {opt: opt in PORTABLE for opt in _PROBES}
    if not features:
        return ""
    if portable:
        features = {opt: ok and opt in PORTABLE for opt, ok in features.items()}
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{opt}={'ON' if ok else 'OFF'}" for opt, ok in features.items()]
    return " ".join(args)


def gpu_cmake_args(portable: bool = False) -> str:
    """``-DGGML_CUDA=ON`` when an NVIDIA GPU is here (``nvidia-smi`` lists one) and so is the CUDA
    toolkit's compiler (``nvcc`` on PATH, in ``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``), and
    ``LABLIB_LLAMA_GPU`` is not "0"; else ''. A toolkit alone is not enough: images ship ``nvcc`` on
    machines without a GPU, where a CUDA build would compile for many minutes and offload nothing.
    A portable build stays CPU-only (its users' machines need not have CUDA)."""
    from lablib.machine.devices import nvidia_gpus

    if portable or os.environ.get("LABLIB_LLAMA_GPU", "1") == "0" or not nvidia_gpus():
        return ""
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc") or next(
        (str(p) for h in homes if h and (p := Path(h) / "bin" / "nvcc").is_file()), None
    )
    return "-DGGML_CUDA=ON" if nvcc else ""


def next_fallback(features: dict[str, bool]) -> tuple[str, dict[str, bool]] | None:
    """The first family of :data:`FALLBACK` still on in ``features``, and the features with it
    off; None when none is left to switch off."""
    for family, opts in FALLBACK:
        if any(features.get(o) for o in opts):
            return family, {k: (ok and k not in opts) for k, ok in features.items()}
    return None
