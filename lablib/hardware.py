"""What machine this is: CPU model, cores, RAM, accelerator (for the run manifest).

Also what this process may use of it. A container (mybinder.org, Docker,
Kubernetes) caps CPU time and memory with Linux cgroups while psutil and
``os.cpu_count`` still report the whole node: a Binder session sees 64 cores
and 200 GB but may use 1 CPU and 2 GiB. :func:`cpu_quota` and
:func:`memory_limit_bytes` read those caps (cgroup v2 ``cpu.max`` /
``memory.max``; v1 ``cpu.cfs_quota_us`` / ``memory.limit_in_bytes``; kernel
docs: Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import subprocess
import time
from pathlib import Path


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


def accelerator() -> str | None:
    """The accelerators the engines could use (:mod:`lablib.devices`: NVIDIA GPUs as nvidia-smi
    lists them, the Apple GPU), joined by "; ", or None on a CPU-only machine."""
    from .devices import apple_gpu, nvidia_gpus

    gpus = [f"{d.name} (Metal)" if d.kind == "metal" else d.name for d in nvidia_gpus() + apple_gpu()]
    return "; ".join(gpus) or None


# --- what this process may use: cgroup caps ------------------------------------------------
CGROUP_ROOT = "/sys/fs/cgroup"
_UNLIMITED = 2**60  # v1 writes "no limit" as a page-rounded 2**63 - 1


def _cgroup_dirs(controller: str, root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> list[Path]:
    """Folders holding this process's ``controller`` settings, innermost first, up to the mount.

    Reads ``proc`` (lines ``id:controllers:path``; v2 is ``0::path``). v1 mounts a
    controller at ``root/<controller>`` (or a joint ``cpu,cpuacct``), v2 all at ``root``.
    A container without its own cgroup namespace shows the host's path, which
    is not under its mount: then the mount itself is the container's cgroup.
    """
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        names = controllers.split(",") if controllers else []
        if controller in names:  # v1
            base = Path(root) / controllers
            base = base if base.is_dir() else Path(root) / controller
            mounts.append((base, path))
        elif not controllers:  # v2: the unified mount (under root/unified in a hybrid layout)
            for base in (Path(root), Path(root) / "unified"):
                if (base / "cgroup.controllers").is_file():
                    mounts.append((base, path))
                    break
    dirs = []
    for base, path in mounts:
        here = base / path.lstrip("/")
        if not here.is_dir():
            here = base
        if not here.is_dir():
            continue
        while True:
            dirs.append(here)
            if here == base:
                break
            here = here.parent
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_quota(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time this process may use (cgroup CFS quota / period), or None if uncapped.

    The tightest cap between the process's cgroup and its mount counts. 1.5 means
    one and a half CPUs of time per wall-clock second, whatever the core count.
    """
    quotas = []
    for d in _cgroup_dirs("cpu", root, proc):
        v2 = _read(d / "cpu.max")
        if v2:
            quota, _, period = v2.partition(" ")
        else:
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota and period and quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 < int(period):
            quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def _memory_limit(d: Path) -> int | None:
    raw = _read(d / "memory.max") or _read(d / "memory.limit_in_bytes")
    return int(raw) if raw and raw.isdigit() and int(raw) < _UNLIMITED else None


def _working_set(d: Path) -> int | None:
    """Usage minus file cache at cgroup folder ``d``, bytes: page cache (model files read, Python
    modules imported) is reclaimed before the cgroup's OOM killer runs, so only the rest is
    memory in use. (Docker subtracts only inactive file pages; a file read a moment ago, such as a
    model just hashed, is still active and would count as used.)"""
    usage = _read(d / "memory.current") or _read(d / "memory.usage_in_bytes")
    if not usage or not usage.isdigit():
        return None
    stat = dict(line.partition(" ")[::2] for line in (_read(d / "memory.stat") or "").splitlines())
    cache = next((stat[k] for k in ("file", "total_cache", "cache") if stat.get(k, "").isdigit()), "0")
    return max(int(usage) - int(cache), 0)


def memory_limit_bytes(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """The cgroup memory cap on this process, bytes, or None if uncapped (tightest level counts)."""
    limits = [x for x in map(_memory_limit, _cgroup_dirs("memory", root, proc)) if x is not None]
    return min(limits) if limits else None


def memory_headroom_bytes(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """Bytes this process may still allocate before a cgroup cap binds: the least, over the levels
    that have a cap, of cap minus the memory in use at that level (:func:`_working_set`); None when no
    level has a cap."""
    room = []
    for d in _cgroup_dirs("memory", root, proc):
        limit = _memory_limit(d)
        if limit is not None:
            room.append(max(limit - (_working_set(d) or 0), 0))
    return min(room) if room else None


def cpus_usable() -> int:
    """Whole CPUs this process can keep busy: the least of physical cores, CPUs in its affinity
    mask, and its cgroup quota rounded up (at least 1)."""
    import psutil

    counts = [psutil.cpu_count(logical=False) or os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):
        counts.append(len(os.sched_getaffinity(0)))
    quota = cpu_quota()
    if quota:
        counts.append(math.ceil(quota))
    return max(1, min(counts))


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


def cpus_busy(interval: float = 0.5) -> float:
    """CPUs kept busy by *other* processes over ``interval`` seconds (this process idles meanwhile):
    system-wide CPU time (psutil.cpu_percent) as a number of CPUs, 0.0 to the logical CPU count."""
    import psutil

    return psutil.cpu_percent(interval=interval) / 100 * (psutil.cpu_count(logical=True) or 1)


class BusyMeter:
    """CPUs kept busy by *other* processes between two readings.

    System-wide busy CPU time (psutil.cpu_times: all but idle and iowait) minus this process's own
    CPU time (all its threads), over the wall time between readings. The first reading covers a
    short blocking sample (``first_interval`` seconds) taken when the meter is made.
    """

    def __init__(self, first_interval: float = 0.2):
        import psutil

        self._proc = psutil.Process()
        self._last = self._sample()
        time.sleep(first_interval)

    def _sample(self) -> tuple[float, float, float]:
        import psutil

        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        own = sum(self._proc.cpu_times()[:2])
        return time.monotonic(), busy, own

    def others(self) -> float:
        """CPUs other processes kept busy since the last reading (0.0 or more)."""
        now_, busy, own = self._sample()
        t0, busy0, own0 = self._last
        self._last = (now_, busy, own)
        wall = now_ - t0
        return max(0.0, ((busy - busy0) - (own - own0)) / wall) if wall > 0 else 0.0


def threads_beside_others(most: int, others: float) -> int:
    """Threads an engine should use when other processes keep ``others`` CPUs busy: the CPUs
    left, rounded (0.5 up), between 1 and ``most``.

    Why: OpenMP threads (llama.cpp's ggml, PyTorch) meet at a barrier after every operation, so
    one thread that shares its core with a busy neighbour holds all of them up, for a scheduler
    time slice at a time (benchmarks/contention.py measured a 4x slowdown here with 2 threads and
    one busy core, and none with 1 thread).
    """
    return max(1, min(most, most - math.floor(others + 0.5)))


def available_ram_bytes() -> int:
    """Memory available to new allocations now, bytes: psutil's 'available', or less when a
    cgroup caps this process (its limit minus its working set)."""
    import psutil

    available = psutil.virtual_memory().available
    room = memory_headroom_bytes()
    return available if room is None else min(available, room)


# --- measured: memory bandwidth and matrix-multiply rate (the roofline's two ceilings) --------------
# STREAM (McCalpin, "Memory Bandwidth and Machine Balance in Current High Performance Computers",
# IEEE TCCA Newsletter 1995; www.cs.virginia.edu/stream): each array at least 4 x the last-level cache,
# bytes counted as the kernel names them (copy a = b: 2 x 8 bytes per element; triad a = b + s*c:
# 3 x 8), write-allocate traffic not counted, the best of the repetitions reported. Here the median
# is the figure (the machine is shared: the best run is the one nobody else used) and the spread
# (min, max) comes with it.
# "read" (sum b: 1 x 8 bytes per element, no writes) is not STREAM's: it is what a decode step does to the
# weights, so it is the bandwidth the roofline uses (lmbench's bw_mem "rd" measures the same).
STREAM_KERNELS = {"read": 1, "copy": 2, "triad": 3}  # arrays touched per element
ROOFLINE_KERNEL = "read"
STREAM_ARRAY_BYTES = 64 * 2**20  # per array: 2 x the 32 MiB L3 of the lab's EPYC, 4 x a 16 MiB laptop L3
_STREAM_BLOCK = 2**15  # float64 elements a thread handles per step (256 KiB: the temporaries stay in L2)
MATMUL_DTYPES = ("float32", "bfloat16", "int8")
MEASUREMENT_VERSION = 2


def _spread(values: list[float]) -> dict:
    import statistics

    return {"median": statistics.median(values), "min": min(values), "max": max(values), "reps": len(values)}


def stream_bandwidth(
    kernel: str = "triad", array_bytes: int = STREAM_ARRAY_BYTES, reps: int = 5, threads: int | None = None
) -> dict:
    """Memory bandwidth of a STREAM-style ``kernel`` ("read": sum of b, "copy" a = b, or "triad"
    a = b + 3 c), bytes/s.

    float64 arrays of ``array_bytes`` each (default 64 MiB: far past the last-level cache), split
    into ``threads`` contiguous slices (default :func:`cpus_usable`), each thread walking its slice
    in 256 KiB blocks with NumPy (which releases the GIL), so the triad's temporary ``3 c`` stays in
    cache and memory sees what STREAM counts: 1 (read), 2 (copy) or 3 (triad) x 8 bytes per element.
    One unrecorded pass first (page faults), then ``reps`` timed passes.

    Returns {kernel, bytes_per_s (median), min, max, reps, threads, array_bytes, bytes_per_pass}.
    Raises LabError for an unknown kernel or sizes/reps/threads below 1.
    """
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from .errors import LabError

    if kernel not in STREAM_KERNELS:
        raise LabError(f"kernel={kernel!r}: expected one of {', '.join(STREAM_KERNELS)}")
    threads = cpus_usable() if threads is None else threads
    if not (isinstance(array_bytes, int) and array_bytes >= 8 * threads) or reps < 1 or threads < 1:
        raise LabError(
            f"array_bytes={array_bytes!r}, reps={reps}, threads={threads}: expected whole numbers, "
            "reps and threads at least 1 and at least 8 bytes per thread (default 64 MiB, 5 reps)"
        )
    n = array_bytes // 8
    a, b, c = np.zeros(n), np.ones(n), np.full(n, 2.0)
    bounds = np.linspace(0, n, threads + 1).astype(int)

    sums = []  # keeps the read kernel's results alive (list.append is thread-safe)

    def work(lo: int, hi: int) -> None:
        tmp = np.empty(min(_STREAM_BLOCK, hi - lo))
        for s in range(lo, hi, _STREAM_BLOCK):
            e = min(s + _STREAM_BLOCK, hi)
            if kernel == "read":
                sums.append(float(np.add.reduce(b[s:e])))
            elif kernel == "copy":
                np.copyto(a[s:e], b[s:e])
            else:
                t = tmp[: e - s]
                np.multiply(c[s:e], 3.0, out=t)
                np.add(b[s:e], t, out=a[s:e])

    bytes_per_pass = STREAM_KERNELS[kernel] * 8 * n
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        for i in range(reps + 1):
            t0 = time.perf_counter()
            list(pool.map(work, bounds[:-1], bounds[1:]))
            dt = time.perf_counter() - t0
            if i:
                rates.append(bytes_per_pass / dt)
    s = _spread(rates)
    return {
        "kernel": kernel,
        "bytes_per_s": s["median"],
        "min": s["min"],
        "max": s["max"],
        "reps": s["reps"],
        "threads": threads,
        "array_bytes": 8 * n,
        "bytes_per_pass": bytes_per_pass,
    }


def _matmul_runner(backend: str, dtype: str, n: int, threads: int):
    """A zero-argument function multiplying two n x n matrices once (result ready on return)."""
    from .errors import LabError

    if backend == "numpy":
        import numpy as np

        if dtype != "float32":
            raise LabError(
                f"matmul_flops(backend='numpy', dtype={dtype!r}): NumPy's BLAS multiplies float32 "
                "(and float64); use backend='torch' for bfloat16 and int8"
            )
        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        return lambda: np.matmul(a, a)
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
        g = torch.Generator().manual_seed(0)
        if dtype == "int8":
            # int8 x int8 -> int32: the arithmetic of llama.cpp's quantized dot products (VNNI where present)
            a = torch.randint(-64, 64, (n, n), dtype=torch.int8, generator=g)
            return lambda: torch._int_mm(a, a)
        a = torch.randn((n, n), generator=g).to(getattr(torch, dtype))
        return lambda: torch.matmul(a, a)
    if backend == "mlx":
        import mlx.core as mx
        import numpy as np

        if dtype not in ("float32", "bfloat16"):
            raise LabError(f"matmul_flops(backend='mlx', dtype={dtype!r}): expected float32 or bfloat16")
        a = mx.array(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)).astype(getattr(mx, dtype))
        return lambda: mx.eval(mx.matmul(a, a))
    raise LabError(f"backend={backend!r}: expected numpy, torch or mlx")


def matmul_flops(
    dtype: str = "float32", n: int = 1024, reps: int = 5, backend: str = "auto", threads: int | None = None
) -> dict:
    """Matrix-multiply rate, FLOP/s: two n x n matrices of ``dtype`` multiplied ``reps`` times after one
    unrecorded warm-up; 2 n^3 FLOP per product (one multiply and one add per term).

    ``backend``: "numpy" (its BLAS; float32), "torch" (float32, bfloat16, int8 through
    ``torch._int_mm``), "mlx" (float32, bfloat16), or "auto" (numpy for float32, torch otherwise).
    ``threads`` (default :func:`cpus_usable`) applies to torch; NumPy's BLAS uses its own pool.
    Returns {dtype, backend, n, flop_per_s (median), min, max, reps, threads}. Raises LabError for a
    dtype or backend this function does not know, or one whose library is missing.
    """
    import time

    from .errors import LabError

    if dtype not in MATMUL_DTYPES:
        raise LabError(f"dtype={dtype!r}: expected one of {', '.join(MATMUL_DTYPES)}")
    if not isinstance(n, int) or n < 1 or reps < 1:
        raise LabError(f"n={n!r}, reps={reps!r}: expected a matrix size and repetitions of at least 1")
    backend = ("numpy" if dtype == "float32" else "torch") if backend == "auto" else backend
    threads = cpus_usable() if threads is None else threads
    try:
        run = _matmul_runner(backend, dtype, n, threads)
    except ImportError as e:
        raise LabError(
            f"matmul_flops(backend={backend!r}): {e.name or backend} is not installed; "
            "install it (make setup) or pick another backend"
        ) from None
    run()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        rates.append(2 * n**3 / (time.perf_counter() - t0))
    s = _spread(rates)
    return {
        "dtype": dtype,
        "backend": backend,
        "n": n,
        "flop_per_s": s["median"],
        "min": s["min"],
        "max": s["max"],
        "reps": s["reps"],
        "threads": threads,
    }


def machine_key() -> str:
    """What makes two measurements comparable: hostname, CPU model and the CPUs this process may use."""
    import hashlib

    hw = hardware_info()
    raw = f"{hw['hostname']}|{hw['cpu_model']}|{cpus_usable()}|{hw['accelerator']}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def measurement_path() -> Path:
    """Where this machine's measurement is cached: <lab home>/hardware/<machine key>.json."""
    from .config import lab_home

    return lab_home() / "hardware" / f"{machine_key()}.json"


def cached_measurement() -> dict | None:
    """This machine's cached :func:`measure_machine` result, or None when it was never measured."""
    import json

    p = measurement_path()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == MEASUREMENT_VERSION else None


def measure_machine(refresh: bool = False, quick: bool | None = None) -> dict:
    """This machine's roofline ceilings, measured once and cached (:func:`measurement_path`).

    Returns {version, machine_key, cpu_model, threads, time, bandwidth: {read, copy, triad}
    (:func:`stream_bandwidth` results, bytes/s), matmul: {float32, bfloat16, int8}
    (:func:`matmul_flops` results, FLOP/s; bfloat16 and int8 only where torch runs them),
    bytes_per_s (the read kernel's median: the roofline's bandwidth), flop_per_s ({dtype: median})}.
    ``refresh`` measures again;
    ``quick`` (default: quick mode) uses fewer repetitions and smaller matrices (about 1 s
    instead of about 10 on two cores).
    """
    import datetime as _dt
    import json

    from .config import quick_mode

    if not refresh:
        cached = cached_measurement()
        if cached:
            return cached
    quick = quick_mode() if quick is None else quick
    reps, n = (3, 1024) if quick else (5, 2048)
    bw = {k: stream_bandwidth(k, reps=reps) for k in STREAM_KERNELS}
    mm = {"float32": matmul_flops("float32", n=n, reps=reps)}
    for dtype in ("bfloat16", "int8"):
        try:
            mm[dtype] = matmul_flops(dtype, n=n, reps=reps, backend="torch")
        except Exception:  # no torch, or this torch/CPU has no kernel for the type
            pass
    out = {
        "version": MEASUREMENT_VERSION,
        "machine_key": machine_key(),
        "cpu_model": hardware_info()["cpu_model"],
        "threads": cpus_usable(),
        "quick": quick,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "bandwidth": bw,
        "matmul": mm,
        "bytes_per_s": bw[ROOFLINE_KERNEL]["bytes_per_s"],
        "flop_per_s": {k: v["flop_per_s"] for k, v in mm.items()},
    }
    p = measurement_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(p)
    except OSError:
        pass  # a read-only lab home: the measurement is still returned
    return out


def measured_summary() -> dict:
    """Manifest fields from this machine's cached measurement: {measured_bandwidth_gbps,
    measured_float32_gflops, measured_bfloat16_gflops, measured_int8_gops} (GB/s = 1e9 bytes/s,
    GFLOP/s = 1e9 FLOP/s), or {} when the machine was never measured (nothing is measured here)."""
    m = cached_measurement()
    if not m:
        return {}
    out = {"measured_bandwidth_gbps": m["bytes_per_s"] / 1e9}
    for dtype, unit in (("float32", "gflops"), ("bfloat16", "gflops"), ("int8", "gops")):
        if dtype in m.get("flop_per_s", {}):
            out[f"measured_{dtype}_{unit}"] = m["flop_per_s"][dtype] / 1e9
    return out
