"""What machine this is: CPU model, cores, RAM, accelerator (for the run manifest)."""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess


def cpu_model() -> str:
    """The CPU's marketing name ('AMD EPYC', 'Apple M2'), or the architecture if unknown."""
    if platform.system() == "Linux":
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.lower().startswith(("model name", "hardware", "cpu model")):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def accelerator() -> str | None:
    """An accelerator the engines could use: NVIDIA GPUs (nvidia-smi), Apple GPU (Metal), or None."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "Apple GPU (Metal)"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            gpus = [ln.split(" (UUID")[0] for ln in out.splitlines() if ln.startswith("GPU")]
            return "; ".join(gpus) or None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


@functools.lru_cache(maxsize=1)
def hardware_info() -> dict:
    """{cpu_model, cores_physical, cores_logical, ram_bytes, os, machine, python, accelerator}."""
    import psutil

    return {
        "cpu_model": cpu_model(),
        "cores_physical": psutil.cpu_count(logical=False) or os.cpu_count(),
        "cores_logical": psutil.cpu_count(logical=True) or os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "accelerator": accelerator(),
    }


def available_ram_bytes() -> int:
    """RAM available to new allocations now, bytes (psutil's 'available')."""
    import psutil

    return psutil.virtual_memory().available
