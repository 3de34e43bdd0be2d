"""Which x86 extensions run here: each is executed once in a throw-away program (AMX as ggml's
kernels set it up); :func:`emulator` runs the probes and the smoke test on another x86 CPU under qemu-user.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

# ggml CMake option -> (gcc flags, C body executing one instruction of that set).
_PROBES: dict[str, tuple[str, str]] = {
    "GGML_SSE42": ("-msse4.2", "return _mm_crc32_u32(0u, (unsigned)argc) == 0x12345678u;"),
    "GGML_AVX": (
        "-mavx",
        "__m256 a = _mm256_set1_ps((float)argc); a = _mm256_add_ps(a, a); return _mm256_cvtss_f32(a) == 0.f;",
    ),
    "GGML_AVX2": (
        "-mavx2",
        "__m256i a = _mm256_set1_epi32(argc); a = _mm256_add_epi32(a, a); return _mm256_extract_epi32(a, 0) == 0;",
    ),
    "GGML_FMA": (
        "-mfma",
        "__m128 a = _mm_set1_ps((float)argc); a = _mm_fmadd_ps(a, a, a); return _mm_cvtss_f32(a) == 0.f;",
    ),
    "GGML_F16C": (
        "-mf16c",
        "__m128i h = _mm_cvtps_ph(_mm_set1_ps((float)argc), 0); return _mm_cvtss_f32(_mm_cvtph_ps(h)) == 0.f;",
    ),
    "GGML_BMI2": ("-mbmi2", "return _pdep_u32((unsigned)argc, 0xffu) == 0;"),
    "GGML_AVX_VNNI": (
        "-mavxvnni",
        "__m256i a = _mm256_set1_epi32(argc);"
        " a = _mm256_dpbusd_avx_epi32(a, a, a); return _mm256_extract_epi32(a, 0) == 0;",
    ),
    "GGML_AVX512": (
        "-mavx512f",
        "__m512 a = _mm512_set1_ps((float)argc); a = _mm512_add_ps(a, a); return _mm512_reduce_add_ps(a) == 0.f;",
    ),
    "GGML_AVX512_VBMI": (
        "-mavx512f -mavx512vbmi",
        "__m512i a = _mm512_set1_epi32(argc);"
        " a = _mm512_permutexvar_epi8(a, a); return _mm512_reduce_add_epi32(a) == 0;",
    ),
    "GGML_AVX512_VNNI": (
        "-mavx512f -mavx512vnni",
        "__m512i a = _mm512_set1_epi32(argc);"
        " a = _mm512_dpbusd_epi32(a, a, a); return _mm512_reduce_add_epi32(a) == 0;",
    ),
    "GGML_AVX512_BF16": (
        "-mavx512f -mavx512bf16",
        "__m512 a = _mm512_set1_ps((float)argc); __m256bh b = _mm512_cvtneps_pbh(a); (void)b; return 0;",
    ),
    "GGML_AMX_TILE": ("-mamx-tile", "_tile_zero(4);"),
    # tiles 4, 5, 6 are 16 rows x 64 bytes in the configuration below: shapes a dot product accepts
    "GGML_AMX_INT8": ("-mamx-tile -mamx-int8", "_tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_dpbssd(4, 5, 6);"),
    "GGML_AMX_BF16": ("-mamx-tile -mamx-bf16", "_tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_dpbf16ps(4, 5, 6);"),
}

# AMX probes mirror ggml-cpu/amx/mmq.cpp: C++, -O3, the tile configuration built in a struct on
# the stack and loaded with _tile_loadconfig (where g++ 12 drops the stores, this fails as ggml would).
_AMX_PROBE = r"""
#include <immintrin.h>
#include <cstdint>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config_t { uint8_t palette_id = 0; uint8_t start_row = 0; uint8_t reserved_0[14] = {0};
                       uint16_t colsb[16] = {0}; uint8_t rows[16] = {0}; };
__attribute__((noinline)) static void init_cfg() {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    for (int i = 0; i < 8; i++) { tc.rows[i] = i < 2 ? 8 : 16; tc.colsb[i] = (i == 2 || i == 3) ? 32 : 64; }
    _tile_loadconfig(&tc);
}
int main() {
    /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18: the kernel must grant tile data first */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 3;
    init_cfg();
    BODY
    _tile_release();
    return 0;
}
"""


class BuildError(RuntimeError):
    """The build cannot be made or verified here; the message says what to do."""


def _compiler(env: str, *names: str) -> str | None:
    return os.environ.get(env) or next((shutil.which(n) for n in names if shutil.which(n)), None)


def _probe(
    flags: str, body: str, cc: str, workdir: Path, cxx: str | None = None, runner: tuple = (), amx_opt: str = "-O3"
) -> bool:
    """Compile and run one probe (under ``runner``, an :func:`emulator`, if given); True when it
    compiled and exited 0 (a SIGILL shows as -4). ``amx_opt``: the AMX probes' optimisation (ggml's -O3)."""
    if "amx" in flags:
        if not cxx:
            return False
        src, comp, opt = _AMX_PROBE.replace("BODY", body), cxx, amx_opt
        source = workdir / "probe.cpp"
    else:
        src = "#include <immintrin.h>\nint main(int argc, char **argv) { (void)argv; " + body + " }\n"
        comp, opt, source = cc, "-O0", workdir / "probe.c"
    source.write_text(src)
    exe = workdir / "probe"
    built = subprocess.run([*shlex.split(comp), opt, *flags.split(), str(source), "-o", str(exe)], capture_output=True)
    if built.returncode != 0:
        return False
    try:
        ran = subprocess.run([*runner, str(exe)], capture_output=True, timeout=30 if runner else 10)
    except subprocess.TimeoutExpired:
        return False
    return ran.returncode == 0


def compiler_refusals(features: dict[str, bool], runner: tuple = ()) -> dict[str, str]:
    """{extension: why} for each AMX extension :func:`probe_cpu_features` refused although the CPU runs it: the
    same probe built at -O0 runs, so the instructions ran and the -O3 build (ggml's) broke them. On Intel Xeons
    with AMX, g++ 12 at -O3 drops the stores that fill the tile configuration before ``ldtilecfg``
    (``data/cases/amx_tile_config.cpp``), so ggml's AMX kernels would die where the CPU is fine. Empty where the
    -O0 probe fails too: the CPU (or its kernel, which must grant the tile state) does not run AMX."""
    refused = [k for k, ok in features.items() if not ok and k.startswith("GGML_AMX")]
    cxx = _compiler("CXX", "c++", "g++")
    if not refused or not cxx:
        return {}
    try:
        version = subprocess.run([*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=30)
        name = version.stdout.splitlines()[0] if version.stdout else cxx
    except (OSError, subprocess.SubprocessError):
        name = cxx
    why = f"its probe built at -O0 runs; {name} at -O3 breaks ggml's tile set-up (data/cases/amx_tile_config.cpp)"
    with tempfile.TemporaryDirectory(prefix="lablib-probe-") as tmp:
        return {
            k[5:]: why
            for k in refused
            if _probe(*_PROBES[k], cc=cxx, workdir=Path(tmp), cxx=cxx, runner=runner, amx_opt="-O0")
        }


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def probe_cpu_features(cc: str | None = None, runner: tuple = ()) -> dict[str, bool]:
    """Execute one instruction of each ggml x86 extension in a child process (under ``runner``,
    an :func:`emulator`, to probe another CPU).

    Returns {ggml CMake option: runs here}. Empty on non-x86 machines or when
    no C compiler is found (then ggml's own defaults apply). Raises BuildError
    when the compiler named by CC (or cc on PATH) does not run.
    """
    if not _is_x86():
        return {}
    cc = cc or _compiler("CC", "cc", "gcc")
    if not cc:
        return {}
    try:
        subprocess.run([*shlex.split(cc), "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(
            f"C compiler {cc!r} (CC or cc on PATH) does not run ({e}); llama-cpp-python builds "
            "from source and needs one: install gcc (Debian/Ubuntu: apt install build-essential) "
            "or set CC to a working compiler"
        ) from None
    cxx = _compiler("CXX", "c++", "g++")
    with tempfile.TemporaryDirectory(prefix="lablib-probe-") as tmp:
        return {opt: _probe(flags, body, cc, Path(tmp), cxx, runner) for opt, (flags, body) in _PROBES.items()}


def emulator(cpu: str) -> tuple[str, ...]:
    """The command prefix that runs an x86-64 program as on the CPU model ``cpu`` (QEMU's names,
    ``qemu-x86_64 -cpu help``: Haswell, EPYC-Rome, ...): ``("qemu-x86_64", "-cpu", cpu)``.

    qemu-user (Debian's package ``qemu-user``) translates each instruction and reports that
    model's CPUID, so a library's runtime dispatch (numpy, ggml) picks what that CPU would; QEMU 7.2
    executes up to AVX2, FMA and F16C, and no AVX-512, AVX-VNNI or AMX. Child processes of the
    emulated program run natively (qemu-user does not follow ``exec``). Raises BuildError when
    this machine is not x86-64, ``qemu-x86_64`` is missing, does not know ``cpu`` (case matters:
    EPYC-Rome), or ``cpu`` is a 32-bit model (486, pentium3) that cannot run x86-64 programs.
    """
    if not _is_x86():
        raise BuildError(
            f"emulating the CPU {cpu!r} (--cpu) runs this machine's Python and probes as x86-64 programs, "
            f"and this machine is {platform.machine()}: run it on an x86-64 machine"
        )
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        raise BuildError(
            f"emulating the CPU {cpu!r} needs qemu-user's qemu-x86_64, which is not installed: "
            "`apt-get install qemu-user` (Debian/Ubuntu)"
        )
    # the models are the lines "x86 NAME  description"; the rest of the help is prose and CPUID flags
    lines = subprocess.run([qemu, "-cpu", "help"], capture_output=True, text=True).stdout.splitlines()
    known = [w[1] for ln in lines if len(w := ln.split()) > 1 and w[0] == "x86"]
    if cpu not in known:
        meant = [k for k in known if k.lower() == str(cpu).lower()]
        raise BuildError(
            f"qemu-x86_64 knows no CPU model {cpu!r}{f' (did you mean {meant[0]!r}?)' if meant else ''}: "
            "`qemu-x86_64 -cpu help` lists them (Haswell, EPYC-Rome, ...)"
        )
    # some models are 32-bit CPUs (486, pentium3, base): qemu-x86_64 cannot run a 64-bit program on them
    ran = subprocess.run([qemu, "-cpu", cpu, shutil.which("true") or "/bin/true"], capture_output=True, text=True)
    if ran.returncode != 0:
        why = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
        raise BuildError(
            f"qemu-x86_64's CPU model {cpu!r} does not run x86-64 programs ({why}): "
            "pick a 64-bit one, e.g. Haswell or EPYC-Rome"
        )
    return (qemu, "-cpu", cpu)
