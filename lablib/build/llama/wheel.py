"""The wheel: built from llama-cpp-python's source (its CMake tree kept for llama.cpp's tools), cached
by its flags, failures kept per machine, verified (probe, build, smoke test, fall back) and installed.

Standard library only (it runs before the lab is installed).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from lablib.build.llama.flags import cmake_args, cuda_facts, cuda_flags, next_fallback
from lablib.build.llama.probe import BuildError
from lablib.build.llama.smoke import default_model_path, smoke_test

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# Bump when the cache folder's layout changes (2: source and CMake build tree kept beside the wheel).
LAYOUT = 2
REPORT_NAME = "lablib-llama-build.json"  # in sys.prefix of the environment the wheel went into


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
    """llama-cpp-python's source distribution, unpacked in ``folder/src`` (kept for the tools).

    Only llama-cpp-python itself is asked for as source (``--no-binary llama-cpp-python``): the build
    requirements pip installs to read its metadata (scikit-build-core, pathspec, packaging) come as wheels, so a
    find-links folder of wheels and the sdist serves it with no index (``PIP_NO_INDEX=1
    PIP_FIND_LINKS=DIR``: a machine without network, as ``benchmarks/gpu_kit.py`` sets one up).
    ``--no-binary :all:`` would ask for those as source too, which no wheel folder holds."""
    src = folder / "src"
    if (src / "CMakeLists.txt").exists():
        return src
    with tempfile.TemporaryDirectory(prefix="lablib-sdist-") as tmp:
        log(f"llama-cpp-python: fetching the source distribution of {LLAMA_CPP_PYTHON}")
        got = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
                "--quiet",
                "-d",
                tmp,
                LLAMA_CPP_PYTHON,
            ],
        )
        if got.returncode != 0:  # pip's own words are above; not a failed CUDA build (verified_build's fallback)
            raise BuildError(
                f"pip could not fetch the source distribution of {LLAMA_CPP_PYTHON} or read its metadata (exit "
                f"{got.returncode}, its message above: a build requirement it could not get, cmake or ninja, is "
                "named there). Without network: download it where there is one (`pip download --no-deps "
                f"--no-binary llama-cpp-python {LLAMA_CPP_PYTHON} scikit-build-core pathspec packaging -d DIR`), "
                "carry DIR here and run again with PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR"
            )
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        shutil.rmtree(src, ignore_errors=True)
        shutil.move(str(next(p for p in Path(tmp).iterdir() if p.is_dir())), str(src))
    return src


def _build_env(args: str) -> dict:
    """The wheel's build environment: ``CMAKE_ARGS``; make's generator (the tools are built later in the same
    tree, :func:`llama_tool`), or Ninja where there is no ``make`` (an image with CMake and Ninja from pip);
    ``CMAKE_BUILD_PARALLEL_LEVEL`` every core unless set."""
    generator = "Unix Makefiles" if shutil.which("make") or not shutil.which("ninja") else "Ninja"
    env = dict(os.environ, CMAKE_ARGS=args, CMAKE_GENERATOR=generator)
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
    start = time.monotonic()
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
    log(f"llama-cpp-python: built in {wall_time(time.monotonic() - start)} (CMAKE_ARGS={args!r})")
    return sorted(out.glob("llama_cpp_python-*.whl"))[-1]


def wall_time(seconds: float) -> str:
    """A build's wall time as a person reads it: "48 s", "4 min 31 s"."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


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
    # an emulated CPU has no GPU; elsewhere CUDA for the GPUs present, or why not (the report keeps it for doctor)
    cuda = {"args": "", "reason": "an emulated CPU: no GPU"} if runner else cuda_flags(cuda_facts(), portable)
    gpu = cuda["args"]
    if gpu:
        log(f"llama-cpp-python: {cuda['reason']} ({gpu})")
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
                    "cuda": cuda["reason"],  # why CUDA is on (for which GPUs) or off
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


def system_info_flags(system_info: str) -> list[str]:
    """The names llama.cpp's ``llama_print_system_info()`` reports on, in its order ("CPU : SSE3 = 1 | AVX = 1 |
    ... | LLAMAFILE = 1 | REPACK = 1 |" -> ["SSE3", "AVX", ..., "LLAMAFILE", "REPACK"]): the CPU's extensions the
    library uses and its build features (:data:`_BUILD_FEATURES`)."""
    import re

    cpu = system_info.split("CPU :", 1)[-1]
    return [name for name, flag in re.findall(r"([A-Z][A-Z0-9_]+) = (\d)", cpu) if flag == "1"]


def describe(system_info: str, report: dict | None = None) -> str:
    """One line for ``lablib doctor``: the CPU extensions the loaded library uses (from its own
    ``llama_print_system_info``), and the families the build switched off, and why (``report``:
    :func:`build_report`)."""
    on = system_info_flags(system_info)
    features = [n for n in on if n in _BUILD_FEATURES]
    used = [n for n in on if n not in _BUILD_FEATURES]
    line = "uses " + (" ".join(used) or "no SIMD extension") + (f" (with {' '.join(features)})" if features else "")
    if report is None:
        return line + " (no build record in this environment: not installed by `python -m lablib.build.llama`)"
    dropped = "; ".join(f"{d['family']} switched off: {d['reason']}" for d in report.get("dropped", []))
    by_compiler = report.get("refused_by_compiler") or {}
    refused = " ".join(n for n in report.get("refused_by_probe", []) if n not in by_compiler)
    compiled = ""
    if by_compiler:  # one reason for the AMX family: the same compiler and set-up
        compiled = f"; off although this CPU runs them: {' '.join(by_compiler)} ({next(iter(by_compiler.values()))})"
    return (
        line + (f"; {dropped}" if dropped else "") + compiled + (f"; not run by this CPU: {refused}" if refused else "")
    )
