"""Lab 09's replay panel (lablib.ui.replay) on a real llama-server (2 slots of 512 tokens, 1 thread).

- ``run_sync()`` replays requests 26 .. 30 of the shipped Mooncake slice (their trace times: three at 6.0 s,
  two at 9.0 s) at a time scale of 1/16: one row per request in the results file, the slice's trace
  indices, the status line with the send lag's p99, the figure with a TTFT marker per request;
- the bounds: a value out of them is one message in the status line and nothing is sent (no file); the
  sliders cannot leave theirs; the constructor refuses what the widgets could not show;
- Cancel: requests 26 .. 31 at a time scale of 4 (three at 0 s, three at 12 s): pressed once the first row
  is in, the three in flight finish (no error), the three later ones are never sent, and the run ends
  long before the schedule's 12 s.
"""

import json
import time

import pytest

from lablib.engines.servers import start_server
from lablib.errors import LabError
from lablib.ui.replay import COUNT, LENGTH_SCALE, TIME_SCALE, ReplayPanel, replay_panel


@pytest.fixture(scope="module")
def srv(model):
    s = start_server("llama-server", model, parallel=2, n_ctx=512, threads=1)
    try:
        yield s
    finally:
        s.stop()


def test_run_sync_replays_the_slice_into_the_file_the_status_and_the_figure(srv, model, tmp_path, fsynced, monkeypatch):
    from lablib.results import store

    monkeypatch.setattr(store, "LOAD_SYNC_S", 3600.0)  # an fsync the first row's, then the run's end's
    out = tmp_path / "results" / "replay.jsonl"
    panel = replay_panel(srv, model, start=26, count=5, time_scale=1 / 16, length_scale=1 / 128, out=str(out))
    line = panel.run_sync()
    assert panel.error is None, panel.error
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 5 and sorted(r["trace_index"] for r in rows) == [26, 27, 28, 29, 30]
    assert fsynced(out)[-1:] == [out.stat().st_size] and len(fsynced(out)) == 2  # every row durable at the end
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert {r["time_scale"] for r in rows} == {1 / 16} and {r["block_tokens"] for r in rows} == {4}  # 512 / 128
    assert line == panel.status_text and line.startswith("done: 5 of 5 requests")
    assert "send lag p99" in line and " ms: the client" in line and f"rows in {out}" in line
    assert panel.summary["schedule_lag_p99_s"] is not None and len(panel.df) == 5
    fig = panel.last_figure
    assert fig is not None and fig.layout.title.text.startswith("Trace replay: requests 26 to 30 on llama-server")
    ttft = [t for t in fig.data if t.name.startswith("TTFT of each request")]
    assert len(ttft) == 1 and sorted(c[0] for c in ttft[0].customdata) == [0, 1, 2, 3, 4]  # one per request
    assert panel.figure is not None and panel._figure_box.children == (panel.figure,)  # shown from the first draw


@pytest.mark.parametrize(
    "field, value, expect",
    [
        ("count", COUNT[1] + 1, "requests=41: expected 1 to 40"),
        ("count", 0, "requests=0: expected 1 to 40"),
        ("start", 995, "first request=995: expected a request index from 0 to 990"),
        ("start", -1, "first request=-1"),
        ("block_tokens", 129, "block (tokens)=129: expected 0"),
        ("out", "results/replay.csv", ".jsonl or .parquet"),
    ],
)
def test_a_value_out_of_bounds_is_one_message_and_no_run(model, tmp_path, field, value, expect):
    out = tmp_path / "replay.jsonl"
    panel = ReplayPanel("http://127.0.0.1:9/v1", model, start=0, count=10, out=str(out))  # nothing listens there
    getattr(panel, field).value = value
    assert panel.run_sync() is None
    assert expect in panel.status_text and panel.error == panel.status_text, panel.status_text
    assert "Traceback" not in panel.status.value and "\n" not in panel.status_text
    assert not out.exists() and panel.rows == [] and not panel.run_button.disabled


def test_a_refusal_leaves_the_status_line_when_run_again_with_good_values(model, monkeypatch):
    """requests=50 refused (red), then 3 typed and Run pressed: the red refusal stayed on screen while the model
    and the server got ready, as if 3 were refused too."""
    panel = ReplayPanel("http://127.0.0.1:9/v1", model, start=0, count=10, out="")
    panel.count.value = 50
    assert panel.start_run() is None and "requests=50" in panel.status_text
    seen = []
    monkeypatch.setattr(panel, "_execute", lambda v, raise_errors: seen.append((panel.status_text, panel.error)))
    panel.count.value = 3
    panel.start_run().join(10)
    assert seen == [("starting the run ...", None)] and "#B00020" not in panel.status.value


def test_the_sliders_keep_their_bounds_and_the_constructor_refuses_others(model):
    panel = ReplayPanel("http://127.0.0.1:9/v1", model, out="")
    panel.time_scale.value, panel.length_scale.value = 100.0, 1e-6
    assert panel.time_scale.value == pytest.approx(TIME_SCALE[1])
    assert panel.length_scale.value == pytest.approx(LENGTH_SCALE[0])
    assert "x4: 4 x slower" in panel._time_hint.value and "blocks of 2 tokens" in panel._length_hint.value
    with pytest.raises(LabError, match=r"time scale=0\.01: expected 1/16 to 4"):
        replay_panel("http://127.0.0.1:9/v1", model, time_scale=0.01)
    with pytest.raises(LabError, match=r"length scale=0\.5: expected 1/256 to 1/16"):
        replay_panel("http://127.0.0.1:9/v1", model, length_scale=0.5)
    with pytest.raises(LabError, match="parallel=4 with a running server or URL"):
        replay_panel("http://127.0.0.1:9/v1", model, parallel=4)
    with pytest.raises(LabError):
        replay_panel("no-such-server", model)


def test_cancel_lets_the_requests_in_flight_finish_and_sends_no_other(srv, model, tmp_path):
    out = tmp_path / "replay.jsonl"
    panel = replay_panel(srv, model, start=26, count=6, time_scale=4.0, length_scale=1 / 128, out=str(out))
    thread = panel.start_run()
    assert thread is not None
    deadline = time.monotonic() + 30
    while not panel.rows and time.monotonic() < deadline:
        time.sleep(0.02)
    assert panel.rows, panel.status_text
    t_cancel = time.monotonic()
    panel.cancel()
    panel.wait(30)
    assert not panel.running and time.monotonic() - t_cancel < 6  # the schedule's next send was at 12 s
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["trace_index"] for r in rows) == [26, 27, 28]  # the three sent at 0 s, all finished
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert panel.status_text.startswith("cancelled: 3 of 6 requests done (the rest not sent)"), panel.status_text
    assert panel.error is None and panel.progress.bar_style == "warning" and not panel.run_button.disabled


def test_a_server_named_is_started_for_the_run_and_stopped_after_it(model):
    """Lab 09's cell: the panel starts its own llama-server at Run (none while the notebook goes on)."""
    panel = replay_panel(
        "llama-server",
        model,
        parallel=1,
        n_ctx=512,
        threads=1,
        start=26,
        count=2,
        time_scale=1 / 16,
        length_scale=1 / 128,
        out="",
    )
    assert panel.last_started is None  # building it starts nothing
    line = panel.run_sync()
    assert line.startswith("done: 2 of 2 requests") and "send lag p99" in line, line
    started = panel.last_started
    assert started is not None and started.settings["parallel"] == 1 and started.threads == 1
    assert not started.alive() and started.group_alive() == []
