"""Which compute devices this machine has, and which one each engine computes on.

The engines use an accelerator when there is one: transformers on CUDA or Apple's MPS (in
bfloat16 or float16 there), llama.cpp offloading its layers to a CUDA or Metal build, MLX on
Metal (its default on macOS). A CPU-only machine keeps the CPU and float32 as before.

:func:`found` lists the devices without importing an engine library (``nvidia-smi``, the
platform); :func:`nvidia_facts` adds what an install needs to choose a build (each GPU's compute
capability, the driver's version: through NVML when ``pynvml`` imports, else ``nvidia-smi``);
:func:`torch_device` and :func:`torch_dtype` choose for transformers from what torch itself sees.
Nothing here is measured: :mod:`lablib.machine.accelerators` holds the peak figures. Standard library
only at import (``lablib.build`` uses it at install time).
"""

from __future__ import annotations

import platform
import re
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


def _smi(fields: str, timeout: float) -> subprocess.CompletedProcess | None:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``; None without the program (no
    driver) or when it does not run."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _mib(text: str) -> int:
    """Bytes of a memory figure in MiB as nvidia-smi prints it with ``nounits`` (0 when not a number)."""
    text = text.strip()
    return int(float(text)) * 2**20 if text.replace(".", "", 1).isdigit() else 0


def nvidia_gpus(timeout: float = 10) -> list[Device]:
    """NVIDIA GPUs as ``nvidia-smi --query-gpu=name,memory.total`` lists them ([] without the driver)."""
    p = _smi("name,memory.total", timeout)
    gpus = []
    for line in (p.stdout if p else "").splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip():
            gpus.append(Device("cuda", name.strip(), _mib(mib), "nvidia-smi"))
    return gpus


def _nvml_facts() -> dict | None:
    """:func:`nvidia_facts` through NVML (``pynvml``, from the ``nvidia-ml-py`` package: the library
    nvidia-smi itself reads); None when pynvml does not import or NVML does not start (no driver, no
    libnvidia-ml.so: :func:`nvidia_facts` then asks nvidia-smi)."""
    try:
        import pynvml  # optional (nvidia-ml-py); imported only here
    except ImportError:
        return None

    def text(v) -> str:
        return (v.decode() if isinstance(v, bytes) else str(v)).strip()  # older pynvml returned bytes

    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml.NVMLError and its subclasses (LibraryNotFound, DriverNotLoaded)
        return None
    try:
        driver = text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{int(major)}.{int(minor)}"
            except Exception:  # noqa: BLE001 - a pynvml without the call, or a device that does not say
                cc = None
            gpus.append(
                {
                    "name": text(pynvml.nvmlDeviceGetName(h)),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "compute_capability": cc,
                    "driver_version": driver,
                }
            )
        return {"gpus": gpus, "driver_version": driver or None, "seen_by": "nvml", "note": None}
    except Exception as e:  # noqa: BLE001 - NVML started but a query failed: let nvidia-smi answer
        return {"gpus": [], "driver_version": None, "seen_by": None, "note": f"NVML: {type(e).__name__}: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


SMI_FIELDS = "name,memory.total,compute_cap,driver_version"


def parse_smi_gpus(out: str, fields: str = SMI_FIELDS) -> list[dict]:
    """The GPUs in ``nvidia-smi --query-gpu=<fields> --format=csv,noheader[,nounits]``'s output (``fields``:
    :data:`SMI_FIELDS`, or the same without ``compute_cap``), one dict a line as :func:`nvidia_facts` gives
    them; memory with its unit (``143771 MiB``) or without; a field not asked, ``[N/A]`` or empty: None."""
    names = fields.split(",")
    gpus = []
    for line in out.splitlines():
        parts = [f.strip() for f in line.rsplit(",", len(names) - 1)]  # only the name could hold a comma
        if len(parts) != len(names) or not parts[0]:
            continue
        got = dict(zip(names, parts))
        cc, driver = got.get("compute_cap", ""), got.get("driver_version", "")
        gpus.append(
            {
                "name": got["name"],
                "memory_bytes": _mib(got.get("memory.total", "").removesuffix("MiB")),
                "compute_capability": cc if re.fullmatch(r"\d+\.\d+", cc) else None,
                "driver_version": driver if re.fullmatch(r"\d+(\.\d+)*", driver) else None,
            }
        )
    return gpus


def nvidia_facts(timeout: float = 10) -> dict:
    """What an install needs to know of this machine's NVIDIA GPUs: ``{"gpus": [{"name", "memory_bytes",
    "compute_capability" ("9.0"; None when not said), "driver_version"}], "driver_version", "seen_by"
    ("nvml", "nvidia-smi" or None: no GPU seen), "note" (why neither answered, or None)}``.

    Asks NVML first (``pynvml``, when it imports), then ``nvidia-smi --query-gpu=name,memory.total,
    compute_cap,driver_version``; an nvidia-smi too old for the ``compute_cap`` field (drivers before about
    510) is asked again without it (compute capability None). No GPU, no driver: ``gpus`` empty. GPUs
    hidden by CUDA_VISIBLE_DEVICES are still listed (NVML and nvidia-smi see the whole machine)."""
    notes = []
    found = _nvml_facts()
    if found and found["gpus"]:
        return found
    if found and found["note"]:
        notes.append(found["note"])
    fields = SMI_FIELDS
    p = _smi(fields, timeout)
    if p is not None and p.returncode != 0 and "compute_cap" in p.stdout + p.stderr:
        fields = "name,memory.total,driver_version"  # an older nvidia-smi: no compute_cap field
        p = _smi(fields, timeout)
    gpus = parse_smi_gpus(p.stdout, fields) if p is not None and p.returncode == 0 else []
    if gpus:
        return {"gpus": gpus, "driver_version": gpus[0]["driver_version"], "seen_by": "nvidia-smi", "note": None}
    if p is None:
        notes.append("nvidia-smi not found" if not shutil.which("nvidia-smi") else "nvidia-smi did not run")
    else:
        said = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()[-1]
        notes.append(f"nvidia-smi listed no GPU ({said[:200]})")
    return {"gpus": [], "driver_version": None, "seen_by": None, "note": "; ".join(notes)}


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
