"""What set-up decides on a GPU machine, from what it finds there (issue 37, item 1): which torch
(lablib.build.torch_choice.choose_torch), which llama.cpp CUDA flags (lablib.build.llama.flags.cuda_flags), and
what `lablib doctor` warns of (lablib.engines.doctor.gpu_build_warnings): pure functions fed the facts of machines
the lab meets, and this machine as it is (no GPU: exactly the set-up it always had).

No network, no install, no GPU: a GPU machine here is its facts (and, for the gathering, a stand-in nvidia-smi
and nvcc on PATH, as tests/test_llama_build.py and tests/test_devices.py use them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lablib.build import torch_choice
from lablib.build.llama import flags, tools, wheel
from lablib.engines.doctor import gpu_build_facts, gpu_build_warnings
from lablib.machine import devices

ROOT = Path(__file__).resolve().parent.parent


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*\??=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"{name} not set in the Makefile"
    return m.group(1)


def _machine(*gpus, driver=None, torch=None, system="Linux", machine="x86_64"):
    """gather_facts()'s dict: ``gpus`` as (name, compute capability) pairs, the driver, a torch already there."""
    found = [{"name": n, "memory_bytes": 0, "compute_capability": cc, "driver_version": driver} for n, cc in gpus]
    return {
        "gpus": found,
        "driver_version": driver if gpus else None,
        "seen_by": "nvidia-smi" if gpus else None,
        "note": None if gpus else "nvidia-smi not found",
        "system": system,
        "machine": machine,
        "python": "3.11.7",
        "torch": torch,
    }


NO_GPU = _machine()
H200 = ("NVIDIA H200", "9.0")
T4 = ("Tesla T4", "7.5")
SPEC = "torch==2.13.0"  # the Makefile's TORCH_SPEC (test_the_pins_are_the_makefiles_and_pyprojects)
CU130 = "https://download.pytorch.org/whl/cu130"
CU126 = "https://download.pytorch.org/whl/cu126"


def _program(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


# --- torch ----------------------------------------------------------------------------------------


def test_the_pins_are_the_makefiles_and_pyprojects():
    assert torch_choice.DEFAULT_SPEC == makefile_var("TORCH_SPEC") == SPEC
    pin = re.search(r'"torch>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin and torch_choice.LAB_TORCH == tuple(tuple(map(int, v.split("."))) for v in pin.groups())
    assert torch_choice.pinned_version(SPEC) == "2.13.0" and torch_choice.pinned_version("torch>=2.4") is None


def test_no_gpu_installs_todays_spec_from_pips_own_configuration():
    c = torch_choice.choose_torch(NO_GPU, SPEC)
    assert (c["action"], c["spec"], c["index_url"], c["build"]) == ("install", SPEC, None, "cpu")
    assert torch_choice.pip_args(c) == [SPEC] and not c["system_site_packages"]
    assert c["reason"].startswith("no NVIDIA GPU found (nvidia-smi not found): torch==2.13.0 as always")
    # a torch already there changes nothing without a GPU (pip finds it installed or installs the pin)
    cpu = {"version": "2.13.0+cpu", "cuda": None, "where": "lab-venv"}
    assert torch_choice.pip_args(torch_choice.choose_torch(_machine(torch=cpu), SPEC)) == [SPEC]
    # an NVIDIA GPU where PyTorch has no CUDA wheels: as without one
    mac = torch_choice.choose_torch(_machine(H200, driver="580.1", system="Darwin", machine="arm64"), SPEC)
    assert mac["spec"] == SPEC and mac["index_url"] is None and "Darwin arm64" in mac["reason"]


def test_an_h200_on_driver_580_without_torch_gets_the_cuda_13_build():
    c = torch_choice.choose_torch(_machine(H200, driver="580.159.04"), SPEC)
    assert torch_choice.pip_args(c) == ["torch==2.13.0+cu130", "--index-url", CU130]
    assert c["build"] == "cu130" and c["action"] == "install" and not c["system_site_packages"]
    assert "NVIDIA H200 (compute capability 9.0), driver 580.159.04" in c["reason"]
    assert "CUDA 13.0 needs >= 580" in c["reason"]


def test_a_t4_on_driver_535_gets_the_cuda_12_build():
    c = torch_choice.choose_torch(_machine(T4, driver="535.230.02"), SPEC)  # Colab's T4
    assert torch_choice.pip_args(c) == ["torch==2.13.0+cu126", "--index-url", CU126]
    assert "CUDA 12.6 needs >= 525.60.13" in c["reason"] and "cu130 needs a driver >= 580" in c["reason"]
    # Pascal on a new driver: CUDA 13 dropped it, the CUDA 12.6 build still holds code for it (sm_60 runs on 6.1)
    gtx = torch_choice.choose_torch(_machine(("NVIDIA GeForce GTX 1080", "6.1"), driver="580.65.06"), SPEC)
    assert gtx["build"] == "cu126" and "cu130 holds no code for compute capability 6.1" in gtx["reason"]
    # two GPUs: the build must hold code for both
    both = torch_choice.choose_torch(_machine(T4, ("Tesla P100-PCIE-16GB", "6.0"), driver="590.44.01"), SPEC)
    assert both["build"] == "cu126"
    assert torch_choice.choose_torch(_machine(T4, H200, driver="590.44.01"), SPEC)["build"] == "cu130"


def test_a_cuda_torch_already_here_is_kept():
    colab = {"version": "2.11.0+cu130", "cuda": "13.0", "where": "system"}  # the interpreter that makes the venv
    c = torch_choice.choose_torch(_machine(H200, driver="580.159.04", torch=colab), SPEC)
    assert (c["action"], c["build"], c["index_url"]) == ("keep", "kept", None)
    assert torch_choice.pip_args(c) == ["torch==2.11.0+cu130"]  # pip finds it installed: nothing downloaded
    assert c["system_site_packages"] and "kept, nothing downloaded" in c["reason"]
    # already in the lab's venv (set-up run again): kept, the venv as it is
    again = dict(colab, where="lab-venv", version="2.13.0+cu126", cuda="12.6")
    c = torch_choice.choose_torch(_machine(T4, driver="535.230.02", torch=again), SPEC)
    assert c["action"] == "keep" and not c["system_site_packages"] and c["spec"] == "torch==2.13.0+cu126"


@pytest.mark.parametrize(
    "torch, driver, why, build",
    [
        ({"version": "2.13.0+cpu", "cuda": None}, "580.159.04", "is a CPU-only build", "cu130"),
        ({"version": "2.14.0", "cuda": "13.0"}, "580.159.04", "outside the lab's pins (torch>=2.4,<2.14)", "cu130"),
        ({"version": "2.11.0+cu130", "cuda": "13.0"}, "535.230.02", "CUDA 13.0, which needs a driver >= 580", "cu126"),
        ({"version": "2.11.0+cu130", "cuda": "13.0", "where": "other-venv"}, "580.1", "in another venv", "cu130"),
    ],
)
def test_a_torch_already_here_that_cannot_serve_is_not_kept(torch, driver, why, build):
    c = torch_choice.choose_torch(_machine(H200, driver=driver, torch={"where": "system", **torch}), SPEC)
    assert c["action"] == "install" and c["build"] == build and not c["system_site_packages"]
    assert f"torch {torch['version']} here is " in c["reason"] and why in c["reason"]


def test_torch_spec_given_is_installed_as_given():
    for machine in (NO_GPU, _machine(H200, driver="580.159.04"), _machine(T4, driver="470.1")):
        c = torch_choice.choose_torch(machine, "torch==2.12.0", given=True)
        assert torch_choice.pip_args(c) == ["torch==2.12.0"] and "TORCH_SPEC=torch==2.12.0 given" in c["reason"]
    # a local label names its PyTorch index; a CUDA torch already here does not stop it
    kept = {"version": "2.11.0+cu130", "cuda": "13.0", "where": "system"}
    c = torch_choice.choose_torch(_machine(H200, driver="580.1", torch=kept), "torch==2.13.0+cu126", given=True)
    assert torch_choice.pip_args(c) == ["torch==2.13.0+cu126", "--index-url", CU126] and c["action"] == "install"
    c = torch_choice.choose_torch(NO_GPU, "torch==2.13.0+cpu", given=True)
    assert c["index_url"] == "https://download.pytorch.org/whl/cpu"


def test_a_gpu_no_build_runs_on_gets_the_cpu_build_with_the_reason_and_what_to_do():
    old = torch_choice.choose_torch(_machine(T4, driver="470.256.02"), SPEC)  # the R470 branch: CUDA 11.4
    # the CPU build by name: beside a GPU the bare pin would be PyPI's CUDA build where pip finds PyPI first
    cpu = "https://download.pytorch.org/whl/cpu"
    assert torch_choice.pip_args(old) == ["torch==2.13.0+cpu", "--index-url", cpu] and old["build"] == "cpu"
    assert "cu130 needs a driver >= 580; cu126 needs a driver >= 525.60.13" in old["reason"]
    assert "upgrade the NVIDIA driver (to 580 or later for cu130)" in old["reason"]
    kepler = torch_choice.choose_torch(_machine(("Tesla K80", "3.7"), driver="525.147.05"), SPEC)
    assert kepler["build"] == "cpu" and "cu126 holds no code for compute capability 3.7" in kepler["reason"]
    assert "use a GPU PyTorch still builds for" in kepler["reason"]
    unread = torch_choice.choose_torch(_machine(H200, driver=None), SPEC)
    assert (unread["spec"], unread["index_url"]) == ("torch==2.13.0+cpu", cpu)
    assert "driver's version could not be read" in unread["reason"]
    assert "make setup TORCH_SPEC=torch==2.13.0+cu126" in unread["reason"]


def test_which_compute_capabilities_a_build_covers():
    cu126, cu130 = torch_choice.CU126, torch_choice.CU130
    assert torch_choice.covers(cu126, "x86_64", "8.9") and torch_choice.covers(cu126, "x86_64", "6.1")  # same major
    assert (
        torch_choice.covers(cu126, "x86_64", "10.0") is False and torch_choice.covers(cu126, "x86_64", "3.7") is False
    )
    assert torch_choice.covers(cu130, "x86_64", "12.1") and torch_choice.covers(cu130, "x86_64", "7.0") is False
    assert torch_choice.covers(cu126, "aarch64", "7.5") is False and torch_choice.covers(cu130, "aarch64", "11.0")
    assert torch_choice.covers(cu130, "x86_64", None) is None
    # a GPU whose capability nvidia-smi does not say: the driver decides, and the reason says it was assumed
    c = torch_choice.choose_torch(_machine(("Tesla T4", None), driver="580.1"), SPEC)
    assert c["build"] == "cu130" and "assumed covered" in c["reason"]


def test_the_torch_already_installed_is_read_without_importing_it(tmp_path):
    version_py = tmp_path / "version.py"
    version_py.write_text("from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    assert torch_choice._torch_cuda(version_py) == "13.0"
    version_py.write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert torch_choice._torch_cuda(version_py) is None
    here = torch_choice.installed_torch()  # this interpreter's own environment is the one set up
    assert here is None or (here["where"] == "lab-venv" and here["version"])
    if here and "torch" in sys.modules:
        assert here["cuda"] == sys.modules["torch"].version.cuda


def _no_gpu_here() -> bool:
    return not devices.nvidia_facts()["gpus"] and not devices.nvidia_gpus()


def _make_env() -> dict:
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "TORCH_SPEC")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.skipif(not _no_gpu_here(), reason="this machine has an NVIDIA GPU")
def test_this_machine_has_no_gpu_and_set_up_installs_exactly_what_it_always_did():
    facts = torch_choice.gather_facts()
    assert facts["gpus"] == [] and facts["system"]
    c = torch_choice.choose_torch(facts, makefile_var("TORCH_SPEC"))
    assert torch_choice.pip_args(c) == ["torch==2.13.0"] and c["index_url"] is None
    # the command the Makefile runs, and the line it expands to (-W: as if the Makefile were new, so make prints
    # the set-up's recipe; -n: runs none of it)
    p = subprocess.run(
        [sys.executable, "-m", "lablib.build.torch_choice", "--pip-args", "--spec", "torch==2.13.0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.stdout == '"torch==2.13.0"\n' and "no NVIDIA GPU found" in p.stderr
    dry = subprocess.run(
        ["make", "-n", "-W", "Makefile", "setup"], capture_output=True, text=True, cwd=ROOT, env=_make_env(), timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert '.venv/bin/python -m pip install --quiet --no-compile "torch==2.13.0"' in lines
    assert any(re.fullmatch(r"test -x \.venv/bin/python \|\| \S+ -m venv \.venv", line) for line in lines)
    given = subprocess.run(
        ["make", "-n", "-W", "Makefile", "setup", "TORCH_SPEC=torch==2.12.0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_make_env(),
        timeout=60,
    )
    assert '.venv/bin/python -m pip install --quiet --no-compile "torch==2.12.0"' in given.stdout.splitlines()
    assert "TORCH_SPEC=torch==2.12.0 given" in given.stderr


def test_the_venv_is_made_to_see_a_kept_system_torch(tmp_path, monkeypatch):
    """``--venv-args`` and ``--pip-args`` on a stand-in GPU machine (nvidia-smi on PATH) whose torch is this
    interpreter's: kept where it is a CUDA build, the pinned CUDA build otherwise."""
    _program(tmp_path, "nvidia-smi", 'echo "NVIDIA H200, 143771, 9.0, 580.159.04"')
    env = dict(_make_env(), PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    args = [sys.executable, "-m", "lablib.build.torch_choice", "--spec", SPEC, "--venv", str(tmp_path / "new-venv")]
    out = {
        mode: subprocess.run([*args, mode], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        for mode in ("--pip-args", "--venv-args")
    }
    here = torch_choice.installed_torch(tmp_path / "new-venv")
    if here and here["cuda"] and here["where"] == "system":
        assert out["--pip-args"].stdout.strip() == f'"torch=={here["version"]}"'
        assert out["--venv-args"].stdout.strip() == "--system-site-packages"
    else:  # this project's machines: a CPU torch (or none), in a venv
        assert out["--pip-args"].stdout.strip() == f'"torch==2.13.0+cu130" --index-url {CU130}'
        assert out["--venv-args"].stdout.strip() == ""
    assert "NVIDIA H200" in out["--pip-args"].stderr


# --- llama.cpp's CUDA flags -----------------------------------------------------------------------


def _cuda(*ccs, nvcc="/usr/local/cuda/bin/nvcc", nvcc_version="12.4", cmake="3.28.3", disabled=False):
    return {
        "gpus": [{"name": n, "compute_capability": cc} for n, cc in ccs],
        "nvcc": nvcc,
        "nvcc_version": nvcc_version,
        "cmake_version": cmake,
        "disabled": disabled,
    }


def test_llama_cpp_is_built_for_the_compute_capability_of_one_gpu():
    f = flags.cuda_flags(_cuda(H200, nvcc_version="13.0"))
    assert f["args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" and f["archs"] == "90"
    assert "NVIDIA H200: CUDA for compute capability 9.0 only" == f["reason"]
    assert flags.cuda_flags(_cuda(T4))["args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75"
    blackwell = flags.cuda_flags(_cuda(("NVIDIA GeForce RTX 5090", "12.0"), nvcc_version="12.8"))
    assert blackwell["archs"] == "120"  # llama.cpp's CMakeLists makes it 120a itself


def test_an_nvcc_off_path_is_named_to_cmake():
    """nvcc found in /usr/local/cuda/bin but not on PATH (an image's toolkit): CMake looks only on PATH and would
    find no CUDA compiler, so the build names it."""
    facts = {**_cuda(H200, nvcc_version="13.0"), "nvcc_on_path": False}
    assert flags.cuda_flags(facts)["args"] == (
        "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
    )
    on_path = {**facts, "nvcc_on_path": True}
    assert flags.cuda_flags(on_path)["args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"


def test_the_wheels_build_uses_make_or_ninja_where_make_is_missing(tmp_path, monkeypatch):
    """An image with CMake and Ninja from pip and no make: the Makefile generator would fail the build."""
    from lablib.build.llama import wheel

    for tool in ("make", "ninja"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert wheel._build_env("-DX=1")["CMAKE_GENERATOR"] == "Unix Makefiles"
    (tmp_path / "make").unlink()
    assert wheel._build_env("-DX=1")["CMAKE_GENERATOR"] == "Ninja"


def test_llama_cpp_is_built_for_every_gpu_of_several():
    assert flags.cuda_flags(_cuda(H200, T4))["args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75;90"
    assert flags.cuda_flags(_cuda(H200, H200))["archs"] == "90"  # each capability once
    assert flags.cuda_flags(_cuda(("RTX 5090", "12.0"), ("L4", "8.9"), nvcc_version="12.8"))["archs"] == "89;120"


def test_an_unknown_compute_capability_builds_native_where_nvcc_and_cmake_can():
    unknown = ("Tesla T4", None)
    f = flags.cuda_flags(_cuda(unknown))
    assert f["args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native" and "(native)" in f["reason"]
    assert flags.cuda_flags(_cuda(unknown, H200))["archs"] == "native"  # one unknown: native for all
    assert flags.cuda_flags(_cuda(unknown, cmake=None))["archs"] == "native"  # no cmake: the build fetches a recent one
    # Ubuntu 22.04's CMake 3.22, an nvcc before 11.6 or of unknown version: llama.cpp's own default list
    for old in (_cuda(unknown, cmake="3.22.1"), _cuda(unknown, nvcc_version="11.4"), _cuda(unknown, nvcc_version=None)):
        f = flags.cuda_flags(old)
        assert f["args"] == "-DGGML_CUDA=ON" and f["archs"] is None and "default list" in f["reason"]


def test_no_cuda_where_it_cannot_be_built_or_is_not_wanted():
    assert flags.cuda_flags(_cuda())["args"] == "" and "no NVIDIA GPU" in flags.cuda_flags(_cuda())["reason"]
    no_nvcc = flags.cuda_flags(_cuda(H200, nvcc=None, nvcc_version=None))
    assert no_nvcc["args"] == "" and "no CUDA toolkit" in no_nvcc["reason"]
    assert flags.cuda_flags(_cuda(H200), portable=True)["args"] == ""
    assert flags.cuda_flags(_cuda(H200, disabled=True))["args"] == ""
    v100 = flags.cuda_flags(_cuda(("Tesla V100-SXM2-16GB", "7.0"), nvcc_version="13.0"))
    assert v100["args"] == "" and "CUDA 13 dropped Maxwell, Pascal and Volta" in v100["reason"]
    assert "install a CUDA 12 toolkit" in v100["reason"]
    old = flags.cuda_flags(_cuda(("NVIDIA GeForce RTX 5090", "12.0"), nvcc_version="12.4"))
    assert old["args"] == "" and "it needs CUDA >= 12.8" in old["reason"]
    assert flags.cuda_flags(_cuda(("Tesla V100", "7.0"), nvcc_version="12.4"))["archs"] == "70"


def test_the_build_asks_for_the_gpus_it_finds_and_records_why(tmp_path, monkeypatch):
    """verified_build with stand-ins for the wheel's build and smoke test (its fallback is tests/test_llama_build.py's):
    a stand-in nvidia-smi listing an H200 and an nvcc of CUDA 13.0 on PATH."""
    _program(tmp_path, "nvidia-smi", 'echo "NVIDIA H200, 143771, 9.0, 580.159.04"')
    _program(tmp_path, "nvcc", 'echo "Cuda compilation tools, release 13.0, V13.0.88"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("LABLIB_LLAMA_GPU", raising=False)
    facts = flags.cuda_facts()
    assert facts["gpus"][0]["compute_capability"] == "9.0" and facts["nvcc_version"] == "13.0"
    built, said = [], []

    def build(cache_root, args, log=print):
        built.append(args)
        return tmp_path / "llama_cpp_python-0.3.36-py3-none-any.whl"

    _, report = wheel.verified_build(
        {"GGML_AVX2": True},
        tmp_path / "cache",
        tmp_path / "m.gguf",
        build=build,
        smoke=lambda w, m, runner=(): {"ok": True},
        log=said.append,
    )
    assert built == ["-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"]
    assert report["cuda"] == "NVIDIA H200: CUDA for compute capability 9.0 only"
    assert any("CUDA for compute capability 9.0" in line for line in said)


@pytest.mark.skipif(not _no_gpu_here(), reason="this machine has an NVIDIA GPU")
def test_this_machine_builds_llama_cpp_without_cuda():
    facts = flags.cuda_facts()
    assert facts["gpus"] == [] and facts["nvcc"] is None  # nvcc is not even looked for without a GPU
    assert flags.gpu_cmake_args() == ""


def test_the_builds_wall_time_is_printed(tmp_path, monkeypatch):
    assert wheel.wall_time(48.4) == "48 s" and wheel.wall_time(271) == "4 min 31 s"
    folder = tmp_path / "key"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "CMakeLists.txt").write_text("")
    (folder / "build" / "bin").mkdir(parents=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    # a stand-in cmake: configure does nothing, --build "links" each target into bin/
    _program(
        fake,
        "cmake",
        '[ "$1" = "--build" ] && { t="$2"; shift 3; for x in "$@"; do [ "$x" = --parallel ] && break; touch "$t/bin/$x"; done; }; exit 0',
    )
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(tools, "build_report", lambda: {"build_dir": str(folder), "cmake_args": "-DGGML_CUDA=ON"})
    said = []
    tools.llama_tools(("llama-bench",), log=said.append)
    assert re.fullmatch(r"llama\.cpp: built llama-bench in \d+ s", said[-1])


# --- doctor ---------------------------------------------------------------------------------------


def _doctor(gpus=("NVIDIA H200",), torch=None, report=None, llama=True):
    return {
        "gpus": list(gpus),
        "torch": torch,
        "llama": {"report": report} if llama else None,
        "python": ".venv/bin/python",
    }


CUDA_REPORT = {
    "cmake_args": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90",
    "dropped": [],
}


def test_doctor_warns_of_a_cpu_only_torch_beside_a_gpu():
    lines = gpu_build_warnings(_doctor(torch={"version": "2.13.0+cpu", "cuda": None}, report=CUDA_REPORT))
    assert lines == [
        "WARNING: torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None) beside NVIDIA H200: transformers "
        "computes on the CPU. `.venv/bin/python -m lablib.build.torch_choice --install` installs the CUDA build this "
        "driver runs (it says which and why)"
    ]
    assert gpu_build_warnings(_doctor(torch={"version": "2.13.0+cu130", "cuda": "13.0"}, report=CUDA_REPORT)) == []


def test_doctor_warns_of_a_llama_cpp_built_without_cuda_beside_a_gpu_and_says_why():
    no_nvcc = {
        "cmake_args": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON",
        "dropped": [],
        "cuda": "NVIDIA H200 found, but no CUDA toolkit",
    }
    (line,) = gpu_build_warnings(_doctor(torch={"version": "2.13.0+cu130", "cuda": "13.0"}, report=no_nvcc))
    assert line.startswith("WARNING: llama.cpp (llama-cpp-python) was built without CUDA beside NVIDIA H200")
    assert "why: NVIDIA H200 found, but no CUDA toolkit" in line
    assert "`.venv/bin/python -m lablib.build.llama --install`" in line and "--tool all" in line
    failed = dict(no_nvcc, dropped=[{"family": "CUDA", "reason": "the build with -DGGML_CUDA=ON failed: exit 2"}])
    (line,) = gpu_build_warnings(_doctor(report=failed))
    assert "why: its CUDA build failed: the build with -DGGML_CUDA=ON failed: exit 2" in line
    # both at once, in that order
    assert len(gpu_build_warnings(_doctor(torch={"version": "2.13.0", "cuda": None}, report=no_nvcc))) == 2


def test_doctor_warns_of_nothing_without_a_gpu_or_without_the_library():
    cpu_all = _doctor(gpus=(), torch={"version": "2.13.0+cpu", "cuda": None}, report={"cmake_args": "-DGGML_AVX2=ON"})
    assert gpu_build_warnings(cpu_all) == []
    assert gpu_build_warnings(_doctor(llama=False)) == []  # no llama-cpp-python, no torch: nothing to say here
    assert gpu_build_warnings(_doctor(report=None)) == []  # a llama.cpp the lab did not build: its record is unknown
    # this machine's gathering without a GPU asks torch nothing (no child process)
    assert gpu_build_facts([]) == {"gpus": [], "torch": None, "llama": None, "python": sys.executable}
