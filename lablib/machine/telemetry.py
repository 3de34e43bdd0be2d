"""The GPU's own facts during a run, through NVML (``nvidia-ml-py``, module ``pynvml``), and what a run costs.

:class:`GpuTelemetry` samples every NVIDIA GPU while a run goes on, in a thread of its own, every
:data:`INTERVAL_S`: memory used (``nvmlDeviceGetMemoryInfo``), SM clock (``nvmlDeviceGetClockInfo(...,
NVML_CLOCK_SM)``), power draw (``nvmlDeviceGetPowerUsage``, mW) and the board's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and later). The counter updates about
every 100 ms, so energy is only reported over a window of at least :data:`MIN_ENERGY_WINDOW_S` (shorter: None,
said in ``energy_note``); per output token it is the whole board's energy over the run's window, idle
streams and the other processes on that GPU included. Where there is no NVML (no NVIDIA driver, no
``nvidia-ml-py``: every CPU-only machine) it says why and measures nothing.

:func:`cost_per_million_tokens`: any device, CPU too: what the machine's time cost for the run's output, from a
price per hour the user gives (the sources' metric list names cost per million tokens): the whole machine for
the run's makespan, spread over its output tokens.
"""

from __future__ import annotations

import statistics
import threading
import time

INTERVAL_S = 0.1
MIN_ENERGY_WINDOW_S = 5.0  # 50 updates of the ~100 ms counter: its granularity is 2 % of the window or less


def cost_per_million_tokens(price_per_hour: float | None, makespan_s: float | None, output_tokens: int) -> float | None:
    """``price_per_hour`` (any currency an hour) x the run's ``makespan_s`` / ``output_tokens``, per million
    tokens; None without a price or tokens. The machine's whole price: at a higher concurrency the same machine
    serves more tokens in its hour, so a cost is a fact of the load it was measured at."""
    from lablib.errors import LabError

    if price_per_hour is None:
        return None
    if isinstance(price_per_hour, bool) or not isinstance(price_per_hour, (int, float)) or not price_per_hour >= 0:
        raise LabError(f"price_per_hour={price_per_hour!r}: expected the machine's price for one hour, 0 or more")
    if not output_tokens or not makespan_s:
        return None
    return price_per_hour * makespan_s / 3600.0 / output_tokens * 1e6


def nvml():
    """(pynvml, None) when NVML answers here (initialised), else (None, why)."""
    try:
        import pynvml
    except ImportError:
        return None, "no nvidia-ml-py (pip install -e .[gpu], or nvidia-ml-py) to read the GPU's counters"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded ...: no GPU driver here
        return None, f"NVML did not start ({type(e).__name__}: {e}): no NVIDIA driver here"
    return pynvml, None


def gpu_facts() -> dict:
    """{gpus: [{index, name, memory_total_bytes}], driver, cuda_version} from NVML, or {gpus: [], why}."""
    lib, why = nvml()
    if lib is None:
        return {"gpus": [], "why": why}
    try:
        n = lib.nvmlDeviceGetCount()
        gpus = []
        for i in range(n):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            name = lib.nvmlDeviceGetName(h)
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total_bytes": int(lib.nvmlDeviceGetMemoryInfo(h).total),
                }
            )
        driver = lib.nvmlSystemGetDriverVersion()
        cuda = lib.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 13000 for 13.0
        return {
            "gpus": gpus,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    finally:
        lib.nvmlShutdown()


class GpuTelemetry:
    """Every NVIDIA GPU sampled during a run: ``with GpuTelemetry() as t: ...`` then ``t.summary(output_tokens)``.

    Per GPU: memory used at the start and its peak (bytes), SM clock median (MHz), power median and max (W),
    energy over the window (J: the energy counter's difference) and, given the run's output tokens, J per
    output token (the sum over GPUs). ``available`` False (and ``why``) where NVML does not answer: then the
    summary is ``{"gpu_telemetry": why}`` and nothing was sampled."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self._lib, self.why = nvml()
        self.available = self._lib is not None
        self._handles = []
        self._samples: list[list[tuple]] = []
        self._energy0: list = []
        self._energy1: list = []
        self._stop = threading.Event()
        self._thread = None
        self.t0 = self.t1 = None

    def _energy(self, h):
        try:
            return int(self._lib.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ
        except Exception:  # noqa: BLE001 - a GPU older than Volta has no counter
            return None

    def _sample(self) -> None:
        lib = self._lib
        for k, h in enumerate(self._handles):
            try:
                mem = int(lib.nvmlDeviceGetMemoryInfo(h).used)
                clock = int(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))
                power = lib.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception:  # noqa: BLE001 - one failed read is one sample fewer
                continue
            self._samples[k].append((time.perf_counter(), mem, clock, power))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self):
        if not self.available:
            return self
        lib = self._lib
        self._handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
        self._samples = [[] for _ in self._handles]
        self._energy0 = [self._energy(h) for h in self._handles]
        self.t0 = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self.available:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        self._energy1 = [self._energy(h) for h in self._handles]
        self.t1 = time.perf_counter()
        self._lib.nvmlShutdown()

    def summary(self, output_tokens: int | None = None) -> dict:
        """``{"gpu_telemetry": [per GPU ...], "energy_j", "j_per_output_token", "energy_note"}`` (see the class)."""
        if not self.available:
            return {"gpu_telemetry": self.why}
        window = (self.t1 or time.perf_counter()) - self.t0
        per, total = [], 0.0
        for k, samples in enumerate(self._samples):
            mems = [s[1] for s in samples]
            clocks = [s[2] for s in samples]
            powers = [s[3] for s in samples]
            e0, e1 = self._energy0[k], self._energy1[k] if self._energy1 else None
            energy = (e1 - e0) / 1000.0 if e0 is not None and e1 is not None else None
            total += energy or 0.0
            per.append(
                {
                    "index": k,
                    "memory_used_start_bytes": mems[0] if mems else None,
                    "memory_used_peak_bytes": max(mems) if mems else None,
                    "sm_clock_mhz_p50": statistics.median(clocks) if clocks else None,
                    "power_w_p50": statistics.median(powers) if powers else None,
                    "power_w_max": max(powers) if powers else None,
                    "energy_j": energy,
                    "samples": len(samples),
                }
            )
        short = window < MIN_ENERGY_WINDOW_S
        note = (
            f"window {window:.1f} s is under {MIN_ENERGY_WINDOW_S:g} s: the energy counter updates about every 100 ms"
            if short
            else None
        )
        energy = None if short or all(p["energy_j"] is None for p in per) else total
        return {
            "gpu_telemetry": per,
            "window_s": window,
            "energy_j": energy,
            "j_per_output_token": energy / output_tokens if energy is not None and output_tokens else None,
            "energy_note": note,
        }
