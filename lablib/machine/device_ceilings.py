"""The ceilings of the device a row computed on: the CPU's (:mod:`lablib.machine.ceilings`, measured with
NumPy and torch on the CPU) or a GPU's, measured the same way through torch on that device.

A row that ran on a GPU held against the CPU's bandwidth read "230 % of the bound" (issue 37: transformers on
an H200 against the host's 5.87 GB/s). So the roofline asks for the ceilings of each row's own device
(:func:`ceilings_for`):

- ``cpu``: this machine's measurement (:func:`lablib.machine.ceilings.machine`);
- ``cuda`` / ``mps``: :func:`measure_device`: torch on that device, once per machine and device, cached beside
  the CPU's. Bandwidth: the read kernel (``x.sum()`` over a tensor of :data:`DEVICE_ARRAY_BYTES`, far past any
  GPU's L2: 1 x its bytes a pass, what a decode step does to the weights) and copy (``y.copy_(x)``: 2 x),
  the median of ``reps`` passes after a warm-up; matrix products of float32, bfloat16, float16 and int8
  (``torch._int_mm``) where the device runs them; every timing between device synchronisations
  (``torch.cuda.synchronize``: a kernel launch returns before the kernel ends);
- ``unknown`` (a server at a URL the lab did not start) or a GPU that is not here and never measured: the
  published peaks of an accelerator of :data:`lablib.machine.accelerators.ACCELERATORS` whose name the row's
  accelerator names, else None: no bound rather than another device's.

The same functions run on the CPU through torch (``measure_device("cpu")``), which is how they are tested on
a machine without a GPU; the CPU's own roofline figures stay NumPy's STREAM kernels.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

DEVICE_ARRAY_BYTES = 1 << 30  # 1 GiB: past the 50-60 MiB L2 of an H100/H200 (quick: 256 MiB)
DEVICE_ARRAY_BYTES_QUICK = 256 << 20
DEVICE_DTYPES = ("float32", "bfloat16", "float16", "int8")
DEVICE_MEASUREMENT_VERSION = 2  # 2: the roofline's ceilings are the best repetitions
TORCH_DEVICES = ("cpu", "cuda", "mps")


def _sync(torch, device: str):
    if device == "cuda":
        return torch.cuda.synchronize
    if device == "mps":
        return torch.mps.synchronize
    return lambda: None


def _median_rate(work, sync, amount: float, reps: int) -> dict:
    """``amount`` / seconds of ``work`` (between ``sync``s), after a warm-up: :func:`lablib.machine.ceilings._spread`."""
    from lablib.machine.ceilings import _spread

    work()
    sync()
    rates = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        work()
        sync()
        rates.append(amount / (time.perf_counter() - t0))
    return _spread(rates)


def device_kind(device: str | None) -> str:
    """The kind of a row's ``device``: "cpu" (also for None), "cuda" for "cuda offload", "unknown" ..."""
    return (device or "cpu").split(" ")[0].lower()


def torch_bandwidth(device: str, kernel: str = "read", nbytes: int = DEVICE_ARRAY_BYTES, reps: int = 5) -> dict:
    """Memory bandwidth of ``device`` through torch, bytes/s: ``read`` (``x.sum()``, 1 x the tensor's bytes a
    pass) or ``copy`` (``y.copy_(x)``, 2 x). Returns {kernel, bytes_per_s (median), min, max, reps,
    bytes_per_pass, tensor_bytes}."""
    import torch

    from lablib.errors import LabError

    if kernel not in ("read", "copy"):
        raise LabError(f"kernel={kernel!r}: expected read or copy")
    n = nbytes // 4
    x = torch.ones(n, dtype=torch.float32, device=device)
    tensor_bytes = x.numel() * x.element_size()
    if kernel == "read":
        per_pass = tensor_bytes
        work = lambda: x.sum()  # noqa: E731
    else:
        y = torch.empty_like(x)
        per_pass = 2 * tensor_bytes
        work = lambda: y.copy_(x)  # noqa: E731
    r = _median_rate(work, _sync(torch, device), per_pass, reps)
    return {
        "kernel": kernel,
        "bytes_per_s": r["median"],
        "min": r["min"],
        "max": r["max"],
        "reps": r["reps"],
        "bytes_per_pass": per_pass,
        "tensor_bytes": tensor_bytes,
    }


def torch_matmul(device: str, dtype: str, n: int = 4096, reps: int = 5) -> dict:
    """Matrix-multiply rate of ``device`` through torch, FLOP/s (int8: operations/s through ``torch._int_mm``):
    2 n^3 per product, the median of ``reps`` after a warm-up. Raises what torch raises for a type the device
    does not run."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    if dtype == "int8":
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, generator=g).to(device)
        work = lambda: torch._int_mm(a, a)  # noqa: E731
    else:
        a = torch.randn((n, n), generator=g).to(device=device, dtype=getattr(torch, dtype))
        work = lambda: torch.matmul(a, a)  # noqa: E731
    r = _median_rate(work, _sync(torch, device), 2 * n**3, reps)
    return {"dtype": dtype, "n": n, "flop_per_s": r["median"], "min": r["min"], "max": r["max"], "reps": r["reps"]}


def device_name(device: str) -> str:
    """What ``device`` is: the GPU's name (torch's), or the CPU model."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    if device == "mps":
        return "Apple GPU (MPS)"
    from lablib.machine.identity import hardware_info

    return hardware_info()["cpu_model"]


def measurement_path(device: str) -> Path:
    """<lab home>/hardware/<machine key>-<device>.json (the CPU's own, NumPy's, is <machine key>.json)."""
    from lablib.config import lab_home
    from lablib.machine.identity import machine_key

    return lab_home() / "hardware" / f"{machine_key()}-{device}.json"


def cached_device_measurement(device: str) -> dict | None:
    try:
        data = json.loads(measurement_path(device).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == DEVICE_MEASUREMENT_VERSION else None


def measure_device(device: str, refresh: bool = False, quick: bool | None = None) -> dict:
    """``device``'s ceilings through torch, measured once and cached (:func:`measurement_path`):
    {version, device, name, time, quick, bandwidth: {read, copy}, matmul: {dtype: ...}, bytes_per_s (read's best
    repetition), flop_per_s: {dtype: best repetition}}; a type the device does not run is left out. LabError for a device torch
    does not see here."""
    import datetime as _dt

    import torch

    from lablib.config import quick_mode
    from lablib.errors import LabError

    if device not in TORCH_DEVICES:
        raise LabError(f"device={device!r}: expected one of {', '.join(TORCH_DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise LabError(
            f"device='cuda': torch {torch.__version__} sees no CUDA GPU here (torch.version.cuda={torch.version.cuda})"
        )
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LabError("device='mps': torch sees no Apple GPU here")
    if not refresh and (cached := cached_device_measurement(device)):
        return cached
    quick = quick_mode() if quick is None else quick
    nbytes = DEVICE_ARRAY_BYTES_QUICK if quick or device == "cpu" else DEVICE_ARRAY_BYTES
    reps, n = (3, 1024) if quick or device == "cpu" else (10, 8192)
    bw = {k: torch_bandwidth(device, k, nbytes, reps) for k in ("read", "copy")}
    mm = {}
    for dtype in DEVICE_DTYPES:
        try:
            mm[dtype] = torch_matmul(device, dtype, n, reps)
        except Exception:  # noqa: BLE001 - a type this device (or this torch) has no kernel for
            pass
    out = {
        "version": DEVICE_MEASUREMENT_VERSION,
        "device": device,
        "name": device_name(device),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "bandwidth": bw,
        "matmul": mm,
        # the roofline's ceilings: each kernel's best repetition (lablib.machine.ceilings says why)
        "bytes_per_s": bw["read"]["max"],
        "flop_per_s": {k: v["max"] for k, v in mm.items()},
    }
    from lablib.machine.ceilings import save_measurement

    return save_measurement(measurement_path(device), out)


def measured_summary(device: str | None = None) -> dict:
    """Manifest fields (:data:`lablib.results.schema.MEASURED_BANDWIDTH`, ``MEASURED_PEAKS``: GB/s, GFLOP/s) of
    the cached measurement of the device a run computes on: ``cpu`` / None: this machine's CPU
    (:func:`lablib.machine.ceilings.measured_summary`); ``cuda`` / ``mps`` (or "cuda offload"): that GPU's
    (:func:`measure_device`); anything else, as a server's ``unknown``: {}, never the CPU's. {} when never measured."""
    from lablib.machine import ceilings

    kind = device_kind(device)
    if kind == "cpu":
        return ceilings.measured_summary()
    return ceilings.summary_of(cached_device_measurement(kind) if kind in ("cuda", "mps") else None)


def published_peaks_for(accelerator: str | None) -> dict | None:
    """The :data:`ACCELERATORS` entry whose name's model ("H200", "A100", "RTX 4090", "L4") the ``accelerator``
    text names, as :func:`lablib.machine.ceilings.machine` gives it; None when none does."""
    from lablib.machine.accelerators import ACCELERATORS
    from lablib.machine.ceilings import machine

    text = (accelerator or "").upper()
    for name in ACCELERATORS:
        model = name.split(" (")[0].replace(" SXM", "").replace(" 80GB", "").upper()
        if model.startswith("APPLE"):
            continue
        if model and model in text:
            return machine(name)
    return None


def ceilings_for(device: str | None, accelerator: str | None = None) -> dict | None:
    """The ceilings a row computed on ``device`` is held against ({name, bytes_per_s, flop_per_s, source}, as
    :func:`lablib.machine.ceilings.machine`), or None when nothing can bound it (see the module's doc)."""
    from lablib.machine.ceilings import machine

    kind = device_kind(device)
    if kind == "cpu":
        return machine(None)
    if kind in ("cuda", "mps"):
        try:
            m = measure_device(kind)
            return {
                "name": f"{m['name']} ({kind}, measured)",
                "bytes_per_s": m["bytes_per_s"],
                "flop_per_s": dict(m["flop_per_s"]),
                "source": f"measured {m['time']} through torch on {kind}",
            }
        except Exception:  # noqa: BLE001 - no such device here (rows from elsewhere): the published figures
            pass
    return published_peaks_for(accelerator)
