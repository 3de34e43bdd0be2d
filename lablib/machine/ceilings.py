"""This machine's measured ceilings: memory bandwidth and matrix-multiply rate (the roofline's two).

Measured once per machine (:func:`measure_machine`) and cached under the lab home, keyed by
:func:`lablib.machine.identity.machine_key`; the published peaks of machines you do not have are
:mod:`lablib.machine.accelerators`. :func:`machine` gives either as the roofline reads them.
"""

from __future__ import annotations

import time
from pathlib import Path

from lablib.config import budget, lab_home, quick_mode
from lablib.machine.identity import hardware_info, machine_key
from lablib.machine.limits import cpus_usable
from lablib.results.schema import MEASURED_BANDWIDTH, MEASURED_PEAKS

# --- measured: memory bandwidth and matrix-multiply rate (the roofline's two ceilings) --------------
# STREAM (McCalpin, "Memory Bandwidth and Machine Balance in Current High Performance Computers",
# IEEE TCCA Newsletter 1995; www.cs.virginia.edu/stream): each array at least 4 x the last-level cache,
# bytes counted as the kernel names them (copy a = b: 2 x 8 bytes per element; triad a = b + s*c:
# 3 x 8), write-allocate traffic not counted, the best of the repetitions reported. Here the median
# is each kernel's typical figure (``bytes_per_s``) and the spread (min, max) comes with it. The roofline's
# ceiling is the best repetition (``max``), as STREAM reports: the machine is shared, the best run is the one
# nobody else used, and a ceiling is what the machine showed it can do. A median ceiling put rows above 100 %
# of their bound (Gemma 3's llama.cpp decode read 101 % of the median read bandwidth, within its spread).
# "read" (1 x 8 bytes per element, no writes) is not STREAM's: it is what a decode step does to the weights, so it
# is the bandwidth the roofline uses (lmbench's bw_mem "rd" measures the same). It ORs b's 64-bit words together:
# integer work the vector units do far faster than memory delivers. It summed the floats (NumPy's pairwise sum)
# until that proved to be bound by its additions on a fast machine: on a 2-core Intel Xeon with AVX-512 the sum
# read 18.1 GB/s where the OR read 21.5 (1 GiB, 2 threads, best of 5), and lab 07 showed transformers' decode
# at 115 % of the sum's figure.
STREAM_KERNELS = {"read": 1, "copy": 2, "triad": 3}  # arrays touched per element
ROOFLINE_KERNEL = "read"
STREAM_ARRAY_BYTES = 64 * 2**20  # per array, at least: 2 x the 32 MiB L3 of the lab's EPYC, 4 x a 16 MiB laptop L3
# per array, at most: STREAM's 4 x the last-level cache (stream_array_bytes) within this and an eighth of the
# memory available. That Xeon's VM reports an L3 of 480 MiB: its 64 MiB arrays read 26-32 GB/s, partly from cache,
# against 20 from 128 MiB up
STREAM_MAX_ARRAY_BYTES = 2**30
_STREAM_BLOCK = 2**15  # float64 elements a thread handles per step (256 KiB: the temporaries stay in L2)
MATMUL_DTYPES = ("float32", "bfloat16", "int8")
# 4: float32 through NumPy's BLAS and torch's, the faster the roof; the key names the CPU's signature; 5: the read
# kernel ORs words (it summed floats), over arrays of 4 x the last-level cache
MEASUREMENT_VERSION = 5
# measure_machine's bfloat16 and int8 products (torch's kernels, slow without AVX-512 or AMX): the largest size
# whose one product stays within it. float32 keeps its full size: it is the roof of every engine on a CPU
MAX_PRODUCT_S = 0.5
# float32 products: NumPy's BLAS (OpenBLAS in its wheels) and torch's (MKL / oneDNN in its x86 builds), which
# transformers calls. On a 2-core AMD EPYC with AVX2 only, best passes at n = 2048 over nine measurements: NumPy's
# 137-173 GFLOP/s in 8 of 9 (77 in one slow minute), torch's 108-142; another machine can order them the other way.
FLOAT32_BACKENDS = ("numpy", "torch")


def _spread(values: list[float]) -> dict:
    import statistics

    return {"median": statistics.median(values), "min": min(values), "max": max(values), "reps": len(values)}


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest CPU cache of this machine in bytes, as Linux's sysfs states it (``root``'s ``index*/size``:
    ``491520K``); None elsewhere or where it says none."""
    sizes = []
    for f in Path(root).glob("index*/size"):
        try:
            text = f.read_text().strip()
        except (OSError, ValueError):  # unreadable, or not text
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if unit != 1 else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes and max(sizes) > 0 else None


def stream_array_bytes() -> int:
    """Bytes of each STREAM array on this machine: 4 x its last-level cache (STREAM's rule), at least
    :data:`STREAM_ARRAY_BYTES`, at most :data:`STREAM_MAX_ARRAY_BYTES` and an eighth of the memory available (the
    triad holds three arrays)."""
    from lablib.machine.limits import available_ram_bytes

    want = 4 * (last_level_cache_bytes() or 0)
    return max(STREAM_ARRAY_BYTES, min(want, STREAM_MAX_ARRAY_BYTES, available_ram_bytes() // 8))


def stream_bandwidth(
    kernel: str = "triad", array_bytes: int | None = None, reps: int = 5, threads: int | None = None
) -> dict:
    """Memory bandwidth of a STREAM-style ``kernel`` ("read": an OR over b's 64-bit words, "copy" a = b, or
    "triad" a = b + 3 c), bytes/s.

    float64 arrays of ``array_bytes`` each (default :func:`stream_array_bytes`: past the last-level cache), split
    into ``threads`` contiguous slices (default :func:`cpus_usable`), each thread walking its slice
    in 256 KiB blocks with NumPy (which releases the GIL), so the triad's temporary ``3 c`` stays in
    cache and memory sees what STREAM counts: 1 (read), 2 (copy) or 3 (triad) x 8 bytes per element.
    One unrecorded pass first (page faults), then ``reps`` timed passes.

    Returns {kernel, bytes_per_s (median), min, max, reps, threads, array_bytes, bytes_per_pass}.
    Raises LabError for an unknown kernel or sizes/reps/threads below 1.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from lablib.errors import LabError

    if kernel not in STREAM_KERNELS:
        raise LabError(f"kernel={kernel!r}: expected one of {', '.join(STREAM_KERNELS)}")
    threads = cpus_usable() if threads is None else threads
    array_bytes = stream_array_bytes() if array_bytes is None else array_bytes
    if not (isinstance(array_bytes, int) and array_bytes >= 8 * threads) or reps < 1 or threads < 1:
        raise LabError(
            f"array_bytes={array_bytes!r}, reps={reps}, threads={threads}: expected whole numbers, "
            "reps and threads at least 1 and at least 8 bytes per thread (default 4 x the last-level cache, "
            "64 MiB to 1 GiB; 5 reps)"
        )
    n = array_bytes // 8
    # only the arrays the kernel touches (three of up to 1 GiB each would take seconds to write for one read)
    b = np.ones(n)
    a = np.zeros(n) if kernel != "read" else None
    c = np.full(n, 2.0) if kernel == "triad" else None
    words = b.view(np.uint64)  # the read kernel's: the same bytes, ORed as integers
    bounds = np.linspace(0, n, threads + 1).astype(int)

    sums = []  # keeps the read kernel's results alive (list.append is thread-safe)

    def work(lo: int, hi: int) -> None:
        tmp = np.empty(min(_STREAM_BLOCK, hi - lo))
        for s in range(lo, hi, _STREAM_BLOCK):
            e = min(s + _STREAM_BLOCK, hi)
            if kernel == "read":
                sums.append(int(np.bitwise_or.reduce(words[s:e])))
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
    from lablib.errors import LabError

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
    dtype: str = "float32",
    n: int = 1024,
    reps: int = 5,
    backend: str = "auto",
    threads: int | None = None,
    max_product_s: float | None = None,
) -> dict:
    """Matrix-multiply rate, FLOP/s: two n x n matrices of ``dtype`` multiplied ``reps`` times after one
    unrecorded warm-up; 2 n^3 FLOP per product (one multiply and one add per term).

    ``max_product_s`` (seconds; None: n as given): ``n`` is then the largest size, reached from 256 by doubling
    while the next product, eight times the last one's time, is predicted within it; each size's first product
    is a warm-up. A slow kernel is measured on smaller matrices: torch's bfloat16 product ran at 0.2 GFLOP/s on an
    AVX2-only EPYC, 86 s for one 2048 x 2048 product and 9 minutes for :func:`measure_machine`'s five.

    ``backend``: "numpy" (its BLAS; float32), "torch" (float32, bfloat16, int8 through
    ``torch._int_mm``), "mlx" (float32, bfloat16), or "auto" (numpy for float32, torch otherwise).
    ``threads`` (default :func:`cpus_usable`) applies to torch; NumPy's BLAS uses its own pool.
    Returns {dtype, backend, n (the size measured), flop_per_s (median), min, max, reps, threads}. Raises
    LabError for a dtype or backend this function does not know, or one whose library is missing.
    """

    from lablib.errors import LabError

    if dtype not in MATMUL_DTYPES:
        raise LabError(f"dtype={dtype!r}: expected one of {', '.join(MATMUL_DTYPES)}")
    if not isinstance(n, int) or n < 1 or reps < 1:
        raise LabError(f"n={n!r}, reps={reps!r}: expected a matrix size and repetitions of at least 1")
    backend = ("numpy" if dtype == "float32" else "torch") if backend == "auto" else backend
    threads = cpus_usable() if threads is None else threads
    size = n if max_product_s is None else min(n, 256)
    while True:
        try:
            run = _matmul_runner(backend, dtype, size, threads)
        except ImportError as e:
            raise LabError(
                f"matmul_flops(backend={backend!r}): {e.name or backend} is not installed; "
                "install it (make setup) or pick another backend"
            ) from None
        t0 = time.perf_counter()
        run()  # the warm-up of this size
        took = time.perf_counter() - t0
        if max_product_s is None or size * 2 > n or took * 8 > max_product_s:
            break
        size *= 2
    n = size
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


def best_float32(n: int, reps: int) -> dict:
    """:func:`matmul_flops` of float32 through each of :data:`FLOAT32_BACKENDS` that is installed, the one with the
    best repetition returned, with ``backends``: {backend: {flop_per_s, min, max}} of all. The roof is the fastest
    float32 product this machine ran: transformers multiplies through torch, and held to NumPy's rate alone its
    prefill could read above 100 % of its bound wherever torch's BLAS is the faster."""
    from lablib.errors import LabError

    found = {}
    for backend in FLOAT32_BACKENDS:
        try:
            found[backend] = matmul_flops("float32", n=n, reps=reps, backend=backend)
        except LabError:  # torch is not installed
            continue
    best = max(found.values(), key=lambda r: r["max"])
    return {**best, "backends": {b: {k: r[k] for k in ("flop_per_s", "min", "max")} for b, r in found.items()}}


def ceiling_table(m: dict | None = None):
    """A measurement (:func:`measure_machine`, default this machine's) as a table: one row per bandwidth kernel
    (GB/s) and per matrix product (GFLOP/s; GOP/s for int8), float32 once per backend, with median, min, max
    and ``roof``: True where the row's ``max`` is a ceiling the roofline uses: the read kernel, the fastest float32
    backend, and bfloat16 or int8 only where it beat that (:func:`peak_flops` holds those two to float32's)."""
    import pandas as pd

    m = m or measure_machine()
    out = [
        {
            "ceiling": f"bandwidth, {k}",
            "median": v["bytes_per_s"],
            "min": v["min"],
            "max": v["max"],
            "unit": "GB/s",
            "roof": k == ROOFLINE_KERNEL,
        }
        for k, v in m["bandwidth"].items()
    ]
    for dtype, v in m["matmul"].items():
        unit = "GOP/s" if dtype == "int8" else "GFLOP/s"
        for backend, r in (v.get("backends") or {v.get("backend", "torch"): v}).items():
            out.append(
                {
                    "ceiling": f"matmul, {dtype} ({backend})",
                    "median": r["flop_per_s"],
                    "min": r["min"],
                    "max": r["max"],
                    "unit": unit,
                    "roof": backend == v.get("backend", backend) and peak_flops(m, dtype) == r["max"],
                }
            )
    df = pd.DataFrame(out)
    df[["median", "min", "max"]] = df[["median", "min", "max"]] / 1e9
    return df


def measurement_path() -> Path:
    """Where this machine's measurement is cached: <lab home>/hardware/<machine key>.json."""
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
    bytes_per_s (the read kernel's best repetition: the roofline's bandwidth), flop_per_s ({dtype: best})}.
    ``refresh`` measures again;
    ``quick`` (default: quick mode) uses fewer repetitions (3 instead of 5; 3-5 s either way on a 2-core AMD
    EPYC with AVX2 only, where the n = 1024 bfloat16 and int8 products alone used to take 14 s in quick mode; 6-9 s
    on a 2-core Xeon whose 480 MiB L3 makes the bandwidth arrays 1 GiB each, 5 s of them the three kernels).
    float32 is measured at ``matmul_n`` (2048) in both modes: at 1024 the same machine's float32 product reached
    100-110 GFLOP/s against 137-173 at 2048 (45-52 on a busy minute, below the 85 GFLOP/s that transformers'
    own 128-token prefill attained on a quiet one). bfloat16 and int8 grow only within :data:`MAX_PRODUCT_S` a
    product (:func:`matmul_flops`).
    """
    import datetime as _dt

    if not refresh:
        cached = cached_measurement()
        if cached:
            return cached
    quick = quick_mode() if quick is None else quick
    reps, n = budget("machine", "reps", quick), budget("machine", "matmul_n", quick)
    bw = {k: stream_bandwidth(k, reps=reps) for k in STREAM_KERNELS}
    mm = {"float32": best_float32(n, reps)}
    for dtype in ("bfloat16", "int8"):
        try:
            mm[dtype] = matmul_flops(dtype, n=n, reps=reps, backend="torch", max_product_s=MAX_PRODUCT_S)
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
        # the roofline's ceilings: each kernel's best repetition
        "bytes_per_s": bw[ROOFLINE_KERNEL]["max"],
        "flop_per_s": {k: v["max"] for k, v in mm.items()},
    }
    return save_measurement(measurement_path(), out)


def save_measurement(path: Path, m: dict) -> dict:
    """Write a measurement to ``path``, whole or not at all (:func:`lablib.staging.staged`); ``m`` either way (a
    read-only lab home: the measurement is still returned)."""
    import json

    from lablib.staging import staged

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with staged(path) as tmp:
            tmp.write_text(json.dumps(m, indent=1))
    except OSError:
        pass
    return m


def measured_summary() -> dict:
    """Manifest fields from this machine's cached measurement, named by
    :data:`lablib.results.schema.MEASURED_BANDWIDTH` and ``MEASURED_PEAKS``: {measured_bandwidth_gbps,
    measured_float32_gflops, measured_bfloat16_gflops, measured_int8_gops} (GB/s = 1e9 bytes/s,
    GFLOP/s = 1e9 FLOP/s), or {} when the machine was never measured (nothing is measured here)."""
    return summary_of(cached_measurement())


def summary_of(m: dict | None) -> dict:
    """A measurement's ``bytes_per_s`` and ``flop_per_s`` as the manifest's columns (GB/s, GFLOP/s); {} for None."""
    if not m:
        return {}
    out = {MEASURED_BANDWIDTH: m["bytes_per_s"] / 1e9}
    for dtype, col in MEASURED_PEAKS.items():
        if dtype in m.get("flop_per_s", {}):
            out[col] = m["flop_per_s"][dtype] / 1e9
    return out


# --- a machine's ceilings, as the roofline reads them ------------------------------------------------
def machine(name=None) -> dict:
    """A machine's ceilings {name, bytes_per_s, flop_per_s: {dtype: FLOP/s}, source}: None or "this" for
    this machine's measurement (:func:`measure_machine`: measured once and cached), a name of
    :data:`lablib.machine.accelerators.ACCELERATORS` (published peaks), or such a dict (returned as is).
    Raises LabError for an unknown name."""
    from lablib.errors import LabError
    from lablib.machine.accelerators import ACCELERATORS

    if isinstance(name, dict):
        return name
    if name in (None, "this"):
        m = measure_machine()
        return {
            "name": f"this machine ({m['cpu_model']}, {m['threads']} threads)",
            "bytes_per_s": m["bytes_per_s"],
            "flop_per_s": dict(m["flop_per_s"]),
            "source": f"measured {m['time']} (read kernel; matmul)",
        }
    if name not in ACCELERATORS:
        raise LabError(f"machine {name!r}: unknown; expected 'this' or one of {', '.join(ACCELERATORS)}")
    a = ACCELERATORS[name]
    return {"name": name, "bytes_per_s": a["bytes_per_s"], "flop_per_s": dict(a["flop_per_s"]), "source": a["source"]}


def peak_flops(mach: dict, dtype: str) -> float:
    """The machine's FLOP/s for ``dtype``, float32's when it has none for that type, inf when it has neither
    (then only bandwidth bounds). int8 and bfloat16 are at least float32's: a narrower product can always be
    widened to float32 and run at its rate, and torch's own narrow kernels are often far slower than the machine.
    torch's int8 product (``torch._int_mm``) has a fast kernel only with VNNI or AMX, and without them it measured
    2 GOP/s on an AVX2-only AMD EPYC whose float32 product ran at 111 GFLOP/s, while llama.cpp's int8 dot products
    there (AVX2 ``maddubs``: 32 multiply-adds an instruction, a float32 FMA 8) ran its Q4_K_M decode 15 times past
    that int8 figure. On a 2-core AMD EPYC with AVX-512 (avx512_bf16, VNNI), torch's bfloat16 product measured
    0.84 GFLOP/s and its int8 0.95 GOP/s beside float32's 54 GFLOP/s: held to them, a 16-bit model's decode read
    as compute-bound there, where llama.cpp computes F16 weights in float32 and is bound by bandwidth. The slow
    kernel is torch's, not the machine's roof."""
    f = mach.get("flop_per_s") or {}
    if dtype in ("int8", "bfloat16") and f.get(dtype) and f.get("float32"):
        return max(f[dtype], f["float32"])
    return f.get(dtype) or f.get("float32") or float("inf")
