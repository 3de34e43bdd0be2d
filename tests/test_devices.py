"""Which device each engine computes on: what the machine has (nvidia-smi, the platform) and how
transformers chooses a torch device and dtype from what torch sees."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from lablib.errors import LabError
from lablib.machine import devices, identity


def _program(folder, name: str, script: str):
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_nvidia_gpus_are_read_from_nvidia_smi(tmp_path, monkeypatch):
    # the query's CSV as nvidia-smi 550 prints it (name, memory.total in MiB)
    _program(tmp_path, "nvidia-smi", 'echo "NVIDIA H200, 143771"; echo "NVIDIA L4, 23034"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpus = devices.nvidia_gpus()
    assert [(g.kind, g.name, g.memory_bytes) for g in gpus] == [
        ("cuda", "NVIDIA H200", 143771 * 2**20),
        ("cuda", "NVIDIA L4", 23034 * 2**20),
    ]
    assert identity.describe(gpus) == "cuda (NVIDIA H200, 140 GiB); cuda (NVIDIA L4, 22 GiB)"


def test_this_machine_lists_its_cpu_first():
    found = identity.found()
    assert found[0].kind == "cpu" and found[0].name
    assert all(d.kind in ("cuda", "metal") for d in found[1:])


def _torch(cuda: bool, mps: bool, bf16: bool = True):
    """A stand-in for torch's device queries (what torch.cuda / torch.backends.mps answer)."""
    import torch

    return SimpleNamespace(
        __version__="2.13.0",
        dtype=torch.dtype,
        float32=torch.float32,
        bfloat16=torch.bfloat16,
        float16=torch.float16,
        cuda=SimpleNamespace(is_available=lambda: cuda, is_bf16_supported=lambda: bf16),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
    )


@pytest.mark.parametrize(
    "cuda, mps, bf16, want",
    [
        (False, False, False, ("cpu", "float32")),
        (True, False, True, ("cuda", "bfloat16")),  # Ampere and later
        (True, False, False, ("cuda", "float16")),  # a T4 or V100 has no bfloat16 units
        (False, True, False, ("mps", "float16")),
    ],
)
def test_auto_picks_the_accelerator_and_its_half_precision(cuda, mps, bf16, want):
    torch = _torch(cuda, mps, bf16)
    device = devices.torch_device(torch, "auto")
    assert (device, devices.torch_dtype(torch, device)) == want
    assert devices.torch_dtype(torch, device, "float32") == "float32"  # asked for: kept


def test_a_device_torch_does_not_see_is_one_clear_error():
    import torch

    with pytest.raises(LabError, match=r"device='cuda': torch .* does not see it here \(it sees only the cpu\)"):
        devices.torch_device(_torch(False, False), "cuda")
    with pytest.raises(LabError, match=r"device='tpu': expected one of auto, cpu, cuda, mps"):
        devices.torch_device(torch, "tpu")
    with pytest.raises(LabError, match=r"dtype='float33'"):
        devices.torch_dtype(torch, "cpu", "float33")
