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


def test_tokens_at_one_instant_have_no_tpot_and_the_run_counts_them():
    """A stream that came whole (every token in one network read: a proxy that buffers, or a client that read it
    late) stamps every token at one instant: its TPOT was 0, read as an instant decode, and it pulled the run's
    TPOT p50 down. The decode is inside its TTFT: no TPOT, and the run summary counts such requests."""
    whole = make([12.0, 12.0, 12.0, 12.0])  # 4 tokens, one instant
    assert whole.ttft_s == whole.e2e_s == 2.0 and whole.itl_s == [0.0, 0.0, 0.0]
    assert whole.tpot_s is None and whole.decode_tps is None and whole.decode_unseen
    assert whole.metrics()["decode_unseen"] is True and make([11.0, 11.5]).metrics()["decode_unseen"] is False
    streamed = make([11.0, 11.5, 12.0])  # TPOT 0.5 s
    one = make([11.0])  # one token: no decode phase, not an unseen one
    assert not streamed.decode_unseen and not one.decode_unseen
    s = run_summary([trace_row(t, {}) for t in (whole, streamed, one)])
    assert s["decode_unseen_requests"] == 1 and s["tpot_p50_s"] == 0.5  # before: 0.25, the median of 0 and 0.5


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_older_files_read_a_tpot_of_0_as_a_decode_not_seen(tmp_path, suffix):
    """Rows written before the decode_unseen column gave a stream that came whole a TPOT of 0; read back, they
    pulled an old file's TPOT p50 down as new rows no longer do. Read now as new rows are written (a TPOT of 0 over
    2 or more tokens is exactly every token at one instant); a failed row, a one-token row and a streamed row keep
    their values, and a file with the column is read as written."""
    import math

    import pandas as pd

    from lablib.results.store import load_results

    whole, streamed, one = make([12.0, 12.0, 12.0, 12.0]), make([11.0, 11.5, 12.0]), make([11.0])
    rows = [trace_row(t, {"engine": "http"}) for t in (whole, streamed, one)]
    rows.append({"engine": "http", "error": "the server failed the request", "output_tokens": 0})
    old = [dict(r, tpot_s=0.0) if r.get("decode_unseen") else dict(r) for r in rows]
    for r in old:
        r.pop("decode_unseen", None)
    assert old[0]["tpot_s"] == 0.0  # as the older code wrote it
    path = tmp_path / f"old{suffix}"
    (
        pd.DataFrame(old).to_parquet(path)
        if suffix == ".parquet"
        else pd.DataFrame(old).to_json(path, orient="records", lines=True)
    )
    df = load_results(path)
    assert df["decode_unseen"].tolist() == [True, False, False, False]
    assert math.isnan(df["tpot_s"][0]) and df["tpot_s"][1] == 0.5 and math.isnan(df["tpot_s"][2])
    s = run_summary(df.to_dict("records"))
    assert s["decode_unseen_requests"] == 1 and s["tpot_p50_s"] == 0.5  # before: 0.25, the median of 0 and 0.5
    new = tmp_path / f"new{suffix}"
    (
        pd.DataFrame(rows).to_parquet(new)
        if suffix == ".parquet"
        else pd.DataFrame(rows).to_json(new, orient="records", lines=True)
    )
    assert load_results(new)["decode_unseen"].tolist()[:3] == [True, False, False]


def test_requests_whose_first_token_came_with_others_are_counted_and_said_when_most():
    """A first token that arrived with others (an HTTP row's first_arrival_tokens above 1, not all of them): its
    TTFT holds their decode and its TPOT is low. The run counts such requests; the note says it when they are most
    of the run (one or two happen on a busy machine), and says nothing of a run read token by token."""
    from lablib.ui.text import stream_note, summary_line

    def row(first, n=8):
        return {
            "ttft_s": 0.1,
            "e2e_s": 0.2,
            "tpot_s": 0.01,
            "output_tokens": n,
            "first_arrival_tokens": first,
            "t_submit": 0.0,
            "t_last_token": 0.2,
            "error": None,
        }

    bunched = run_summary([row(4), row(3), row(1)])
    assert bunched["first_bunched_requests"] == 2 and bunched["decode_unseen_requests"] == 0
    assert "2 of 3 requests got their first token together with others" in stream_note(bunched)
    assert " first_bunched_requests=2" in summary_line("llama-server", "closed", None, 1, bunched)
    few = run_summary([row(4), row(1), row(1)])  # one of three: a busy machine's read, not said
    assert few["first_bunched_requests"] == 1 and stream_note(few) is None
    plain = run_summary([row(1), row(1), row(8)])  # 8 of 8 at once is decode_unseen's (no TPOT), not this
    assert plain["first_bunched_requests"] == 0
