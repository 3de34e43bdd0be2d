"""Build llama-cpp-python for *this* CPU: fast paths on, only the ones that run.

Why: a default (``-march=native``) build of llama.cpp on a machine whose CPU
advertises AMX but whose sandbox or hypervisor does not grant it dies with
SIGILL (``tilezero``) on the first matrix product. A lowest-common-denominator
build runs everywhere but throws away AVX-512 and AMX where they work.

How: each x86 instruction-set extension that ggml can use is *executed* once
in a throw-away program (compiled with ``cc``); only extensions that run are
switched on (``-DGGML_NATIVE=OFF -DGGML_<FEATURE>=ON``). The flags are the
cache key of a wheel under ``$LABLIB_HOME/wheels/`` so a second set-up installs in
seconds. On non-x86 machines (Apple silicon, aarch64 Linux) the engine's own
defaults are kept.

Stdlib only: this module runs before the project is installed
(``python -m lablib.llama_build --install``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"

# ggml CMake option -> (gcc flags, C body executing one instruction of that set).
# Order matters only for readability; each probe is independent.
_PROBES: dict[str, tuple[str, str]] = {
    "GGML_SSE42": ("-msse4.2", "return _mm_crc32_u32(0u, (unsigned)argc) == 0x12345678u;"),
    "GGML_AVX": ("-mavx", "__m256 a = _mm256_set1_ps((float)argc); a = _mm256_add_ps(a, a);"
                 " return _mm256_cvtss_f32(a) == 0.f;"),
    "GGML_AVX2": ("-mavx2", "__m256i a = _mm256_set1_epi32(argc); a = _mm256_add_epi32(a, a);"
                  " return _mm256_extract_epi32(a, 0) == 0;"),
    "GGML_FMA": ("-mfma", "__m128 a = _mm_set1_ps((float)argc); a = _mm_fmadd_ps(a, a, a);"
                 " return _mm_cvtss_f32(a) == 0.f;"),
    "GGML_F16C": ("-mf16c", "__m128i h = _mm_cvtps_ph(_mm_set1_ps((float)argc), 0);"
                  " return _mm_cvtss_f32(_mm_cvtph_ps(h)) == 0.f;"),
    "GGML_BMI2": ("-mbmi2", "return _pdep_u32((unsigned)argc, 0xffu) == 0;"),
    "GGML_AVX_VNNI": ("-mavxvnni", "__m256i a = _mm256_set1_epi32(argc);"
                      " a = _mm256_dpbusd_avx_epi32(a, a, a); return _mm256_extract_epi32(a, 0) == 0;"),
    "GGML_AVX512": ("-mavx512f", "__m512 a = _mm512_set1_ps((float)argc); a = _mm512_add_ps(a, a);"
                    " return _mm512_reduce_add_ps(a) == 0.f;"),
    "GGML_AVX512_VBMI": ("-mavx512f -mavx512vbmi", "__m512i a = _mm512_set1_epi32(argc);"
                         " a = _mm512_permutexvar_epi8(a, a); return _mm512_reduce_add_epi32(a) == 0;"),
    "GGML_AVX512_VNNI": ("-mavx512f -mavx512vnni", "__m512i a = _mm512_set1_epi32(argc);"
                         " a = _mm512_dpbusd_epi32(a, a, a); return _mm512_reduce_add_epi32(a) == 0;"),
    "GGML_AVX512_BF16": ("-mavx512f -mavx512bf16", "__m512 a = _mm512_set1_ps((float)argc);"
                         " __m256bh b = _mm512_cvtneps_pbh(a); (void)b; return 0;"),
    # AMX needs the kernel's permission for the tile-data state before the first
    # tile instruction (arch_prctl ARCH_REQ_XCOMP_PERM); a sandbox may refuse it.
    "GGML_AMX_TILE": ("-mamx-tile", "_tile_zero(0); _tile_release(); return 0;"),
    "GGML_AMX_INT8": ("-mamx-tile -mamx-int8", "_tile_zero(0); _tile_zero(1); _tile_zero(2);"
                      " _tile_dpbssd(0, 1, 2); _tile_release(); return 0;"),
    "GGML_AMX_BF16": ("-mamx-tile -mamx-bf16", "_tile_zero(0); _tile_zero(1); _tile_zero(2);"
                      " _tile_dpbf16ps(0, 1, 2); _tile_release(); return 0;"),
}

_AMX_PRELUDE = r"""
#include <sys/syscall.h>
#include <unistd.h>
#include <string.h>
static int amx_setup(void) {
    /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 1;
    unsigned char cfg[64]; memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;                         /* palette 1 */
    for (int t = 0; t < 3; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
    _tile_loadconfig(cfg);
    return 0;
}
"""


class BuildError(RuntimeError):
    """The build cannot start here (no working C compiler); the message says what to install."""


def _probe(flags: str, body: str, cc: str, workdir: Path) -> bool:
    """Compile and run one probe; True when it compiled and exited 0."""
    amx = "amx" in flags
    src = "#include <immintrin.h>\n" + (_AMX_PRELUDE if amx else "")
    src += "int main(int argc, char **argv) { (void)argv;"
    src += (" if (amx_setup()) return 3; " if amx else " ") + body + " }\n"
    c_file, exe = workdir / "probe.c", workdir / "probe"
    c_file.write_text(src)
    built = subprocess.run([*shlex.split(cc), "-O0", *flags.split(), str(c_file), "-o", str(exe)],
                           capture_output=True)
    if built.returncode != 0:
        return False
    try:
        ran = subprocess.run([str(exe)], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return ran.returncode == 0  # SIGILL shows as -4


def probe_cpu_features(cc: str | None = None) -> dict[str, bool]:
    """Execute one instruction of each ggml x86 extension in a child process.

    Returns {ggml CMake option: runs here}. Empty on non-x86 machines or when
    no C compiler is found (then ggml's own defaults apply).
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return {}
    try:
        subprocess.run([*shlex.split(cc), "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"C compiler {cc!r} (CC or cc on PATH) does not run ({e}); llama-cpp-python builds "
                         "from source and needs one: install gcc (Debian/Ubuntu: apt install build-essential) "
                         "or set CC to a working compiler") from None
    with tempfile.TemporaryDirectory(prefix="lablib-probe-") as tmp:
        return {opt: _probe(flags, body, cc, Path(tmp)) for opt, (flags, body) in _PROBES.items()}


# x86-64-v3 (the x86-64 psABI's microarchitecture level 3, Intel Haswell / AMD Excavator and
# later, 2013-15): what a build for *other* machines may assume. Binder builds its image on one
# node and serves it on others; a wheelhouse built on the facilitator's laptop runs on the room's.
PORTABLE = frozenset({"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"})


def cmake_args(features: dict[str, bool], portable: bool = False) -> str:
    """CMAKE_ARGS for llama-cpp-python from probed features ('' keeps defaults).

    ``portable``: only the extensions of :data:`PORTABLE` that also run here (no AVX-512,
    AVX-VNNI or AMX), for a wheel that runs on other x86-64-v3 machines too.
    """
    if portable and not features and platform.machine().lower() in ("x86_64", "amd64"):
        # nothing probed (no compiler to probe with): still never ggml's -march=native default
        features = {opt: opt in PORTABLE for opt in _PROBES}
    if not features:
        return ""
    if portable:
        features = {opt: ok and opt in PORTABLE for opt, ok in features.items()}
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{opt}={'ON' if ok else 'OFF'}" for opt, ok in features.items()]
    return " ".join(args)


def wheel_cache_dir(root: Path, args: str) -> Path:
    """Folder holding the wheel built with ``args`` (key: package, flags, Python, arch)."""
    key = json.dumps([LLAMA_CPP_PYTHON, args, sys.version_info[:2], platform.machine()])
    return root / hashlib.sha256(key.encode()).hexdigest()[:16]


def build_wheel(cache_root: Path, args: str, log=print) -> Path:
    """Build (or reuse) the llama-cpp-python wheel for ``args``; returns its path."""
    out = wheel_cache_dir(cache_root, args)
    found = sorted(out.glob("llama_cpp_python-*.whl"))
    if found:
        log(f"llama-cpp-python: cached wheel {found[-1]}")
        return found[-1]
    out.mkdir(parents=True, exist_ok=True)
    (out / "cmake_args.txt").write_text(args + "\n")
    env = dict(os.environ, CMAKE_ARGS=args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))  # an existing value wins (Binder)
    log(f"llama-cpp-python: building from source (several minutes on 2 cores), CMAKE_ARGS={args!r}")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
                    "-w", str(out), LLAMA_CPP_PYTHON], env=env, check=True)
    return sorted(out.glob("llama_cpp_python-*.whl"))[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None,
                    help="wheel cache folder (default: $LABLIB_HOME/wheels, ~/.cache/lablib/wheels)")
    ap.add_argument("--install", action="store_true", help="pip install the wheel")
    ap.add_argument("--print-flags", action="store_true", help="only print CMAKE_ARGS")
    ap.add_argument("--portable", action="store_true",
                    help="only x86-64-v3 extensions (AVX2, FMA, F16C): a wheel for other machines too "
                         "(Binder's session nodes, a room's laptops)")
    ns = ap.parse_args(argv)
    try:
        features = probe_cpu_features()
    except BuildError as e:
        print(f"lablib.llama_build: {e}", file=sys.stderr)
        return 2
    args = cmake_args(features, portable=ns.portable)
    if ns.print_flags:
        print(args)
        return 0
    if features:
        print("CPU extensions that run here:",
              " ".join(k[5:] for k, ok in features.items() if ok) or "none",
              "| refused:", " ".join(k[5:] for k, ok in features.items() if not ok) or "none")
    from .config import lab_home

    wheel = build_wheel(Path(ns.cache) if ns.cache else lab_home() / "wheels", args)
    if ns.install:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                        "--force-reinstall", str(wheel)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
