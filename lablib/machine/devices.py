"""Which compute devices this machine has, and which one each engine computes on.

The engines use an accelerator when there is one: transformers on CUDA or Apple's MPS (in
bfloat16 or float16 there), llama.cpp offloading its layers to a CUDA or Metal build, MLX on
Metal (its default on macOS). A CPU-only machine keeps the CPU and float32 as before.

:func:`found` lists the devices without importing an engine library (``nvidia-smi``, the
platform); :func:`torch_device` and :func:`torch_dtype` choose for transformers from what torch
itself sees. Nothing here is measured: :mod:`lablib.machine.accelerators` holds the peak figures.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass

from lablib.errors import LabError

TORCH_DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True)
class Device:
    """One compute device: ``kind`` ("cpu", "cuda", "metal"), its name, memory in bytes (0 when
    unknown: a CPU shares the machine's RAM, Apple GPUs share unified memory) and how it was seen."""

    kind: str
    name: str
    memory_bytes: int = 0
    seen_by: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def nvidia_gpus(timeout: float = 10) -> list[Device]:
    """NVIDIA GPUs as ``nvidia-smi --query-gpu=name,memory.total`` lists them ([] without the driver)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip():
            mem = int(float(mib)) * 2**20 if mib.strip().replace(".", "", 1).isdigit() else 0
            gpus.append(Device("cuda", name.strip(), mem, "nvidia-smi"))
    return gpus


def apple_gpu() -> list[Device]:
    """The Apple-silicon GPU (Metal) of a Mac with an arm64 CPU, else []."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return [Device("metal", "Apple GPU", 0, "platform")]
    return []


def torch_device(torch, requested: str = "auto") -> str:
    """The torch device for ``requested``: "auto" picks CUDA, then MPS, then the CPU.

    Raises LabError for a name outside :data:`TORCH_DEVICES` or a device torch does not see
    (naming what it does see)."""
    requested = (requested or "auto").lower()
    if requested not in TORCH_DEVICES:
        raise LabError(f"device={requested!r}: expected one of {', '.join(TORCH_DEVICES)}")
    cuda = bool(torch.cuda.is_available())
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if requested == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if (requested == "cuda" and not cuda) or (requested == "mps" and not mps):
        seen = ", ".join(d for d, ok in (("cuda", cuda), ("mps", mps)) if ok) or "only the cpu"
        raise LabError(f"device={requested!r}: torch {torch.__version__} does not see it here (it sees {seen})")
    return requested


def torch_dtype(torch, device: str, requested: str | None = None) -> str:
    """The weights' dtype name: ``requested`` when given; float32 on the CPU (the faithful
    reference); bfloat16 on CUDA where the GPU computes it (Ampere and later), else float16; float16
    on MPS. Raises LabError for a name torch has no dtype for."""
    if requested:
        if not isinstance(getattr(torch, requested, None), torch.dtype):
            raise LabError(f"dtype={requested!r}: expected a torch dtype name such as float32, bfloat16, float16")
        return requested
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "mps":
        return "float16"
    return "float32"
