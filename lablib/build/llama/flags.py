"""CMake flags from the probed extensions: x86-64-v3 for a portable wheel, CUDA for the GPUs present where nvcc
is found, and the order in which extension families are switched off when a build dies here.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
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


# CUDA architectures (llama.cpp's ggml/src/ggml-cuda/CMakeLists.txt, in the tree llama-cpp-python 0.3.36 vendors):
# CMAKE_CUDA_ARCHITECTURES unset and GGML_NATIVE off (as the lab's CPU flags set it on x86) compile a default list in
# which a T4 (75), an A100 (80) and an H100/H200 (90) get PTX only, JIT-compiled by the driver at first load (and
# not at all by a driver older than the toolkit). The lab names the GPUs' own capabilities instead ("75" is machine
# code and PTX for 7.5 in CMake), or `native` (CMake asks nvcc which GPUs are here) when a capability is unknown.
NATIVE_NEEDS = {"nvcc": (11, 6), "cmake": (3, 24)}  # that CMakeLists' own condition for choosing `native`
# the oldest nvcc that compiles for a compute capability (that CMakeLists' comments: 86 needs CUDA 11.1, 89 and 90
# need 11.8, 120 needs 12.8; 121a-real from 12.9)
NVCC_FOR_CC = {(8, 6): (11, 1), (8, 9): (11, 8), (9, 0): (11, 8), (10, 0): (12, 8), (12, 0): (12, 8), (12, 1): (12, 9)}
# CUDA 13 removed offline compilation for Maxwell, Pascal and Volta (CUDA 13.0 release notes): below 7.5 it compiles nothing
NVCC_13_MIN_CC = (7, 5)


def _version(text) -> tuple[int, ...] | None:
    found = re.search(r"(\d+(?:\.\d+)+)", str(text or ""))
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


def _nvcc() -> str | None:
    """The CUDA toolkit's compiler: ``nvcc`` on PATH, in ``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``."""
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    return shutil.which("nvcc") or next(
        (str(p) for h in homes if h and (p := Path(h) / "bin" / "nvcc").is_file()), None
    )


def _tool_version(cmd: list[str], pattern: str) -> str | None:
    """The version ``cmd`` prints (``nvcc --version``: "release 13.0"; ``cmake --version``: "3.25.1"), or None."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(pattern, p.stdout + p.stderr)
    return found.group(1) if found else None


def cuda_facts() -> dict:
    """What :func:`cuda_flags` needs of this machine: the NVIDIA GPUs with their compute capability
    (:func:`lablib.machine.devices.nvidia_facts`; where it lists none, the GPUs ``nvidia-smi`` names, capability
    unknown), ``nvcc`` (its path or None), whether it is the one on PATH (``nvcc_on_path``; CMake finds only that
    one by itself) and its version, ``cmake``'s version (None: not on PATH; the wheel's build then fetches a recent
    one), and ``disabled`` (``LABLIB_LLAMA_GPU=0``)."""
    from lablib.machine.devices import nvidia_facts, nvidia_gpus

    found = nvidia_facts()
    gpus = found["gpus"] or [{"name": d.name, "compute_capability": None} for d in nvidia_gpus()]
    nvcc = _nvcc() if gpus else None
    return {
        "gpus": gpus,
        "nvcc": nvcc,
        "nvcc_on_path": bool(nvcc) and shutil.which("nvcc") == nvcc,
        "nvcc_version": _tool_version([nvcc, "--version"], r"release (\d+\.\d+)") if nvcc else None,
        "cmake_version": _tool_version(["cmake", "--version"], r"version (\d+\.\d+(?:\.\d+)?)") if gpus else None,
        "disabled": os.environ.get("LABLIB_LLAMA_GPU", "1") == "0",
    }


def cuda_flags(facts: dict, portable: bool = False) -> dict:
    """The CUDA part of CMAKE_ARGS for a machine with ``facts`` (:func:`cuda_facts`), and why. Pure.

    Returns ``{"args": "" | "-DGGML_CUDA=ON[ -DCMAKE_CUDA_ARCHITECTURES=...]", "archs": "90", "75;90", "native"
    or None, "reason"}``:

    - no NVIDIA GPU, ``LABLIB_LLAMA_GPU=0``, a portable build (its users' machines need not have CUDA) or no
      ``nvcc`` (a toolkit alone is not enough either: images ship nvcc on machines without a GPU, where a CUDA
      build would compile for many minutes and offload nothing): '' (the CPU build);
    - the GPUs' compute capabilities known: each once, without its dot ("9.0" -> 90; a T4 and an H200: "75;90");
    - one unknown: ``native`` when nvcc >= 11.6 and CMake >= 3.24 (or no cmake on PATH: the build fetches a
      recent one), else no architecture (llama.cpp's default list, slower to build, PTX only for some GPUs);
    - an nvcc known to be too old for a GPU (:data:`NVCC_FOR_CC`), or CUDA 13's nvcc with a GPU below 7.5: ''
      (the CPU build), with what to install; the build would fail after minutes of compiling.
    """
    gpus = facts.get("gpus") or []
    if portable:
        return {
            "args": "",
            "archs": None,
            "reason": "a portable build: CPU only (its users' machines need not have CUDA)",
        }
    if facts.get("disabled"):
        return {"args": "", "archs": None, "reason": "LABLIB_LLAMA_GPU=0: CPU only"}
    if not gpus:
        return {"args": "", "archs": None, "reason": "no NVIDIA GPU found: CPU only"}
    names = ", ".join(dict.fromkeys(g.get("name") or "an NVIDIA GPU" for g in gpus))
    if not facts.get("nvcc"):
        return {
            "args": "",
            "archs": None,
            "reason": f"{names} found, but no CUDA toolkit (nvcc on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin): "
            "CPU only; install the CUDA toolkit, then `python -m lablib.build.llama --install`",
        }
    ccs = [_version(g.get("compute_capability")) for g in gpus]
    nvcc = _version(facts.get("nvcc_version"))
    if nvcc is not None:
        for cc in dict.fromkeys(c[:2] for c in ccs if c):
            need = next((v for c, v in sorted(NVCC_FOR_CC.items(), reverse=True) if c <= cc and c[0] == cc[0]), None)
            if need and nvcc[:2] < need or (nvcc[0] >= 13 and cc < NVCC_13_MIN_CC):
                why = (
                    f"nvcc {facts['nvcc_version']} cannot compile for compute capability {cc[0]}.{cc[1]} ("
                    + (
                        f"it needs CUDA >= {need[0]}.{need[1]}"
                        if need and nvcc[:2] < need
                        else "CUDA 13 dropped Maxwell, Pascal and Volta"
                    )
                    + ")"
                )
                todo = "a newer CUDA toolkit" if need and nvcc[:2] < need else "a CUDA 12 toolkit"
                return {
                    "args": "",
                    "archs": None,
                    "reason": f"{names} found, but {why}: CPU only; install {todo}, then `python -m lablib.build.llama --install`",
                }
    if ccs and all(ccs):
        archs = ";".join(sorted({f"{c[0]}{c[1]}" for c in ccs}, key=int))
        why = f"{names}: CUDA for compute capability {', '.join(sorted({f'{c[0]}.{c[1]}' for c in ccs}, key=_version))} only"
    else:
        cmake = _version(facts.get("cmake_version"))
        native = (
            nvcc is not None
            and nvcc[:2] >= NATIVE_NEEDS["nvcc"]
            and (cmake is None or cmake[:2] >= NATIVE_NEEDS["cmake"])
        )
        archs = "native" if native else None
        why = (
            f"{names} (compute capability unknown): CUDA for the GPUs nvcc sees here (native)"
            if native
            else f"{names} (compute capability unknown) and `native` needs nvcc >= 11.6 and CMake >= 3.24 (nvcc "
            f"{facts.get('nvcc_version') or 'of unknown version'}, cmake {facts.get('cmake_version') or 'fetched'}): "
            "CUDA for llama.cpp's default list of architectures (slower to build; PTX only for some GPUs)"
        )
    args = "-DGGML_CUDA=ON" + (f" -DCMAKE_CUDA_ARCHITECTURES={archs}" if archs else "")
    if facts.get("nvcc_on_path") is False:  # /usr/local/cuda/bin/nvcc, not on PATH: CMake would find no CUDA compiler
        args += f" -DCMAKE_CUDA_COMPILER={facts['nvcc']}"
    return {"args": args, "archs": archs, "reason": why}


def gpu_cmake_args(portable: bool = False) -> str:
    """The CUDA part of CMAKE_ARGS for this machine (:func:`cuda_flags` of :func:`cuda_facts`): ``-DGGML_CUDA=ON``
    with ``-DCMAKE_CUDA_ARCHITECTURES`` for the GPUs present where an NVIDIA GPU and ``nvcc`` are and
    ``LABLIB_LLAMA_GPU`` is not "0"; else ''."""
    return cuda_flags(cuda_facts(), portable)["args"]


def next_fallback(features: dict[str, bool]) -> tuple[str, dict[str, bool]] | None:
    """The first family of :data:`FALLBACK` still on in ``features``, and the features with it
    off; None when none is left to switch off."""
    for family, opts in FALLBACK:
        if any(features.get(o) for o in opts):
            return family, {k: (ok and k not in opts) for k, ok in features.items()}
    return None
