"""The machine's own counters during a run: the GPU's through NVML (``nvidia-ml-py``, module ``pynvml``), the CPU
packages' energy through Linux's RAPL powercap files, and what a run costs.

:class:`GpuTelemetry` samples every NVIDIA GPU while a run goes on, in a thread of its own, every
:data:`INTERVAL_S`: memory used (``nvmlDeviceGetMemoryInfo``), SM clock (``nvmlDeviceGetClockInfo(...,
NVML_CLOCK_SM)``), power draw (``nvmlDeviceGetPowerUsage``, mW) and the board's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and later). The counter updates about
every 100 ms, so energy is only reported over a window of at least :data:`MIN_ENERGY_WINDOW_S` (shorter: None,
said in ``gpu_energy_note``); per output token it is the whole board's energy over the run's window, idle
streams and the other processes on that GPU included. Where there is no NVML (no NVIDIA driver, no
``nvidia-ml-py``: every CPU-only machine) it says why and measures nothing. Its samples come from a *source*
(:class:`NvmlSource` by default; any object with the same five methods, e.g. recorded samples in a test).

:class:`CpuEnergy` reads the CPU packages' energy counters where Linux exposes RAPL
(``/sys/class/powercap/intel-rapl:N/energy_uj``, µJ; AMD Zen through the same interface since Linux 5.8), once at
the start, every :data:`RAPL_INTERVAL_S` and at the end, adding each difference and the counter's wrap at
``max_energy_range_uj``. Since 2020 (CVE-2020-8694) ``energy_uj`` is usually readable by root only: then it says
so. It reads the folder it is given (``root``), so a test lays out a folder like ``/sys/class/powercap``.

:class:`RunTelemetry` is both around one run, with one summary. :func:`cost_per_million_tokens`: any device, CPU
too: what the machine's time cost for the run's output, from a price per hour the user gives (the sources'
metric list names cost per million tokens): the whole machine for the run's makespan, spread over its output
tokens.

Sources: NVML API reference (docs.nvidia.com/deploy/nvml-api: nvmlDeviceGetTotalEnergyConsumption, mJ;
nvmlDeviceGetPowerUsage, mW; nvmlSystemGetCudaDriverVersion_v2, 1000 x major + 10 x minor); Linux's powercap
documentation (docs.kernel.org/power/powercap/powercap.html: energy_uj, max_energy_range_uj, µJ).
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from pathlib import Path

INTERVAL_S = 0.1
MIN_ENERGY_WINDOW_S = 5.0  # 50 updates of the ~100 ms counter: its granularity is 2 % of the window or less
RAPL_ROOT = "/sys/class/powercap"
# a read a second keeps up with the counter's wrap: its range is at least 2^32 µJ (4295 J), 4.3 kW for a second
RAPL_INTERVAL_S = 1.0


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


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)  # older pynvml returned bytes


class NvmlSource:
    """The GPUs' counters through NVML: the source :class:`GpuTelemetry` and :func:`gpu_facts` read by default.

    A source has five methods: ``open()`` (None once open, else why not: then nothing else is called),
    ``count()`` (GPUs), ``facts()`` (:func:`gpu_facts`'s dict), ``read(k)`` (GPU ``k`` now: memory used in
    bytes, SM clock in MHz, power in W) and ``energy_mj(k)`` (its energy counter, mJ; None where it has none),
    and ``close()``."""

    def __init__(self):
        self._lib, self._handles = None, []

    def open(self) -> str | None:
        self._lib, why = nvml()
        if self._lib is None:
            return why
        self._handles = [self._lib.nvmlDeviceGetHandleByIndex(i) for i in range(self._lib.nvmlDeviceGetCount())]
        return None

    def count(self) -> int:
        return len(self._handles)

    def facts(self) -> dict:
        lib = self._lib
        gpus = [
            {
                "index": i,
                "name": _text(lib.nvmlDeviceGetName(h)),
                "memory_total_bytes": int(lib.nvmlDeviceGetMemoryInfo(h).total),
            }
            for i, h in enumerate(self._handles)
        ]
        cuda = lib.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 13000 for 13.0
        return {
            "gpus": gpus,
            "driver": _text(lib.nvmlSystemGetDriverVersion()),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }

    def read(self, k: int) -> tuple[int, float, float]:
        lib, h = self._lib, self._handles[k]
        mem = int(lib.nvmlDeviceGetMemoryInfo(h).used)
        return mem, float(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)), lib.nvmlDeviceGetPowerUsage(h) / 1000.0

    def energy_mj(self, k: int) -> int | None:
        try:
            return int(self._lib.nvmlDeviceGetTotalEnergyConsumption(self._handles[k]))
        except Exception:  # noqa: BLE001 - a GPU older than Volta has no counter
            return None

    def close(self) -> None:
        if self._lib is not None:
            self._lib.nvmlShutdown()
            self._lib = None


def gpu_facts(source=None) -> dict:
    """{gpus: [{index, name, memory_total_bytes}], driver, cuda_version} from ``source`` (:class:`NvmlSource`
    when None), or {gpus: [], why}."""
    source = source if source is not None else NvmlSource()
    why = source.open()
    if why is not None:
        return {"gpus": [], "why": why}
    try:
        if not source.count():
            return {"gpus": [], "why": "NVML answers but lists no GPU"}
        return source.facts()
    finally:
        source.close()


def gpu_manifest(facts: dict | None = None) -> dict | None:
    """The manifest's ``hardware.gpu`` record of ``facts`` (:func:`gpu_facts`; None: this machine's, read once per
    process): ``name`` (the GPUs' names, distinct ones joined by "; "), ``count``, ``memory_total_bytes`` (all
    GPUs'), ``driver``, ``cuda_version`` (the driver's CUDA version) and ``gpus`` (each one); None without a GPU,
    so a CPU machine's manifest and rows get no GPU field."""
    facts = _this_machine_gpus() if facts is None else facts
    gpus = facts.get("gpus") or []
    if not gpus:
        return None
    return {
        "name": "; ".join(dict.fromkeys(g["name"] for g in gpus)),
        "count": len(gpus),
        "memory_total_bytes": sum(int(g["memory_total_bytes"]) for g in gpus),
        "driver": facts.get("driver"),
        "cuda_version": facts.get("cuda_version"),
        "gpus": gpus,
    }


@functools.lru_cache(maxsize=1)
def _this_machine_gpus() -> dict:
    return gpu_facts()


def doctor_lines(facts: dict | None = None, cpu: CpuEnergy | None = None) -> list[str]:
    """``lablib doctor``'s lines on the machine's own counters: each GPU with its memory, the driver and its CUDA
    version (``facts``: :func:`gpu_facts`, None: this machine's), or why there are none; and whether the CPU's
    energy is reported (``cpu``: a :class:`CpuEnergy`, None: this machine's)."""
    facts = gpu_facts() if facts is None else facts
    if facts.get("gpus"):
        names = ", ".join(f"{g['name']} ({g['memory_total_bytes'] / 2**30:.1f} GiB)" for g in facts["gpus"])
        gpu = (
            f"GPU: {names}; driver {facts.get('driver')}, CUDA {facts.get('cuda_version')} "
            "(NVML: memory, SM clock, power and energy sampled during each run)"
        )
    else:
        gpu = f"GPU: none through NVML: {facts.get('why')}"
    cpu = CpuEnergy() if cpu is None else cpu
    if cpu.available:
        what = ", ".join(f"{z.name} ({z.label})" for z in cpu.zones)
        energy = f"CPU energy: RAPL {what} read during each run"
    else:
        energy = f"CPU energy: {cpu.why}"
    return [gpu, energy]


class _Sampled:
    """What GpuTelemetry and CpuEnergy share: a thread calling ``sample()`` every ``interval_s`` between
    :meth:`_start` and :meth:`_end` (none when ``interval_s`` is None), with a last sample at the end and the
    window's ends on ``clock`` (``t0``, ``t1``)."""

    interval_s: float | None
    clock = staticmethod(time.perf_counter)

    def _init_sampling(self, interval_s, clock) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._stop = threading.Event()
        self._thread = None
        self.t0 = self.t1 = None

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def _start(self) -> None:
        self.t0 = self.clock()
        if self.interval_s:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()
        self.t1 = self.clock()


class GpuTelemetry(_Sampled):
    """Every NVIDIA GPU sampled during a run: ``with GpuTelemetry() as t: ...`` then ``t.summary(output_tokens)``.

    Per GPU: memory used at the start and its peak (bytes), SM clock median (MHz), power median and max (W),
    energy over the window (J: the energy counter's difference). ``available`` False (and ``why``) where the
    source does not answer: then the summary is ``{"gpu_telemetry": why}`` and nothing was sampled.

    ``source``: where the samples come from (:class:`NvmlSource` when None; its docstring names the five
    methods). ``clock``: the time of each sample and of the window's ends (seconds; the lab's clock,
    ``time.perf_counter``, so samples line up with the rows' ``t_*``). ``interval_s`` None: no thread, a sample
    at the start, at the end and at each :meth:`sample` call."""

    def __init__(self, interval_s: float | None = INTERVAL_S, source=None, clock=time.perf_counter):
        self._init_sampling(interval_s, clock)
        self._source = source if source is not None else NvmlSource()
        self.why = self._source.open()
        if self.why is None and not self._source.count():
            self._source.close()
            self.why = "NVML answers but lists no GPU"
        self.available = self.why is None
        self._n = self._source.count() if self.available else 0
        self._samples: list[list[tuple]] = [[] for _ in range(self._n)]
        self._energy0: list = []
        self._energy1: list = []

    def sample(self) -> None:
        """One sample of every GPU now (a failed read is one sample fewer)."""
        for k in range(self._n):
            try:
                mem, clock, power = self._source.read(k)
            except Exception:  # noqa: BLE001 - one failed read is one sample fewer
                continue
            self._samples[k].append((self.clock(), mem, clock, power))

    def __enter__(self):
        if not self.available:
            return self
        self._energy0 = [self._source.energy_mj(k) for k in range(self._n)]
        self._start()
        self.sample()
        return self

    def __exit__(self, *exc):
        if not self.available:
            return
        self._end()
        self._energy1 = [self._source.energy_mj(k) for k in range(self._n)]
        self._source.close()

    def summary(self, output_tokens: int | None = None) -> dict:
        """The run's GPU columns (:data:`lablib.results.schema.TELEMETRY`): ``gpu_telemetry`` (per GPU, as the
        class says; where unavailable, why: then nothing else), ``telemetry_window_s``,
        ``gpu_memory_used_peak_bytes`` (the GPUs' peaks added), ``gpu_sm_clock_mhz_p50`` (over every GPU's
        samples), ``gpu_power_w_p50`` (the GPUs' medians added), ``gpu_energy_j`` (all GPUs; None under
        :data:`MIN_ENERGY_WINDOW_S` or without a counter), ``gpu_j_per_output_token`` and ``gpu_energy_note``
        (why there is no energy, or None)."""
        if not self.available:
            return {"gpu_telemetry": self.why}
        window = (self.t1 if self.t1 is not None else self.clock()) - self.t0
        per, total = [], 0.0
        for k, samples in enumerate(self._samples):
            mems = [s[1] for s in samples]
            clocks = [s[2] for s in samples]
            powers = [s[3] for s in samples]
            e0 = self._energy0[k]
            e1 = self._energy1[k] if self._energy1 else None
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
        no_counter = all(p["energy_j"] is None for p in per)
        note = (
            f"window {window:.1f} s is under {MIN_ENERGY_WINDOW_S:g} s: the energy counter updates about every 100 ms"
            if short
            else "no energy counter on this GPU (NVML's total energy: Volta and later)"
            if no_counter
            else None
        )
        energy = None if short or no_counter else total
        peaks = [p["memory_used_peak_bytes"] for p in per if p["memory_used_peak_bytes"] is not None]
        clocks = [s[2] for samples in self._samples for s in samples]
        powers = [p["power_w_p50"] for p in per if p["power_w_p50"] is not None]
        return {
            "gpu_telemetry": per,
            "telemetry_window_s": window,
            "gpu_memory_used_peak_bytes": sum(peaks) if peaks else None,
            "gpu_sm_clock_mhz_p50": statistics.median(clocks) if clocks else None,
            "gpu_power_w_p50": sum(powers) if powers else None,
            "gpu_energy_j": energy,
            "gpu_j_per_output_token": energy / output_tokens if energy is not None and output_tokens else None,
            "gpu_energy_note": note,
        }


class RaplZone:
    """One RAPL package domain: its folder name (``intel-rapl:0``), its label (its ``name`` file: ``package-0``),
    its path and the counter's range (``max_energy_range_uj``, µJ: the value it wraps at)."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.label = (path / "name").read_text().strip() if (path / "name").is_file() else path.name
        self.max_range_uj = int((path / "max_energy_range_uj").read_text())

    def energy_uj(self) -> int:
        return int((self.path / "energy_uj").read_text())


class CpuEnergy(_Sampled):
    """The CPU packages' energy over a run from RAPL (``with CpuEnergy() as e: ...`` then
    ``e.summary(output_tokens)``): every package domain under ``root`` (``intel-rapl:N`` whose ``name`` starts
    with "package": not its core/uncore/dram subdomains ``intel-rapl:N:M``, nor psys, the platform, nor the
    ``intel-rapl-mmio`` copy of a package), read at the start, every ``interval_s`` (None: no thread, and at each
    :meth:`sample` call) and at the end; each difference is added, a counter that went down having wrapped at
    its ``max_energy_range_uj`` once. ``available`` False (and ``why``) where there is no RAPL or it may not be
    read (root only). ``clock``: the window's ends, seconds."""

    def __init__(self, root=RAPL_ROOT, interval_s: float | None = RAPL_INTERVAL_S, clock=time.perf_counter):
        self.root = Path(root)
        self._init_sampling(interval_s, clock)
        self.zones: list[RaplZone] = []
        self.why = self._find()
        self.available = self.why is None
        self._last: list[int] = []
        self._total_uj: list[int] = []
        self._lock = threading.Lock()

    def _find(self) -> str | None:
        if not self.root.is_dir():
            return f"not reported here: no {self.root} (Linux's powercap RAPL interface: Intel, and AMD Zen)"
        try:
            zones = [RaplZone(p) for p in sorted(self.root.glob("intel-rapl:*")) if p.name.count(":") == 1]
            self.zones = [z for z in zones if z.label.startswith("package")]
            if not self.zones:
                return f"not reported here: no RAPL package domain under {self.root}"
            for z in self.zones:
                z.energy_uj()
        except PermissionError as e:
            return (
                f"not reported here: RAPL's counters are readable by root only on this machine ({e.filename}); "
                "run as root, or give the lab's user read access to energy_uj"
            )
        except (OSError, ValueError) as e:
            return f"not reported here: RAPL under {self.root} did not read ({type(e).__name__}: {e})"
        return None

    def sample(self) -> None:
        """Read every package's counter now and add the difference since the last read (wrap included)."""
        with self._lock:
            for k, z in enumerate(self.zones):
                try:
                    e = z.energy_uj()
                except (OSError, ValueError):  # one failed read: the next one covers its span
                    continue
                delta = e - self._last[k]
                if delta < 0:  # the counter passed max_energy_range_uj and started again from 0
                    delta += z.max_range_uj
                self._total_uj[k] += delta
                self._last[k] = e

    def __enter__(self):
        if not self.available:
            return self
        self._last = [z.energy_uj() for z in self.zones]
        self._total_uj = [0] * len(self.zones)
        self._start()
        return self

    def __exit__(self, *exc):
        if self.available:
            self._end()

    def summary(self, output_tokens: int | None = None) -> dict:
        """``cpu_energy_j`` (every package, J), ``cpu_j_per_output_token``, ``cpu_energy_domains`` (the packages
        read: "intel-rapl:0 (package-0)"), ``telemetry_window_s``; where unavailable only ``cpu_energy_note``,
        why. The whole packages' energy over the window: every process on them, idle cores included."""
        if not self.available:
            return {"cpu_energy_note": self.why}
        energy = sum(self._total_uj) / 1e6
        return {
            "telemetry_window_s": (self.t1 if self.t1 is not None else self.clock()) - self.t0,
            "cpu_energy_j": energy,
            "cpu_j_per_output_token": energy / output_tokens if output_tokens else None,
            "cpu_energy_domains": [f"{z.name} ({z.label})" for z in self.zones],
        }


class RunTelemetry:
    """The machine's own counters over one run: :class:`GpuTelemetry` and :class:`CpuEnergy` together
    (``with RunTelemetry() as t: ...`` then ``t.summary(output_tokens)``: both summaries in one dict).
    ``gpu_source``, ``rapl_root``, ``clock``: their seams (a recorded source, a folder laid out like
    /sys/class/powercap, a clock); ``interval_s`` None: no sampling threads (samples at the ends only)."""

    def __init__(
        self, gpu_source=None, rapl_root=RAPL_ROOT, interval_s: float | None = INTERVAL_S, clock=time.perf_counter
    ):
        self.gpu = GpuTelemetry(interval_s, gpu_source, clock)
        self.cpu = CpuEnergy(rapl_root, RAPL_INTERVAL_S if interval_s else None, clock)

    def __enter__(self):
        self.gpu.__enter__()
        self.cpu.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.cpu.__exit__(*exc)
        finally:
            self.gpu.__exit__(*exc)

    def summary(self, output_tokens: int | None = None) -> dict:
        return {**self.cpu.summary(output_tokens), **self.gpu.summary(output_tokens)}
