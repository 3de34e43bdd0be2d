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
    assert s["cost_per_mtok"] == pytest.approx(3.6 * s["makespan_s"] / 3600 / 15 * 1e6)
    assert f"cost_per_mtok={s['cost_per_mtok']:.4g}" in summary_line("vllm", "closed", None, 3, s)
