"""Metrics of DESIGN.md on synthetic timestamps, with exact expected values."""

import pytest

from lablib.results.store import trace_row
from lablib.results.tables import percentile, run_summary
from lablib.results.trace import RequestTrace


def make(ts, t_submit=10.0, t_start=10.5, prompt=100, cached=0):
    tr = RequestTrace(prompt_tokens=prompt, t_submit=t_submit, cached_tokens=cached)
    tr.start(t_start)
    for i, t in enumerate(ts):
        tr.token(1000 + i, t)
    return tr


def test_four_tokens_exact():
    tr = make([11.5, 11.75, 12.0, 12.5])
    assert tr.queue_s == 0.5
    assert tr.ttft_s == 1.5
    assert tr.prefill_s == 1.0
    assert tr.prefill_tps == 100.0
    assert tr.itl_s == [0.25, 0.25, 0.5]
    assert tr.tpot_s == pytest.approx(1.0 / 3)
    assert tr.decode_tps == pytest.approx(3.0)
    assert tr.e2e_s == 2.5
    assert tr.output_tokens == 4
    assert tr.token_ids == [1000, 1001, 1002, 1003]


def test_one_token_has_no_decode_phase():
    tr = make([11.0])
    assert tr.ttft_s == 1.0 and tr.prefill_s == 0.5 and tr.e2e_s == 1.0
    assert tr.itl_s == []
    assert tr.tpot_s is None and tr.decode_tps is None
    m = tr.metrics()
    assert m["tpot_s"] is None and m["output_tokens"] == 1 and m["decode_s"] == 0.0


def test_two_tokens():
    tr = make([11.0, 11.25])
    assert tr.itl_s == [0.25]
    assert tr.tpot_s == 0.25
    assert tr.decode_tps == 4.0
    assert tr.e2e_s == 1.25


def test_cached_tokens_reduce_prefill_work():
    tr = make([11.0, 11.5], prompt=100, cached=60)
    assert tr.prompt_tokens_evaluated == 40
    assert tr.prefill_tps == 80.0  # 40 tokens in 0.5 s


def test_metrics_need_tokens_and_start():
    tr = RequestTrace(prompt_tokens=5, t_submit=0.0)
    with pytest.raises(ValueError, match="no t_start"):
        _ = tr.queue_s
    tr.start(1.0)
    with pytest.raises(ValueError, match="no generated token"):
        _ = tr.ttft_s


def test_output_tps_over_makespan():
    a = make([11.0, 12.0], t_submit=10.0)  # 2 tokens
    b = make([13.0, 13.5, 14.0], t_submit=11.0)  # 3 tokens, last token at 14.0
    s = run_summary([trace_row(t, {}) for t in (a, b)])  # the one makespan: first submit to last token
    assert s["makespan_s"] == 4.0 and s["output_tps"] == 5 / 4.0


def test_percentile_interpolates_linearly():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
