"""What a run costs, on any device, and the GPU's counters where NVML answers (on this CPU machine: it says
why there are none, and nothing else changes)."""

import pytest

from lablib.errors import LabError
from lablib.machine.telemetry import GpuTelemetry, cost_per_million_tokens, gpu_facts


def test_cost_per_million_tokens_by_hand():
    # 2.50 an hour, 36 s for 1,000 tokens: 2.50 x 0.01 h = 0.025 for 1,000 tokens, 25 per million
    assert cost_per_million_tokens(2.5, 36.0, 1000) == pytest.approx(25.0)
    assert cost_per_million_tokens(None, 36.0, 1000) is None and cost_per_million_tokens(2.5, 36.0, 0) is None
    with pytest.raises(LabError, match="price_per_hour=-1: expected the machine's price for one hour"):
        cost_per_million_tokens(-1, 1.0, 1)


def test_without_nvml_the_run_says_why_and_samples_nothing():
    with GpuTelemetry() as t:
        pass
    if t.available:  # a machine with an NVIDIA GPU: its counters were read
        assert t.summary(10)["gpu_telemetry"][0]["samples"] >= 2
    else:
        assert t.summary(10) == {"gpu_telemetry": t.why} and ("nvidia-ml-py" in t.why or "NVML" in t.why)
        assert gpu_facts()["gpus"] == []


def test_bench_prices_its_run(model, tmp_path):
    """lablib bench --price-per-hour on the scripted fast server: the summary's cost is the price over the run's
    makespan and output tokens, and the summary line says it."""
    from benchmark_modules import load
    from lablib.measure.load import bench
    from lablib.ui.text import summary_line

    with load("fast_server").FastServer(itl_s=0.002) as srv:
        (s,) = bench(
            base_url=srv.base_url,
            out=tmp_path / "r.jsonl",
            requests=3,
            prompt_tokens=8,
            max_new_tokens=5,
            concurrency=3,
            model=model,
            server="vllm",
            warmup=0,
            price_per_hour=3.6,
            log=lambda *_: None,
        )
    assert s["output_tokens"] == 15 and s["price_per_hour"] == 3.6
    if not gpu_facts()["gpus"]:  # without NVML the summary says why, and has no GPU number
        assert isinstance(s["gpu_telemetry"], str) and "gpu_energy_j" not in s
    assert s["cost_per_mtok"] == pytest.approx(3.6 * s["makespan_s"] / 3600 / 15 * 1e6)
    assert f"cost_per_mtok={s['cost_per_mtok']:.4g}" in summary_line("vllm", "closed", None, 3, s)


# --- recorded samples through the sources' seam: the arithmetic, the manifest and the rows, the sweeps ---------
class RecordedGpus:
    """A GPU sample source (lablib.machine.telemetry.NvmlSource's methods) replaying recorded readings:
    ``reads[k]``: GPU k's (memory used bytes, SM clock MHz, power W) in order (the last one repeats),
    ``energies[k]``: its energy counter in mJ, read at the start and at the end (None: no counter)."""

    def __init__(self, reads, energies, names=None):
        self.reads, self.energies = reads, energies
        self.names = names or ["NVIDIA H100 80GB HBM3"] * len(reads)
        self._r = [0] * len(reads)
        self._e = [0] * len(reads)

    def open(self):
        return None

    def count(self):
        return len(self.reads)

    def facts(self):
        gpus = [{"index": i, "name": n, "memory_total_bytes": 80 * 2**30} for i, n in enumerate(self.names)]
        return {"gpus": gpus, "driver": "580.65.06", "cuda_version": "13.0"}

    def read(self, k):
        r = self.reads[k][min(self._r[k], len(self.reads[k]) - 1)]
        self._r[k] += 1
        return r

    def energy_mj(self, k):
        if self.energies[k] is None:
            return None
        e = self.energies[k][min(self._e[k], len(self.energies[k]) - 1)]
        self._e[k] += 1
        return e

    def close(self):
        pass


def ticking(step_s):
    """A clock that moves ``step_s`` seconds at each reading (no real time passes)."""
    import itertools

    return itertools.count(0.0, step_s).__next__


def test_gpu_summary_from_recorded_samples_by_hand():
    gib = 2**30
    src = RecordedGpus(
        reads=[[(10 * gib, 1980, 300.0), (30 * gib, 1755, 650.0), (20 * gib, 1980, 700.0)], [(1 * gib, 1410, 60.0)]],
        energies=[[5_000_000, 5_420_000], [900_000, 930_000]],  # mJ: 420 J and 30 J
    )
    with GpuTelemetry(interval_s=None, source=src, clock=ticking(1.0)) as t:
        t.sample()
    s = t.summary(output_tokens=900)
    # clock readings: t0 0; three samples of two GPUs at 1..6; t1 7
    assert s["telemetry_window_s"] == 7.0
    assert [g["samples"] for g in s["gpu_telemetry"]] == [3, 3]
    assert s["gpu_telemetry"][0]["memory_used_start_bytes"] == 10 * gib
    assert s["gpu_telemetry"][0]["memory_used_peak_bytes"] == 30 * gib
    assert s["gpu_memory_used_peak_bytes"] == 31 * gib  # the GPUs' peaks added
    assert s["gpu_telemetry"][0]["power_w_p50"] == 650.0 and s["gpu_telemetry"][0]["power_w_max"] == 700.0
    assert s["gpu_power_w_p50"] == 650.0 + 60.0  # the GPUs' medians added
    assert s["gpu_sm_clock_mhz_p50"] == (1410 + 1755) / 2  # over 1410 x 3, 1755, 1980 x 2
    assert s["gpu_telemetry"][0]["energy_j"] == pytest.approx(420.0)
    assert s["gpu_energy_j"] == pytest.approx(450.0) and s["gpu_j_per_output_token"] == pytest.approx(0.5)
    assert s["gpu_energy_note"] is None


def test_gpu_energy_needs_a_window_of_five_seconds_and_a_counter():
    short = RecordedGpus(reads=[[(1, 1000, 100.0)]], energies=[[0, 400_000]])
    with GpuTelemetry(interval_s=None, source=short, clock=ticking(1.0)) as t:  # t0 0, samples 1, 2, t1 3
        pass
    s = t.summary(100)
    assert s["telemetry_window_s"] == 3.0 and s["gpu_energy_j"] is None and s["gpu_j_per_output_token"] is None
    assert s["gpu_energy_note"] == "window 3.0 s is under 5 s: the energy counter updates about every 100 ms"
    assert s["gpu_telemetry"][0]["power_w_p50"] == 100.0  # the rest is still there
    old = RecordedGpus(reads=[[(1, 1000, 100.0)]], energies=[None])
    with GpuTelemetry(interval_s=None, source=old, clock=ticking(10.0)) as t:
        pass
    s = t.summary(100)
    assert s["gpu_energy_j"] is None and "no energy counter on this GPU" in s["gpu_energy_note"]


def test_the_gpu_facts_go_into_the_manifest_and_the_rows():
    from lablib.machine.telemetry import gpu_manifest
    from lablib.results.schema import GPU_MANIFEST_FIELDS, KNOWN, flatten_manifest
    from lablib.results.store import trace_row
    from lablib.results.trace import RequestTrace

    facts = gpu_facts(RecordedGpus(reads=[[], []], energies=[None, None], names=["NVIDIA H100 80GB HBM3"] * 2))
    assert facts["driver"] == "580.65.06" and facts["cuda_version"] == "13.0" and len(facts["gpus"]) == 2
    gpu = gpu_manifest(facts)
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["count"] == 2
    assert gpu["memory_total_bytes"] == 160 * 2**30
    trace = RequestTrace(t_submit=0.0, t_start=0.0, t_tokens=[0.5, 0.6], token_ids=[1, 2], prompt_tokens=4)
    row = trace_row(trace, {"hardware": {"cpu_model": "x", "gpu": gpu}})
    assert {k: row[k] for k in GPU_MANIFEST_FIELDS} == {
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_count": 2,
        "gpu_memory_total_bytes": 160 * 2**30,
        "gpu_driver": "580.65.06",
        "cuda_version": "13.0",
    }
    assert set(GPU_MANIFEST_FIELDS) <= KNOWN
    # no GPU record: no GPU column at all
    assert not set(GPU_MANIFEST_FIELDS) & set(flatten_manifest({"hardware": {"cpu_model": "x"}}))
    assert gpu_manifest({"gpus": [], "why": "no driver"}) is None


def test_this_machine_without_nvml_invents_no_gpu_column_and_doctor_says_why():
    """The absent path for real (a CPU machine: NVML not found, no /sys/class/powercap); on a GPU machine, what
    its NVML says."""
    from lablib.machine.telemetry import CpuEnergy, doctor_lines, gpu_manifest
    from lablib.results.schema import GPU_MANIFEST_FIELDS
    from lablib.results.store import run_manifest, trace_row
    from lablib.results.trace import RequestTrace

    facts = gpu_facts()
    gpu_line, cpu_line = doctor_lines(facts)
    row = trace_row(
        RequestTrace(t_submit=0.0, t_start=0.0, t_tokens=[0.5], token_ids=[1], prompt_tokens=4),
        run_manifest({"name": "llama.cpp"}, {"id": "m"}),
    )
    if facts["gpus"]:
        assert gpu_manifest() is not None and row["gpu_driver"] == facts["driver"]
        assert f"driver {facts['driver']}, CUDA {facts['cuda_version']}" in gpu_line
    else:
        assert gpu_manifest() is None and not set(GPU_MANIFEST_FIELDS) & set(row)
        assert gpu_line == f"GPU: none through NVML: {facts['why']}"
        assert "NVML" in facts["why"] or "nvidia-ml-py" in facts["why"]
    if not CpuEnergy().available:
        assert cpu_line.startswith("CPU energy: not reported here")


def _rapl(root, zone, label, energy_uj, max_uj=262143328850):
    z = root / zone
    z.mkdir(parents=True, exist_ok=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_rapl_package_energy_with_a_wrap_around(tmp_path):
    """A folder laid out like /sys/class/powercap: two packages (one wraps at its max_energy_range_uj between two
    reads), a core subdomain and psys (both left out: they overlap the packages)."""
    from lablib.machine.telemetry import CpuEnergy

    root = tmp_path / "powercap"
    p0 = _rapl(root, "intel-rapl:0", "package-0", 4_294_000_000, max_uj=4_294_967_295)
    p1 = _rapl(root, "intel-rapl:1", "package-1", 1_000_000)
    _rapl(root, "intel-rapl:0:0", "core", 5)
    _rapl(root, "intel-rapl:2", "psys", 5)
    e = CpuEnergy(root, interval_s=None, clock=ticking(3.0))
    assert e.available and [z.label for z in e.zones] == ["package-0", "package-1"]
    with e:
        (p0 / "energy_uj").write_text("700000\n")  # wrapped: 967,295 µJ to the top, then 700,000
        (p1 / "energy_uj").write_text("21000000\n")
        e.sample()
        (p0 / "energy_uj").write_text("1700000\n")
    s = e.summary(output_tokens=100)
    assert s["cpu_energy_j"] == pytest.approx((967_295 + 700_000 + 1_000_000 + 20_000_000) / 1e6)
    assert s["cpu_j_per_output_token"] == pytest.approx(s["cpu_energy_j"] / 100)
    assert s["cpu_energy_domains"] == ["intel-rapl:0 (package-0)", "intel-rapl:1 (package-1)"]
    assert s["telemetry_window_s"] == 3.0


def test_rapl_absent_or_unreadable_says_why(tmp_path):
    import os

    from lablib.machine.telemetry import CpuEnergy

    e = CpuEnergy(tmp_path / "none")
    with e:
        pass
    assert e.summary(10) == {
        "cpu_energy_note": f"not reported here: no {tmp_path / 'none'} "
        "(Linux's powercap RAPL interface: Intel, and AMD Zen)"
    }
    z = _rapl(tmp_path / "pc", "intel-rapl:0", "package-0", 1)
    (z / "energy_uj").chmod(0)
    if os.geteuid() != 0:  # root reads it anyway
        e = CpuEnergy(tmp_path / "pc")
        assert not e.available and "readable by root only" in e.why


def test_a_sweep_records_each_points_counters(model, tmp_path):
    """A concurrency sweep on llama.cpp with recorded GPU samples and a RAPL folder given through the sweep's
    telemetry seam: one record per point in <out>.runs.jsonl and df.attrs, its run_id its rows'; energy per
    output token from the recorded counters; the rows themselves get no GPU column on a machine without one."""
    import json

    from lablib.machine.telemetry import RunTelemetry
    from lablib.measure import sweep
    from lablib.results.store import runs_path

    rapl = tmp_path / "powercap"
    _rapl(rapl, "intel-rapl:0", "package-0", 1_000_000)

    def telemetry():
        src = RecordedGpus(reads=[[(2**30, 1500, 200.0)]], energies=[[0, 600_000]])  # 600 J
        return RunTelemetry(gpu_source=src, rapl_root=rapl, interval_s=None, clock=ticking(2.0))

    out = tmp_path / "c.jsonl"
    seen, ended = [], []  # rows so far, and each point's record with the rows there were when it was handed over
    df = sweep.concurrency_sweep(
        model,
        engines=["llama.cpp"],
        concurrency=[1, 2],
        modes="serial",
        requests=2,
        prompt_tokens=8,
        max_new_tokens=3,
        warmup=0,
        out=out,
        progress=False,
        price_per_hour=3.6,
        telemetry=telemetry,
        on_row=seen.append,
        on_point=lambda rec: ended.append((rec, len(seen))),
    )
    recs = [json.loads(line) for line in runs_path(out).read_text().splitlines()]
    frame = json.loads(json.dumps(df.attrs["runs"]))
    assert recs == [dict(r, out=str(out)) for r in frame]  # the same records, on disk and in the frame
    # on_point: each run's record once, as it ended: after its own rows, before the next run's first
    assert [(rec["run_id"], n) for rec, n in ended] == [(r["run_id"], 2 * (i + 1)) for i, r in enumerate(frame)]
    assert [(r["engine"], r["sweep"], r["mode"], r["concurrency"]) for r in recs] == [
        ("llama.cpp", "concurrency", "serial", 1),
        ("llama.cpp", "concurrency", "serial", 2),
    ]
    for r in recs:
        assert r["run_id"] in set(df["run_id"]) and r["output_tokens"] == 6
        assert r["gpu_energy_j"] == pytest.approx(600.0) and r["gpu_j_per_output_token"] == pytest.approx(100.0)
        assert r["cpu_energy_j"] == 0.0 and r["cpu_energy_domains"] == ["intel-rapl:0 (package-0)"]
        assert r["cost_per_mtok"] == pytest.approx(3.6 * r["makespan_s"] / 3600 / 6 * 1e6)
    if not gpu_facts()["gpus"]:
        assert "gpu_name" not in df.columns
    # a context sweep: one point per length, warm-up outside it; its rows carry the point's run_id
    ctx = sweep.context_sweep(
        model,
        engines=["llama.cpp"],
        prompt_tokens=[8],
        max_new_tokens=2,
        reps=2,
        warmup=1,
        out=tmp_path / "x.jsonl",
        progress=False,
        telemetry=telemetry,
    )
    (rec,) = ctx.attrs["runs"]
    assert (rec["sweep"], rec["prompt_tokens"], rec["requests"], rec["output_tokens"]) == ("context", 8, 2, 4)
    assert list(ctx["run_id"]) == [rec["run_id"]] * 2 and rec["gpu_j_per_output_token"] == pytest.approx(150.0)
    assert "cost_per_mtok" not in rec  # no price given
    # side by side: one point per engine
    sbs = sweep.side_by_side(
        model, engines=["llama.cpp"], max_new_tokens=2, reps=2, progress=False, telemetry=telemetry
    )
    (rec,) = sbs.attrs["runs"]
    assert (rec["engine"], rec["sweep"], rec["output_tokens"]) == ("llama.cpp", "side_by_side", 4)
    assert list(sbs["run_id"]) == [rec["run_id"]] * 2 and list(sbs["repetition"]) == [0, 1]
