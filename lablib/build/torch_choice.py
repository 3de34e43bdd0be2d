"""Which torch ``make setup`` installs: the CPU build without an NVIDIA GPU (as always), the CUDA build of the
pinned version that this machine's driver runs, or the CUDA torch the machine already has.

:func:`choose_torch` is a pure function of what :func:`gather_facts` finds (the NVIDIA GPUs with their compute
capability, the driver's version, a torch already installed with its CUDA version, the OS and CPU architecture)
and of the pinned requirement (the Makefile's ``TORCH_SPEC``, or a ``TORCH_SPEC`` given on make's command line,
which is installed as given). In order:

1. ``TORCH_SPEC`` given: installed as given (a ``+cu126``-style local label brings PyTorch's index for it);
2. no NVIDIA GPU, or not Linux on x86-64/aarch64: the pinned requirement as it stands (``torch==2.13.0``: the CPU
   build where pip's configuration finds it first, as on this project's machines), exactly as before;
3. a CUDA torch already there that the lab's pins allow (``torch>=2.4,<2.14``), that the driver runs and that
   was built for the GPUs present: kept, no download (GPU images and hosted notebooks come with one); when it
   lives in the interpreter that makes the lab's venv, the venv is made with ``--system-site-packages``;
4. otherwise the newest CUDA build of the pinned version that the driver runs and that covers every GPU:
   ``torch==2.13.0+cu130`` from https://download.pytorch.org/whl/cu130 (driver >= 580), else
   ``torch==2.13.0+cu126`` from https://download.pytorch.org/whl/cu126 (driver >= 525; also the one for
   Maxwell, Pascal and Volta GPUs, which CUDA 13 dropped);
5. a GPU no build covers (a driver older than 525, compute capability below 5.0, the driver's version
   unreadable): the CPU build by name (``torch==2.13.0+cpu`` from https://download.pytorch.org/whl/cpu: the bare
   pin would be PyPI's CUDA build where pip finds PyPI first), with the reason and what to do.

Where the facts come from (looked up 2026-12; download.pytorch.org itself is out of reach from the machine
that wrote this, so its indexes were not listed here):

- the CUDA builds of torch 2.12, 2.13 and 2.14: PyTorch's RELEASE.md, "Release Compatibility Matrix" (2.13:
  stable CUDA 12.6 and 13.0, experimental 13.2) and "PyTorch CUDA Support Matrix" ("For Release 2.12, 2.13 and
  2.14": 12.6.3 builds Maxwell 5.0, Pascal 6.0, Volta 7.0, Turing 7.5, Ampere 8.0 and 8.6, Hopper 9.0; 13.0.2
  builds Turing 7.5 to Blackwell 10.0 and 12.0+PTX; on Linux aarch64 12.6 builds 8.0 and 9.0, 13.0 builds 8.0,
  9.0, 10.0, 11.0 and 12.0+PTX), https://github.com/pytorch/pytorch/pull/197555;
- PyPI's ``torch==2.13.0`` is the CUDA 13.0 build (its metadata, read here: ``Requires-Dist:
  cuda-toolkit[...]==13.0.3; platform_system == "Linux"``), and PyTorch's release note to Colab says the same
  (https://github.com/googlecolab/colabtools/issues/6053): on a machine whose pip finds PyPI first, a bare
  ``torch==2.13.0`` is several GB of CUDA 13; the lab names the local label (``+cu130``) and the index so that
  pip neither keeps an installed ``2.13.0+cpu`` (``==2.13.0`` matches it) nor picks a local CPU wheel;
- ``torch==2.13.0+cu126`` and ``+cu130`` from those indexes are what others install (found in public
  repositories' set-up notes); the experimental 13.2 build (cu132) and the 12.9 build cherry-picked for 2.13
  (cu129) are left out: neither is in the support matrix's stable columns;
- the driver each CUDA needs: NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility", Table 1
  (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): CUDA 13.x >= 580,
  CUDA 12.x >= 525 (525.60.13 on Linux, the CUDA 12 release notes), CUDA 11.x >= 450 (450.80.02);
- a GPU runs a build that holds machine code for its major version at an equal or lower minor (sm_86 runs on
  8.9, sm_60 on 6.1) or PTX of an equal or lower version (CUDA C Programming Guide, "Binary Compatibility").

    python -m lablib.build.torch_choice                  # the choice and why, as JSON
    python -m lablib.build.torch_choice --pip-args       # for make: the requirement and index (why on stderr)
    python -m lablib.build.torch_choice --install        # install it into this interpreter's environment

Standard library only: it runs before anything is installed (the Makefile runs it with the interpreter that
makes, or has made, the lab's venv).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SPEC = "torch==2.13.0"  # the Makefile's TORCH_SPEC (a test keeps them equal; make passes its own)
LAB_TORCH = ((2, 4), (2, 14))  # pyproject.toml's `torch>=2.4,<2.14`: a torch already there outside it is not kept
INDEX = "https://download.pytorch.org/whl/"
MACHINES = ("x86_64", "aarch64")  # PyTorch's Linux CUDA wheels
# the least driver for each CUDA major version (NVIDIA's minor version compatibility, Linux)
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}


@dataclass(frozen=True)
class CudaBuild:
    """One CUDA build of torch on PyTorch's index: its tag (``cu130``), CUDA version, and the compute
    capabilities it holds machine code for per CPU architecture (``+PTX``: the last one also as PTX)."""

    tag: str
    cuda: tuple[int, int]
    archs: dict[str, tuple[str, ...]]

    @property
    def index_url(self) -> str:
        return INDEX + self.tag

    @property
    def min_driver(self) -> tuple[int, ...]:
        return MIN_DRIVER[self.cuda[0]]


CU130 = CudaBuild(
    "cu130",
    (13, 0),
    {"x86_64": ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX"), "aarch64": ("8.0", "9.0", "10.0", "11.0", "12.0+PTX")},
)
CU126 = CudaBuild(
    "cu126",
    (12, 6),
    {"x86_64": ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"), "aarch64": ("8.0", "9.0")},
)
# the stable CUDA builds of each torch minor version the lab may pin, newest CUDA first (RELEASE.md)
CUDA_BUILDS = {(2, 12): (CU130, CU126), (2, 13): (CU130, CU126), (2, 14): (CU130, CU126)}


def _version(text) -> tuple[int, ...] | None:
    """(2, 13, 0) of "2.13.0+cu130"; (580, 65, 6) of "580.65.06"; None when it starts with no number."""
    found = re.match(r"\s*(\d+(?:\.\d+)*)", str(text or ""))
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def pinned_version(spec: str) -> str | None:
    """The version pinned by ``torch==2.13.0`` (or ``torch==2.13.0+cpu``): "2.13.0"; None for any other form."""
    found = re.fullmatch(r"\s*torch\s*==\s*(\d+(?:\.\d+)*)(?:\+[\w.]+)?\s*", spec or "")
    return found.group(1) if found else None


def covers(build: CudaBuild, machine: str, compute_capability) -> bool | None:
    """Whether ``build`` runs on a GPU of ``compute_capability`` ("8.9") on ``machine``: machine code of the same
    major version at an equal or lower minor, or PTX of an equal or lower version. None when the capability is
    unknown (an nvidia-smi too old to say)."""
    cc = _version(compute_capability)
    if cc is None:
        return None
    for arch in build.archs.get(machine, ()):
        have = _version(arch)[:2]
        if (have[0] == cc[0] and have[1] <= cc[1]) or (arch.endswith("+PTX") and have <= cc[:2]):
            return True
    return False


def _quoted(spec: str) -> str:
    """The requirement for a shell line, in double quotes as the Makefile always wrote it."""
    return f'"{spec}"' if not re.search(r'["$`\\]', spec) else shlex.quote(spec)


def _choice(action: str, spec: str, reason: str, index_url: str | None = None, build: str = "", **more) -> dict:
    return {
        "action": action,  # "install" | "keep"
        "spec": spec,
        "index_url": index_url,
        "build": build,  # "cpu" | "cu130" | ... | "as given" | "kept"
        "system_site_packages": False,
        "reason": reason,
        **more,
    }


def choose_torch(facts: dict, spec: str = DEFAULT_SPEC, given: bool = False) -> dict:
    """Which torch to install on a machine with ``facts`` (:func:`gather_facts`: ``gpus`` with ``name`` and
    ``compute_capability``, ``driver_version``, ``note`` (why no GPU was seen), ``system``, ``machine``,
    ``torch``: None or ``{"version", "cuda" (None: a CPU build), "where"}``, ``where`` being "lab-venv" (the lab's
    venv sees it), "system" (the interpreter that makes the venv has it) or "other-venv" (a venv the lab's venv
    cannot see into)). ``spec``: the pinned requirement (the Makefile's TORCH_SPEC); ``given``: TORCH_SPEC came
    from make's command line or the environment, and is installed as given. Pure: reads nothing else.

    Returns ``{"action": "install" | "keep", "spec", "index_url" (None: pip's own configuration),
    "build", "system_site_packages" (make the venv see the interpreter's packages: a kept torch lives there),
    "reason"}``; :func:`pip_args` turns it into pip's arguments."""
    gpus = facts.get("gpus") or []
    driver_text = facts.get("driver_version") or next((g.get("driver_version") for g in gpus), None)
    driver = _version(driver_text)
    system, machine = facts.get("system") or "?", facts.get("machine") or "?"
    names = ", ".join(dict.fromkeys(g.get("name") or "an NVIDIA GPU" for g in gpus))
    ccs = [g.get("compute_capability") for g in gpus]
    seen = f"{names} (compute capability {', '.join(c or '?' for c in dict.fromkeys(ccs))}), driver {driver_text or 'of unknown version'}"
    as_before = f"{spec} as always (the CPU build where pip's configuration finds it first)"

    if given:
        label = re.search(r"\+(cu\d+|cpu|rocm[\d.]+)\s*$", spec or "")
        index = INDEX + label.group(1) if label else None
        return _choice(
            "install",
            spec,
            f"TORCH_SPEC={spec} given: installed as given"
            + (f", from {index}" if index else "")
            + (f" ({seen} here)" if gpus else ""),
            index,
            "as given",
        )
    if not gpus:
        how = f" ({facts['note']})" if facts.get("note") else ""
        return _choice("install", spec, f"no NVIDIA GPU found{how}: {as_before}", build="cpu")
    if system != "Linux" or machine not in MACHINES:
        return _choice(
            "install",
            spec,
            f"{names} found, but PyTorch's CUDA wheels are for Linux on {' and '.join(MACHINES)} and this is "
            f"{system} {machine}: {as_before}",
            build="cpu",
        )

    # a CUDA torch already here: keep it when the lab's pins allow it, the driver runs it and it covers the GPUs
    torch = facts.get("torch") or None
    not_kept = ""
    if torch:
        tv, cuda = _version(torch.get("version")), _version(torch.get("cuda"))
        where = torch.get("where")
        problem = None
        if cuda is None:
            problem = "a CPU-only build"
        elif tv is None or not (LAB_TORCH[0] <= tv[:2] < LAB_TORCH[1]):
            problem = f"outside the lab's pins (torch>={_dotted(LAB_TORCH[0])},<{_dotted(LAB_TORCH[1])})"
        elif driver is None or cuda[0] not in MIN_DRIVER or driver < MIN_DRIVER[cuda[0]]:
            need = _dotted(MIN_DRIVER[cuda[0]]) if cuda[0] in MIN_DRIVER else "an unknown version"
            problem = f"built for CUDA {torch['cuda']}, which needs a driver >= {need}"
        elif cuda[:2] >= (12, 8) and any(c is not None and _version(c)[:2] < (7, 5) for c in ccs):
            problem = f"built for CUDA {torch['cuda']}, which PyTorch builds for compute capability 7.5 and up only"
        elif where == "other-venv":
            problem = "in another venv, whose packages a new venv cannot see"
        if problem is None:
            keep = f"torch=={torch['version']}"
            return _choice(
                "keep",
                keep,
                f"{seen}: torch {torch['version']} (CUDA {torch['cuda']}) is already here and runs on it: kept, "
                "nothing downloaded"
                + (" (the lab's venv is made to see this interpreter's packages)" if where == "system" else ""),
                build="kept",
                system_site_packages=where == "system",
            )
        not_kept = f"torch {torch.get('version')} here is {problem}, so not kept; "

    version = pinned_version(spec)
    builds = CUDA_BUILDS.get(_version(version)[:2], ()) if version else ()
    if not builds:
        return _choice(
            "install",
            spec,
            f"{seen}: {not_kept}the lab knows no CUDA build of {spec} to choose from: installed as it stands",
            build="as given",
        )
    # the CPU build by name where a GPU is here: the bare pin would be PyPI's CUDA build wherever pip finds PyPI first
    cpu_spec, cpu_index = f"torch=={version}+cpu", INDEX + "cpu"
    if driver is None:
        return _choice(
            "install",
            cpu_spec,
            f"{seen}: {not_kept}the driver's version could not be read (NVML and nvidia-smi gave none), so no "
            f"CUDA build can be chosen: the CPU build, {cpu_spec} from {cpu_index}. To do: check that `nvidia-smi` "
            f"runs, or name the build: make setup TORCH_SPEC=torch=={version}+{builds[-1].tag}",
            cpu_index,
            "cpu",
        )
    misses = []
    for b in builds:
        cover = [covers(b, machine, c) for c in ccs]
        if driver >= b.min_driver and all(c is not False for c in cover):
            unknown = " (the GPU's compute capability is unknown: assumed covered)" if None in cover else ""
            why = (
                f"the newest stable CUDA build of torch {version} that driver {driver_text} runs "
                f"(CUDA {_dotted(b.cuda)} needs >= {_dotted(b.min_driver)}) and that holds code for "
                f"compute capability {', '.join(c or '?' for c in dict.fromkeys(ccs))}{unknown}"
                + (f" ({'; '.join(misses)})" if misses else "")
            )
            spec_cuda = f"torch=={version}+{b.tag}"
            return _choice(
                "install", spec_cuda, f"{seen}: {not_kept}{spec_cuda} from {b.index_url}: {why}", b.index_url, b.tag
            )
        if driver < b.min_driver:
            misses.append(f"{b.tag} needs a driver >= {_dotted(b.min_driver)}")
        else:
            bad = [c for c, ok in zip(ccs, cover) if ok is False]
            misses.append(f"{b.tag} holds no code for compute capability {', '.join(dict.fromkeys(bad))}")
    newest = builds[0]
    todo = (
        f"upgrade the NVIDIA driver (to {_dotted(newest.min_driver)} or later for {newest.tag})"
        if all(driver < b.min_driver for b in builds)
        else "use a GPU PyTorch still builds for"
    )
    return _choice(
        "install",
        cpu_spec,
        f"{seen}: {not_kept}no CUDA build of torch {version} runs here ({'; '.join(misses)}): the CPU build, "
        f"{cpu_spec} from {cpu_index}, computing on the CPU. To do: {todo}, then `make setup` again",
        cpu_index,
        "cpu",
    )


def pip_args(choice: dict) -> list[str]:
    """pip install's arguments for ``choice``: the requirement, then ``--index-url`` when it names one."""
    return [choice["spec"], *(["--index-url", choice["index_url"]] if choice.get("index_url") else [])]


# --- what this machine has ------------------------------------------------------------------------


def _torch_cuda(version_py: Path) -> str | None:
    """``cuda`` as torch/version.py sets it ("13.0"; None for a CPU build), read without importing torch."""
    try:
        tree = ast.parse(version_py.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "cuda" and getattr(node, "value", None) is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return str(value) if value else None
    return None


def installed_torch(venv: str | os.PathLike | None = None) -> dict | None:
    """The torch this interpreter would import, without importing it: ``{"version", "cuda", "path", "where"}``
    (``where``: "lab-venv" when this interpreter is the lab's ``venv`` (None: this interpreter's own environment is
    the one set up); "system" when it is no venv, so a venv it makes with ``--system-site-packages`` sees this
    torch; "other-venv" otherwise), or None."""
    from importlib import metadata

    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file("torch"))
    prefix = Path(sys.prefix).resolve()
    if prefix == Path(venv if venv is not None else sys.prefix).resolve():
        where = "lab-venv"
    elif sys.prefix == sys.base_prefix:
        where = "system"
    else:
        where = "other-venv"
    return {"version": dist.version, "cuda": _torch_cuda(path / "version.py"), "path": str(path), "where": where}


def gather_facts(venv: str | os.PathLike | None = None) -> dict:
    """What :func:`choose_torch` needs of this machine: :func:`lablib.machine.devices.nvidia_facts` (GPUs, their
    compute capability, the driver), ``system``, ``machine``, ``python`` and ``torch`` (:func:`installed_torch`)."""
    from lablib.machine.devices import nvidia_facts

    return {
        **nvidia_facts(),
        "system": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": installed_torch(venv),
    }


def install(choice: dict, log=print) -> int:
    """pip-install ``choice`` into this interpreter's environment (nothing when it keeps the torch there)."""
    log(f"torch: {choice['reason']}")
    if choice["action"] == "keep":
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--no-compile", *pip_args(choice)]
    log("torch: " + " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Which torch set-up installs here (the CPU or a CUDA build), and why.")
    ap.add_argument(
        "--spec", default=DEFAULT_SPEC, help=f"the pinned requirement (the Makefile's TORCH_SPEC: {DEFAULT_SPEC})"
    )
    ap.add_argument("--given", action="store_true", help="--spec was given by the user: install it as given")
    ap.add_argument("--venv", default=None, help="the lab's venv (the Makefile's VENV; default: this interpreter's)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--pip-args", action="store_true", help="print pip install's arguments (the reason on stderr)")
    mode.add_argument("--venv-args", action="store_true", help="print `python -m venv`'s extra arguments")
    mode.add_argument("--install", action="store_true", help="install the choice into this environment")
    ns = ap.parse_args(argv)
    try:
        choice = choose_torch(gather_facts(ns.venv), ns.spec, ns.given)
    except Exception as e:  # noqa: BLE001 - set-up goes on with the pinned requirement, and says why
        choice = _choice("install", ns.spec, f"the choice failed ({type(e).__name__}: {e}): {ns.spec} as it stands")
    if ns.pip_args:
        print(f"torch for this machine: {choice['reason']}", file=sys.stderr)
        print(" ".join(_quoted(a) if i == 0 else shlex.quote(a) for i, a in enumerate(pip_args(choice))))
    elif ns.venv_args:
        print("--system-site-packages" if choice["system_site_packages"] else "")
    elif ns.install:
        return install(choice)
    else:
        print(json.dumps(choice, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
