"""What machine this is: CPU model, accelerators, the manifest's hardware record, load average.

Facts only, read from the OS (``/proc/cpuinfo``, ``sysctl``, psutil) and from
:mod:`lablib.machine.devices` (GPUs). What this process may *use* of the machine is
:mod:`lablib.machine.limits`; how many threads an engine takes, :mod:`lablib.machine.threads`.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess

from lablib.machine.devices import Device, apple_gpu, nvidia_gpus
from lablib.machine.limits import cpu_quota, cpus_usable, memory_limit_bytes


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
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux's /proc/cpuinfo lists them ('avx2', 'avx512_bf16',
    'amx_bf16', ...); empty where there is no /proc/cpuinfo (macOS, Windows)."""
    return frozenset(_this_cpu().get("flags", "").split())


# /proc/cpuinfo fields of the first CPU that tell two CPUs of one marketing name apart: x86's vendor, family,
# model and stepping and its feature flags; ARM's implementer, part and features. Cloud VMs can show the same
# model name ("AMD EPYC") and hostname ("vm") on an EPYC with AVX2 only (family 25, model 1) and one with AVX-512.
_SIGNATURE_FIELDS = (
    "vendor_id",
    "cpu family",
    "model",
    "stepping",
    "flags",
    "cpu implementer",
    "cpu architecture",
    "cpu variant",
    "cpu part",
    "cpu revision",
    "features",
)


def _first_cpu(cpuinfo: str) -> dict:
    """The first processor's block of /proc/cpuinfo's text: {field (lower case): value}, flags and features
    sorted."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key not in fields:
            fields[key] = " ".join(sorted(value.split())) if key in ("flags", "features") else value.strip()
    return fields


@functools.lru_cache(maxsize=1)
def _this_cpu() -> dict:
    """:func:`_first_cpu` of this machine's /proc/cpuinfo, read once a process; {} where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return _first_cpu(f.read())
    except OSError:
        return {}


def cpu_signature(cpuinfo: str | None = None) -> str:
    """The first CPU's identifying fields of ``/proc/cpuinfo`` (``cpuinfo``: its text; default: this machine's),
    ``field=value`` joined by "|", flags sorted; "" where there is none (macOS, Windows: there the model name
    says it). Two machines with the same signature run the same instructions at the same clocks per core."""
    fields = _this_cpu() if cpuinfo is None else _first_cpu(cpuinfo)
    return "|".join(f"{k}={fields[k]}" for k in _SIGNATURE_FIELDS if k in fields)


def accelerator() -> str | None:
    """The accelerators the engines could use (:mod:`lablib.machine.devices`: NVIDIA GPUs as nvidia-smi
    lists them, the Apple GPU), joined by "; ", or None on a CPU-only machine."""
    gpus = [f"{d.name} (Metal)" if d.kind == "metal" else d.name for d in nvidia_gpus() + apple_gpu()]
    return "; ".join(gpus) or None


@functools.lru_cache(maxsize=1)
def hardware_info() -> dict:
    """{cpu_model, cores_physical, cores_logical, ram_bytes, cpu_quota, memory_limit_bytes, os,
    machine, hostname, python, accelerator}. ``cpu_quota`` (CPUs) and ``memory_limit_bytes``
    are the container's caps, None when there are none."""
    import psutil

    return {
        "cpu_model": cpu_model(),
        "cores_physical": psutil.cpu_count(logical=False) or os.cpu_count(),
        "cores_logical": psutil.cpu_count(logical=True) or os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "cpu_quota": cpu_quota(),
        "memory_limit_bytes": memory_limit_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "accelerator": accelerator(),
    }


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, averaged by the kernel), None where the
    OS has none. Recorded in every run's manifest: a run started on a busy machine says so."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def machine_key() -> str:
    """What makes two measurements comparable: hostname, CPU model, the CPU's own signature
    (:func:`cpu_signature`: family, model, flags), the CPUs this process may use and the accelerators. The
    signature was missing: a lab home that moved between two cloud VMs named "vm", both "AMD EPYC" (one with
    AVX-512, one with AVX2 only), used the first one's ceilings on the second, whose float32 product was about
    three times faster (best passes 56 against 137-173 GFLOP/s), and lab 07 showed transformers' prefill at 152 %
    of its bound."""
    import hashlib

    hw = hardware_info()
    raw = f"{hw['hostname']}|{hw['cpu_model']}|{cpu_signature()}|{cpus_usable()}|{hw['accelerator']}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def machine_id() -> str | None:
    """This machine's own id: 12 hex digits, the same in every process and run, or None where the operating system
    keeps none. py-machineid reads the OS's id (Linux's /etc/machine-id, a container's id, macOS's
    IOPlatformUUID, Windows' MachineGuid) and hashes it with the lab's name (HMAC-SHA256), so the OS's own id is
    never written into a results file that a learner hands in.

    What the hostname and the hardware do not tell apart: two laptops both "MacBook-Pro.local", a room of cloud
    VMs all "vm" with one CPU (one :func:`machine_key`). A workshop room's figure tells machines apart by it where
    hostnames repeat (:func:`lablib.results.tables.machine_names`)."""
    try:
        import machineid
    except ImportError:  # an environment set up before the lab asked for it
        return None
    try:
        return machineid.hashed_id("lablib")[:12]
    except (machineid.MachineIdNotFound, OSError):
        return None


def found() -> list[Device]:
    """Every device the engines could compute on here: the CPU first, then GPUs."""
    return [Device("cpu", cpu_model(), 0, "platform"), *nvidia_gpus(), *apple_gpu()]


def describe(devices: list[Device]) -> str:
    """One line for doctor: ``cpu (AMD EPYC); cuda (NVIDIA H200, 140 GiB)``."""
    parts = []
    for d in devices:
        mem = f", {d.memory_bytes / 2**30:.0f} GiB" if d.memory_bytes else ""
        parts.append(f"{d.kind} ({d.name}{mem})")
    return "; ".join(parts)


# --- transformers (torch) ------------------------------------------------------------------
