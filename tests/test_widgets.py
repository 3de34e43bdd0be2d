"""The sweep panel: defaults, input errors shown in the panel, Run in a thread, Cancel, run_sync.

Most tests replace lablib.measure.sweep's sweep functions with fakes that emit synthetic rows; one
runs a real tiny llama.cpp sweep through run_sync."""

import threading
import time

import pandas as pd
import pytest

from lablib import plots
from lablib.errors import LabError
from lablib.measure import sweep
from lablib.ui import widgets
from test_plots import concurrency_df, context_df


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setenv("LABLIB_QUICK", "1")


def checked(boxes):
    return [name for name, box in boxes.items() if box.value]


def test_panel_builds_with_quick_defaults(quick):
    p = widgets.sweep_panel()
    assert p.kind.value == "context"
    assert checked(p.engine_boxes) == ["transformers", "llama.cpp", "mlx"]
    assert p.prompt_tokens.value == "64,256"
    assert p.max_new_tokens.value == 8 and p.reps.value == 1
    assert p.out.value.startswith("results/context-") and p.out.value.endswith(".jsonl")
    assert p.reps.layout.display == "flex" and p.concurrency.layout.display == "none"
    assert p.prompt_tokens.layout.display != "none"
    assert p.cancel_button.disabled and not p.run_button.disabled
    plan = p.plan()
    assert plan["total"] == 3 * 2 * 1
    assert plan["kwargs"]["prompt_tokens"] == [64, 256] and plan["kwargs"]["max_new_tokens"] == 8
    bundle = p._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_concurrency_kind_defaults_and_visibility(quick, monkeypatch):
    p = widgets.sweep_panel(kind="concurrency", out="")
    assert p.concurrency.value == "1,4" and p.requests.value == 0 and p.max_new_tokens.value == 16
    assert checked(p.mode_boxes) == ["serial", "batched"]
    assert p.concurrency.layout.display == "flex" and p.reps.layout.display == "none"
    assert p._requests_row.layout.display == "flex" and p.prompt_tokens.layout.display != "none"
    assert p.out.value == ""
    monkeypatch.setattr(sweep, "concurrency_sweep", lambda **kw: None, raising=False)
    plan = p.plan()
    assert plan["kwargs"]["concurrency"] == (1, 4) and plan["kwargs"]["modes"] == ("serial", "batched")
    assert plan["kwargs"]["prompt_tokens"] == 16 and plan["kwargs"]["out"] is None
    assert plan["kwargs"]["requests"] is None  # the sweep's default: 2 x concurrency
    assert plan["total"] == 3 * 2 * (2 + 8)
    p.requests.value = 5
    assert p.plan()["kwargs"]["requests"] == 5 and p.plan()["total"] == 3 * 2 * 2 * 5
    # switching kind fills the other kind's defaults
    p.kind.value = "context"
    assert p.prompt_tokens.value == "64,256" and p.reps.layout.display == "flex"


def test_full_mode_defaults_are_larger(monkeypatch):
    monkeypatch.delenv("LABLIB_QUICK", raising=False)
    d = widgets.defaults("context")
    assert d["max_new_tokens"] == 32 and d["reps"] == 3 and d["prompt_tokens"].startswith("64,128")
    with pytest.raises(LabError, match="sweep kind"):
        widgets.defaults("latency")


@pytest.mark.parametrize(
    "field,value,expect",
    [
        ("prompt_tokens", "", "prompt tokens is empty"),
        ("prompt_tokens", "64,abc", "expected whole numbers"),
        ("prompt_tokens", "0,64", "at least 1"),
        ("out", "results/x.csv", "expected a name ending in .jsonl or .parquet"),
    ],
)
def test_invalid_input_shows_the_lab_error_in_the_panel(quick, monkeypatch, field, value, expect):
    called = []
    monkeypatch.setattr(sweep, "context_sweep", lambda **kw: called.append(kw))
    p = widgets.sweep_panel()
    getattr(p, field).value = value
    p.run_button.click()
    assert p._thread is None and not called
    assert expect in p.message.value and "Traceback" not in p.message.value
    assert "#B00020" in p.message.value  # shown as an error
    assert expect in p.error
    assert p.run_sync() is None and not called


def test_no_engine_and_no_mode_are_errors(quick, monkeypatch):
    p = widgets.sweep_panel()
    for box in p.engine_boxes.values():
        box.value = False
    p.run_button.click()
    assert "no engine given" in p.message.value
    monkeypatch.setattr(sweep, "concurrency_sweep", lambda **kw: None, raising=False)
    p = widgets.sweep_panel(kind="concurrency")
    for box in p.mode_boxes.values():
        box.value = False
    p.run_button.click()
    assert "no mode chosen" in p.message.value
    p = widgets.sweep_panel(kind="concurrency")
    p.prompt_tokens.value = "64,128"
    p.run_button.click()
    assert "one prompt length" in p.message.value


def test_fewer_requests_than_clients_is_refused_by_the_panel(quick):
    p = widgets.sweep_panel(kind="concurrency")
    p.concurrency.value, p.requests.value = "1,4", 2
    p.run_button.click()
    assert "requests=2 with concurrency up to 4" in p.message.value and p._thread is None


def fake_context_sweep(rows, started=None, delay=0.0):
    def fake(
        model=None,
        engines=(),
        prompt_tokens=None,
        max_new_tokens=None,
        reps=None,
        warmup=1,
        out=None,
        cancel=None,
        on_row=None,
        progress=True,
        on_point=None,
    ):
        done = []
        for i, row in enumerate(rows):
            if started is not None:
                started.set()
            if cancel is not None and cancel.is_set():
                break
            time.sleep(delay)
            done.append(row)
            on_row(row)
            point = (row["engine"], row["prompt_tokens"])
            if on_point and (i + 1 == len(rows) or (rows[i + 1]["engine"], rows[i + 1]["prompt_tokens"]) != point):
                on_point({})
        return pd.DataFrame(done)

    return fake


def test_run_in_a_thread_updates_progress_and_the_figure(quick, monkeypatch):
    rows = context_df(engines=("llama.cpp", "mlx"), lengths=(64, 256), reps=1).to_dict("records")
    monkeypatch.setattr(sweep, "context_sweep", fake_context_sweep(rows))
    p = widgets.sweep_panel(out="")
    p.engine_boxes["transformers"].value = False
    thread = p.start()
    assert isinstance(thread, threading.Thread)
    p.wait(30)
    assert not p.running
    assert p.progress.value == p.progress.max == 4 and p.progress.description == "4/4"
    assert "done: 4 requests" in p.message.value
    assert len(p.df) == 4 and p.error is None
    # the FigureWidget holds the context bars of the rows
    expect = plots.context_bars(pd.DataFrame(rows))
    names = [t.name for t in p.figure.data]
    assert names == [t.name for t in expect.data]
    for got, want in zip(p.figure.data, expect.data):
        assert list(got.y) == list(want.y)
    assert p.figure.layout.xaxis.title.text == "prompt length (tokens)"
    assert p.cancel_button.disabled and not p.run_button.disabled


def test_cancel_sets_the_event_and_stops_between_requests(quick, monkeypatch):
    rows = context_df(reps=5).to_dict("records")
    started = threading.Event()
    monkeypatch.setattr(sweep, "context_sweep", fake_context_sweep(rows, started, delay=0.05))
    p = widgets.sweep_panel(out="")
    p.reps.value = 5
    p.start()
    assert started.wait(10)
    assert not p.cancel_button.disabled
    p.cancel_button.click()
    assert p.cancel_event.is_set()
    p.wait(30)
    assert 0 < len(p.rows) < len(rows)
    assert "cancelled after" in p.message.value and p.progress.bar_style == "warning"


def until(ok, timeout_s: float = 30.0) -> None:
    """Wait (polling) until ``ok()`` holds; fail after ``timeout_s`` (a loaded machine schedules threads late)."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, "still not so after 30 s"
        time.sleep(0.01)


def overlap_counting_sweep(rows, delay):
    """A fake context sweep that counts how many of its calls run at once (``calls["most"]``)."""
    calls = {"now": 0, "most": 0, "runs": 0}
    lock = threading.Lock()
    inner = fake_context_sweep(rows, delay=delay)

    def fake(**kw):
        with lock:
            calls["now"] += 1
            calls["runs"] += 1
            calls["most"] = max(calls["most"], calls["now"])
        try:
            return inner(**kw)
        finally:
            with lock:
                calls["now"] -= 1

    return fake, calls


def test_a_panel_made_again_waits_for_the_earlier_panels_run(quick, monkeypatch):
    """A learner runs the panel's cell again while its sweep goes on (the old panel keeps running, out of sight)
    and presses Run on the new one: it waits for the old run, saying so, instead of a second sweep at once
    (which shared the two cores and skewed both without a word); its Cancel stops both."""
    rows = context_df(reps=4).to_dict("records")
    fake, calls = overlap_counting_sweep(rows, delay=0.1)
    monkeypatch.setattr(sweep, "context_sweep", fake)
    old = widgets.sweep_panel(out="")
    old.reps.value = 4
    old.start()
    new = widgets.sweep_panel(out="")
    new.reps.value = 4
    assert new.start() is not None
    until(lambda: "waiting for the run already going on to end" in new.message.value)
    assert new.run_button.disabled and not new.cancel_button.disabled
    new.wait(30)
    old.wait(30)
    assert calls == {"now": 0, "most": 1, "runs": 2}
    assert len(old.rows) == len(new.rows) == len(rows) and "done:" in new.message.value

    # Cancel on the waiting panel stops the run it waits for, and its own never starts
    fake, calls = overlap_counting_sweep(rows, delay=0.2)
    monkeypatch.setattr(sweep, "context_sweep", fake)
    old.start()
    new.start()
    until(lambda: old.rows and "waiting for the run" in new.message.value)
    new.cancel_button.click()
    new.wait(30)
    old.wait(30)
    assert calls["runs"] == 1 and 0 < len(old.rows) < len(rows), calls
    assert "cancelled after" in old.message.value
    assert new.message.value.count("cancelled: the run going on was stopped") == 1
    assert not new.run_button.disabled and new.cancel_button.disabled


def test_a_run_waits_for_the_runs_going_on_when_asked_not_their_panels_next_ones(quick, monkeypatch):
    """Three panels (lab 03's two sweep panels and one made again): A runs, Q's Run waits for A, B's for A and Q.
    A ends, Q runs, and Run is pressed on A again: its new run waits for Q and B. B waited for the panels A and
    Q, not for the runs going on when it was asked, so it then waited for A's new run too: A and B each waiting for
    the other, 'waiting for the run already going on' for ever once Q ended. Now a run waits for the runs going
    on when it was asked for: B runs after Q, A's new run after B, one at a time."""
    rows = context_df(reps=1).to_dict("records")
    inner = fake_context_sweep(rows)
    gates = [threading.Event(), threading.Event()]  # the first two sweeps (A's, Q's) end when let go
    calls = {"now": 0, "most": 0, "order": []}
    lock = threading.Lock()

    def fake(**kw):
        with lock:
            calls["now"] += 1
            calls["most"] = max(calls["most"], calls["now"])
            n = len(calls["order"])
            calls["order"].append(threading.current_thread())
        try:
            if n < len(gates):
                assert gates[n].wait(30)
            return inner(**kw)
        finally:
            with lock:
                calls["now"] -= 1

    monkeypatch.setattr(sweep, "context_sweep", fake)
    a, q, b = (widgets.sweep_panel(out="") for _ in range(3))
    for p in (a, q, b):
        p.reps.value = 1
    try:
        a_first = a.start()
        until(lambda: len(calls["order"]) == 1)
        q.start()
        until(lambda: "waiting for the run" in q.message.value)
        b.start()
        until(lambda: "waiting for the run" in b.message.value)
        gates[0].set()  # A ends, Q runs
        until(lambda: len(calls["order"]) == 2 and not a.running)
        a.start()  # A again: waits for Q and B
        until(lambda: "waiting for the run" in a.message.value)
        gates[1].set()  # Q ends: B runs, then A
        until(lambda: not a.running and not b.running)
    finally:
        for g in gates:
            g.set()
        for p in (a, q, b):
            p.cancel()
            p.wait(30)
    assert calls["most"] == 1 and calls["order"][0] is a_first and len(calls["order"]) == 4
    assert calls["order"][2] is b._thread and calls["order"][3] is a._thread
    assert all("done:" in p.message.value for p in (a, q, b))


def test_run_sync_waits_for_the_run_going_on(quick, monkeypatch):
    """Run pressed, then the lab's next cell (``panel.run_sync()``) run meanwhile: it waits for the Run's sweep
    (before, both ran at once on the same panel: rows of both mixed in one list, "done: 12 requests" of 6)."""
    rows = context_df(reps=3).to_dict("records")
    fake, calls = overlap_counting_sweep(rows, delay=0.1)
    monkeypatch.setattr(sweep, "context_sweep", fake)
    p = widgets.sweep_panel(out="")
    p.reps.value = 3
    p.start()
    df = p.run_sync()
    assert calls == {"now": 0, "most": 1, "runs": 2}
    assert len(df) == len(p.rows) == len(rows) and f"done: {len(rows)} requests" in p.message.value


def test_cancel_before_the_first_row_names_no_results_file(quick, monkeypatch, tmp_path):
    """Cancel pressed while the model loads: the panel said "cancelled after 0 of 18 requests; rows in
    results/x.jsonl", of a file that was never written."""
    out = tmp_path / "x.jsonl"
    monkeypatch.setattr(sweep, "context_sweep", fake_context_sweep(context_df().to_dict("records")))
    p = widgets.sweep_panel(out=str(out))
    p._plan_or_message = lambda plan=p.plan(): (p.cancel_event.set(), plan)[1]  # Cancel before the first row
    p.start()
    p.wait(30)
    assert "cancelled after 0 of" in p.message.value and "rows in" not in p.message.value and not out.exists()


def test_live_concurrency_figure(quick, monkeypatch):
    rows = concurrency_df(levels=(1, 2), requests=2).to_dict("records")

    def fake(
        model=None,
        engines=(),
        concurrency=(1, 2),
        modes=("serial", "batched"),
        requests=None,
        prompt_tokens=None,
        max_new_tokens=None,
        out=None,
        cancel=None,
        on_row=None,
        progress=True,
        on_point=None,
    ):
        for row in rows:
            on_row(row)
        return pd.DataFrame(rows)

    monkeypatch.setattr(sweep, "concurrency_sweep", fake, raising=False)
    p = widgets.sweep_panel(kind="concurrency", out="")
    df = p.run_sync()
    assert len(df) == len(rows)
    assert {t.name for t in p.figure.data} == {
        f"{e} · {m}" for e in ("llama.cpp", "mlx") for m in ("serial", "batched")
    }
    assert "concurrency" in p.figure.layout.xaxis.title.text


def test_the_live_figure_is_drawn_only_while_no_request_is_measured(quick, tmp_path, monkeypatch):
    """A real llama.cpp sweep through the panel, its figure redrawn as often as it may be: every draw made while
    the sweep ran falls between two of its points, in the sweep's own thread, outside every measured request's
    span (submit to last token). Drawn in a thread of its own, a draw overlapped the request in flight, which on
    two cores took up to 4 times its prefill (benchmarks/panel_redraw.py); drawn in the row callback, it held up a
    closed loop's next wave."""
    from lablib.results.trace import now

    p = widgets.sweep_panel(out=str(tmp_path / "ctx.jsonl"))
    for name, box in p.engine_boxes.items():
        box.value = name == "llama.cpp"
    p.prompt_tokens.value, p.max_new_tokens.value, p.reps.value = "16,24,32", 2, 2
    p.draw_every_s = 0.0
    spans, draw = [], p._draw

    def recording(df, final=False):
        t0 = now()
        try:
            return draw(df, final=final)
        finally:
            spans.append((t0, now(), threading.current_thread().name, final))

    monkeypatch.setattr(p, "_draw", recording)
    df = p.run_sync()
    assert p.error is None and len(df) == 6, p.message.value
    during = [s for s in spans if not s[3]]
    # one draw as each of the three lengths ended, then the final figure after the sweep
    assert len(during) == 3 and p._redrawer.draws == 3, spans
    assert {name for *_, name, _ in during} == {threading.current_thread().name}
    for t0, t1, *_ in during:
        for r in df.itertuples():
            assert t1 <= r.t_submit or t0 >= r.t_last_token, (t0, t1, r.t_submit, r.t_last_token)
    assert spans[-1][3] and spans[-1][0] >= df.t_last_token.max()  # the final figure, after the last request
    assert not any(t.name == "lablib-sweep-redraw" for t in threading.enumerate())  # no drawing thread at all


def test_redrawer_draws_at_most_every_interval_and_never_when_told(monkeypatch):
    from lablib.ui.background import Redrawer

    calls = []
    r = Redrawer(lambda: calls.append(threading.current_thread().name), every_s=float("inf"))
    r.stale()
    r.close()
    assert calls == []  # math.inf: the panel draws once, at the end, itself
    r = Redrawer(lambda: calls.append(threading.current_thread().name), every_s=60.0, name="t-redraw")
    for _ in range(20):
        r.stale()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    r.stale()
    r.close()
    assert calls == ["t-redraw"] and r.draws == 1  # twenty marks, one draw within the minute
    # at rest (a sweep's): no thread; a draw only in rest(), in the caller's thread, when stale and due
    calls.clear()
    r = Redrawer(lambda: calls.append(threading.current_thread().name), every_s=60.0, at_rest=True)
    r.rest()
    assert calls == []  # nothing marked stale: nothing to draw
    r.stale()
    time.sleep(0.1)
    assert calls == []  # marked, but nothing draws it until the sweep is at rest
    r.rest({"run_id": "x"})
    r.stale()
    r.rest()
    r.close()
    r.rest()
    assert calls == [threading.current_thread().name] and r.draws == 1  # the second within the minute: not drawn


def test_engine_errors_are_shown_then_raised_in_run_sync(quick, monkeypatch):
    def boom(**kw):
        raise RuntimeError("engine crashed")

    monkeypatch.setattr(sweep, "context_sweep", boom)
    p = widgets.sweep_panel(out="")
    with pytest.raises(RuntimeError):
        p.run_sync()
    assert "RuntimeError: engine crashed" in p.message.value and "<details>" in p.message.value
    # in the background thread the same error is shown, not raised
    p.start()
    p.wait(10)
    assert "engine crashed" in p.message.value and p.progress.bar_style == "danger"


def test_without_anywidget_the_figure_goes_to_an_output(quick, monkeypatch):
    import ipywidgets

    monkeypatch.setattr(widgets, "_figure_widget", lambda: None)
    rows = context_df(reps=1).to_dict("records")
    monkeypatch.setattr(sweep, "context_sweep", fake_context_sweep(rows))
    p = widgets.sweep_panel(out="")
    assert isinstance(p.figure, ipywidgets.Output)
    p.run_sync()
    assert len(p.figure.outputs) == 1 and p.last_figure is not None


@pytest.mark.engine
def test_real_tiny_llama_cpp_sweep_through_run_sync(quick, tmp_path):
    p = widgets.sweep_panel(out=str(tmp_path / "ctx.jsonl"))
    for name, box in p.engine_boxes.items():
        box.value = name == "llama.cpp"
    p.prompt_tokens.value = "32"
    p.max_new_tokens.value = 2
    p.reps.value = 1
    df = p.run_sync()
    assert p.error is None, p.message.value
    assert len(df) == 1 and df.engine.iloc[0] == "llama.cpp" and df.prompt_tokens.iloc[0] == 32
    assert df.output_tokens.iloc[0] == 2
    # the context bars: each phase as a share of the engine's time (top) and in seconds (below)
    share, pre, _, dec = p.figure.data
    assert share.name == "llama.cpp · prefill" and list(share.x) == ["32"]
    assert (pre.name, dec.name) == ("llama.cpp · prefill (s)", "llama.cpp · decode (s)")
    assert pre.y[0] == pytest.approx(df.prefill_s.iloc[0]) and dec.y[0] == pytest.approx(df.decode_s.iloc[0])
    assert share.y[0] == pytest.approx(df.prefill_s.iloc[0] / (df.prefill_s.iloc[0] + df.decode_s.iloc[0]))
    assert p.progress.value == 1 and "done: 1 requests" in p.message.value
    from lablib.results.store import load_results

    assert len(load_results(tmp_path / "ctx.jsonl")) == 1


def test_concurrency_total_counts_the_modes_each_engine_has(quick):
    """onnxruntime-genai runs serial only: the panel counts its requests once, and refuses batched
    alone for it in the panel (the sweep would have no mode to run it in)."""
    p = widgets.sweep_panel(kind="concurrency", out="")
    for name, box in p.engine_boxes.items():
        box.value = name in ("openvino", "onnxruntime-genai")
    p.concurrency.value = "1,2"
    assert p.plan()["total"] == (2 + 1) * (2 + 4)  # openvino serial + batched, onnxruntime-genai serial
    p.mode_boxes["serial"].value = False
    p.run_button.click()
    assert "onnxruntime-genai has no batched mode" in p.message.value and p._thread is None
