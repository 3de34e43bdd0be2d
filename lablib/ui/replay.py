"""Lab 09's panel: a slice of a request trace replayed on a server from widgets (the slice, the time
scale, the length scale, the prefix block), with Run / Cancel, a status line and the replay's figure.

Thin: it calls :mod:`lablib.measure.replay` (read, scale, build the prompts, replay, summarize) and
:func:`lablib.plots.server_timeline`, the figure lab 09 draws of its Mooncake slice. ``run_sync()`` runs
the current values in the calling thread (a headless notebook, a test); Run does the same in a background
thread, the figure growing as requests finish; Cancel sends no further request, lets the ones in flight
finish and ends the run (every finished row is kept, on disk too).

The bounds keep a run small on two cores, and each says where it comes from:

- :data:`COUNT`: 1 to 40 requests, the slice lab 09 replays in full mode (``BUDGETS["scheduler"]
  ["replay_count"]``); the first request from 0 to the trace's last (the shipped Mooncake slice has 1,000);
- :data:`TIME_SCALE`: 1/16 to 4 x the trace's times (below 1 faster, above 1 slower): 40 consecutive
  requests of the shipped slice arrive within 18 s, so even 4 x slower the schedule ends within 72 s,
  and 16 x faster they all arrive within about a second (a burst: any faster is "all at once");
- :data:`LENGTH_SCALE`: 1/256 to 1/16 of the trace's lengths (prompts and outputs): Mooncake's median
  prompt of about 8,400 tokens becomes 33 to 530 tokens, its 512-token blocks 2 to 32 tokens, and every
  prompt is cut to the server's context less its output (so a prompt never exceeds one slot);
- :data:`BLOCK_TOKENS`: 0 (the trace's 512 x the length scale, rounded, as :func:`lablib.measure.replay.scale`)
  or 1 to 128 tokens per block id, 128 being vLLM's block on its CPU build (the largest any server of the lab
  reuses at a time);
- :data:`MAX_DURATION_S`: 240 s for the whole run (72 s of schedule at most, then the server's drain).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time

from lablib.errors import LabError, first_line
from lablib.ui.background import BackgroundRun, Redrawer, default_out as panel_out, status_plain

COUNT = (1, 40)  # requests per run: lab 09's full-mode slice (BUDGETS["scheduler"]["replay_count"])
TIME_SCALE = (1 / 16, 4.0)  # x the trace's times: 40 requests' 18 s at most -> 72 s of schedule
LENGTH_SCALE = (1 / 256, 1 / 16)  # x the trace's lengths: 512-token blocks -> 2 .. 32 tokens
BLOCK_TOKENS = (0, 128)  # 0: 512 x length scale; at most vLLM's CPU block
MAX_DURATION_S = 240.0  # the run's time limit (seconds): the schedule's 72 s at most, then the drain
# the live figure's redraws at most this often (seconds): each one holds up the client's event loop (Redrawer)
REPLAY_DRAW_EVERY_S = 5.0
SERVER_DEFAULTS = {"parallel": 2, "n_ctx": 1024, "threads": 1}  # a server the panel starts: lab 09's


def default_out() -> str:
    """A fresh results file name, relative to the notebook's folder: results/replay-<time>.jsonl."""
    return panel_out("replay")


def _fraction(x: float) -> str:
    """1/64 for 0.015625, 0.25 as 1/4, 2 as 2 (a scale as a learner reads it)."""
    if x >= 1:
        return f"{x:g}"
    inv = 1 / x
    return f"1/{round(inv)}" if abs(inv - round(inv)) < 1e-6 else f"{x:.3g}"


def _ms(seconds: float) -> str:
    """A lag in milliseconds as the status line shows it."""
    return "under 0.1 ms" if seconds < 1e-4 else f"{seconds * 1e3:.1f} ms"


def check_values(start, count, time_scale, length_scale, block_tokens, trace_requests: int | None = None) -> dict:
    """The panel's values within its bounds (the module's docstring says where each comes from), as a dict;
    LabError naming the first value out of bounds otherwise. ``trace_requests``: the trace's length, for the
    slice's end (None: not checked)."""
    from lablib.checks import whole

    lo, hi = COUNT
    count = whole(count, "requests", f"{lo} to {hi} (a run small on two cores)", lo=lo, hi=hi)
    last = None if trace_requests is None else trace_requests - count
    where = (
        "" if last is None else f" to {last} ({count} requests from there reach the trace's last, {last + count - 1})"
    )
    start = whole(start, "first request", f"a request index from 0{where}", lo=0, hi=last)

    def factor(x, what, bounds, hint):
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        if not ok or not bounds[0] * (1 - 1e-9) <= x <= bounds[1] * (1 + 1e-9):
            lo_, hi_ = (_fraction(b) for b in bounds)
            raise LabError(f"{what}={x!r}: expected {lo_} to {hi_} ({hint})")
        return float(x)

    time_scale = factor(time_scale, "time scale", TIME_SCALE, "below 1 faster, above 1 slower than the trace")
    length_scale = factor(length_scale, "length scale", LENGTH_SCALE, "of the trace's prompt and output lengths")
    lo, hi = BLOCK_TOKENS
    block_tokens = whole(
        block_tokens, "block (tokens)", f"0 (the trace's 512 x the length scale) or 1 to {hi} tokens", lo=lo, hi=hi
    )
    return {
        "start": start,
        "count": count,
        "time_scale": time_scale,
        "length_scale": length_scale,
        "block_tokens": block_tokens or None,
    }


def _figure_imports() -> None:
    """What the first draw needs, imported ahead of the run (plotly's figure widget alone takes seconds)."""
    import plotly.graph_objects as go
    import plotly.subplots  # noqa: F401 - server_timeline's

    import lablib.plots  # noqa: F401

    try:
        go.FigureWidget  # noqa: B018 - the attribute imports plotly's widget module
    except ImportError:  # no anywidget: the figure goes to an Output
        pass


class ReplayPanel(BackgroundRun):
    """Widgets for a trace replay on one server: the slice (first request, requests), the time scale, the
    length scale, the prefix block (tokens), the results file, Run / Cancel, a progress bar, a status line
    and the replay's figure (:func:`lablib.plots.server_timeline`, shown from the first draw on).

    ``server``: a RunningServer (used as it is, never stopped here), an OpenAI base URL (``http...``), or a
    server's name (:data:`lablib.engines.servers.SERVERS`: the panel starts it for each run with
    ``server_options`` and stops it at the end, so nothing runs between runs).

    Attributes for code and tests: ``widget`` (the VBox a notebook shows; the panel displays itself),
    ``rows`` (dicts of the last run, finish order), ``df`` and ``samples`` (its rows and the server's
    /metrics samples as DataFrames), ``summary`` (:func:`lablib.measure.replay.replay_summary` with
    ``client_headroom`` and ``warning``), ``last_figure`` (the latest plotly Figure), ``figure`` (the
    FigureWidget, or an Output where anywidget is missing; None before the first draw), ``error`` (the last
    message of a refused or failed run, else None), ``cancel_event``, ``last_started`` (the server the panel
    started for its last run, stopped by its end; None when given a server or URL)."""

    def __init__(
        self,
        server,
        model=None,
        start: int = 0,
        count: int = 10,
        time_scale: float = 1.0,
        length_scale: float = 1 / 64,
        block_tokens: int = 0,
        out: str | None = None,
        server_options: dict | None = None,
    ):
        import ipywidgets as w

        check_values(start, count, time_scale, length_scale, block_tokens)  # LabError: no panel of bad values
        self.server, self.model, self.server_options = server, model, dict(server_options or {})
        self.rows: list[dict] = []
        self.df = self.samples = self.summary = self.last_figure = self.figure = None
        self.error: str | None = None
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self._sampler = None
        self._t0 = 0.0
        self._draw_note = ""
        self._title = "Trace replay"
        self.draw_every_s = (
            REPLAY_DRAW_EVERY_S  # math.inf: the figure drawn once, at the end (lablib.ui.background.Redrawer)
        )
        self.last_started = None  # the server the panel started for its last run (stopped at its end)

        # as lab 05's panel: the descriptions in one column of 150 px, each box 280 px, a hint beside it
        label = {"description_width": "150px"}

        def box(width: str = "280px"):
            return w.Layout(width=width)

        def hint(text: str):
            return w.Label(text, layout=w.Layout(margin="0 0 0 12px"))

        self.start = w.IntText(value=start, description="first request", style=label, layout=box())
        self.count = w.IntText(value=count, description="requests", style=label, layout=box())

        def log_slider(value, bounds, step, description):
            return w.FloatLogSlider(
                value=value,
                base=2,
                min=math.log2(bounds[0]),
                max=math.log2(bounds[1]),
                step=step,
                readout_format=".3g",
                continuous_update=False,
                description=description,
                style=label,
                layout=box("420px"),
            )

        self.time_scale = log_slider(time_scale, TIME_SCALE, 0.5, "time scale")
        self.length_scale = log_slider(length_scale, LENGTH_SCALE, 1, "length scale")
        self.block_tokens = w.IntText(value=block_tokens, description="block (tokens)", style=label, layout=box())
        self.out = w.Text(
            value=default_out() if out is None else out,
            description="results file",
            placeholder="empty: keep the rows in memory only",
            style=label,
            layout=box("480px"),
        )
        self._time_hint, self._length_hint = hint(""), hint("")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=1, description="0/0", style=label, layout=box("480px"))
        self.status = w.HTML(value="")
        self._figure_box = w.Box([])  # empty until the first draw: no empty figure on the page
        self.widget = w.VBox(
            [
                w.HBox([self.start, hint(f"requests {COUNT[0]} to {COUNT[1]} from here, in the trace's order")]),
                self.count,
                w.HBox([self.time_scale, self._time_hint]),
                w.HBox([self.length_scale, self._length_hint]),
                w.HBox([self.block_tokens, hint("0: the trace's 512-token block x the length scale")]),
                self.out,
                w.HBox([self.run_button, self.cancel_button]),
                self.progress,
                self.status,
                self._figure_box,
            ]
        )
        self._hints()
        for s in (self.time_scale, self.length_scale, self.block_tokens):
            s.observe(lambda _: self._hints(), names="value")
        self.run_button.on_click(lambda _: self.start_run())
        self.cancel_button.on_click(lambda _: self.cancel())

    # --- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def _hints(self) -> None:
        t, ls, b = self.time_scale.value, self.length_scale.value, self.block_tokens.value
        self._time_hint.value = (
            f"x{_fraction(t)}: {_fraction(1 / t)} x faster than the trace"
            if t < 1
            else (f"x{_fraction(t)}: {t:g} x slower than the trace" if t > 1 else "x1: the trace's own times")
        )
        block = b if isinstance(b, int) and b > 0 else max(1, round(512 * ls))
        self._length_hint.value = (
            # short enough for JupyterLab's default width beside its slider (the browser test's screenshot)
            f"{_fraction(ls)} of the lengths: median prompt ~{math.ceil(8430 * ls)} tokens, blocks of {block} tokens"
        )

    def show_status(self, text: str, error: bool = False, details: str | None = None) -> None:
        """The status line: ``text`` (red when ``error``, which also sets ``error``; ``details`` folded below)."""
        self._say(self.status, text, error, details)

    @property
    def status_text(self) -> str:
        """The status line as text."""
        return status_plain(self.status.value)

    # --- the run's values ---------------------------------------------------------------------
    def values(self) -> dict:
        """The form's values, checked (:func:`check_values`, the slice against the trace), with the trace's
        slice (``trace``) and results file (``out``, None: in memory); LabError for the first bad one."""
        from lablib.measure.replay import read_trace, scale
        from lablib.results.store import _suffix

        trace = read_trace(None)
        v = check_values(
            self.start.value,
            self.count.value,
            self.time_scale.value,
            self.length_scale.value,
            self.block_tokens.value,
            len(trace.requests),
        )
        out = self.out.value.strip() or None
        if out is not None:
            _suffix(out)  # a name ending in .jsonl or .parquet
        v["trace"] = read_trace(None, start=v["start"], count=v["count"])
        scale(v["trace"], v["time_scale"], v["length_scale"], block_tokens=v["block_tokens"])  # the factors' own checks
        v["out"] = out
        return v

    # --- running ------------------------------------------------------------------------------

    def start_run(self) -> threading.Thread | None:
        """Run in a background thread (what Run does). Returns the thread, or None when a value is refused
        (the message is in the status line) or a run is going on."""
        return self._start_background(
            self._values_or_status,
            "lablib-replay",
            lambda: self.show_status("a replay is running: wait for it, or press Cancel"),
        )

    def _show(self, text: str, error: bool = False, details: str | None = None) -> None:
        self.show_status(text, error, details)

    def cancel(self) -> None:
        """Send no further request; the ones in flight finish, then the run ends (what Cancel does)."""
        # run_load's stop: it sends nothing more, the requests in flight finish
        self._cancel(
            self.show_status, "cancelling: the requests in flight finish, no other is sent; finished rows are kept"
        )

    def run_sync(self) -> str | None:
        """Run the form's current values in the calling thread and draw the figure. Returns the status line,
        or None when a value is refused (its message is the status line, and nothing is sent). A failed run
        is shown in the status line, then raised. A run going on (Run pressed, another panel's) is waited for
        first: two at once would skew both."""
        self._wait_for_runs(self._runs_going(include_self=True))
        v = self._values_or_status()
        if v is None:
            return None
        self._execute(v, True)
        return self.status_text

    def _values_or_status(self) -> dict | None:
        self.error = None
        v = self._checked(self.values)
        if v is None:
            return None
        # the values pass: a refusal of earlier ones is off the screen (it stayed, red, while the model and server
        # got ready, up to a second or more, as if the new values were refused too)
        self.show_status("starting the run ...")
        return v

    def _engine(self, log):
        """(engine, server the panel started or None) for a run."""
        from lablib.engines import load_engine
        from lablib.engines.servers import RunningServer, canonical_server, start_server

        s = self.server
        if isinstance(s, RunningServer):
            return s.engine(self.model), None
        if isinstance(s, str) and s.strip().lower().startswith(("http://", "https://")):
            return load_engine("http", self.model, base_url=s.strip()), None
        if not isinstance(s, str):
            raise LabError(
                f"server={s!r}: expected a running server (start_server(...)), an OpenAI base URL such as "
                "http://127.0.0.1:8080/v1, or a server's name for the panel to start, such as 'llama-server'"
            )
        name = canonical_server(s)
        opts = {**SERVER_DEFAULTS, **self.server_options}
        log(f"starting {name} ({opts['parallel']} slots of {opts['n_ctx']} tokens, {opts['threads']} thread(s)) ...")
        srv = self.last_started = start_server(name, self.model, **opts)
        try:
            return srv.engine(self.model), srv
        except BaseException:
            srv.stop()
            raise

    def _execute(self, v: dict, raise_errors: bool) -> None:
        import pandas as pd

        from lablib.engines.base import GenerationConfig
        from lablib.engines.http.metrics import MetricsSampler, scrape
        from lablib.measure.headroom import LoopLagProbe
        from lablib.measure.load import client_headroom_of
        from lablib.measure.replay import build_prompts, lag_warning, replay, replay_summary, scale
        from lablib.model.resolve import ResolvedModel, prepare
        from lablib.results.store import LOAD_SYNC_S, ResultsWriter

        self.rows, self.df, self.samples, self.summary, self.error = [], None, None, None, None
        self._sampler, self._draw_note = None, ""
        n = v["count"]
        name = getattr(self.server, "name", None) or str(self.server)
        self._title = f"Trace replay: requests {v['start']} to {v['start'] + n - 1} on {name}"
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self.progress.max, self.progress.value, self.progress.bar_style = n, 0, ""
        self.progress.description = f"0/{n}"
        self._t0 = time.perf_counter()
        writer = None
        srv = None
        try:
            if not isinstance(self.model, ResolvedModel):
                self.model = prepare(self.model, log=lambda *_: None)
            writer = ResultsWriter(v["out"], sync_every_s=LOAD_SYNC_S) if v["out"] else None
            e, srv = self._engine(self.show_status)
            try:
                plan = scale(
                    v["trace"], v["time_scale"], v["length_scale"], block_tokens=v["block_tokens"], n_ctx=e.n_ctx
                )
                prompts = build_prompts(self.model, plan)
                self.show_status(f"warming up the server, then {n} requests on the trace's times ...")
                e.generate(e.tokenize("Hello there, how are you?"), GenerationConfig(max_new_tokens=4))
                try:
                    scrape(e.root_url, only_view=True)
                    self._sampler = MetricsSampler(e.root_url, 0.1)
                except LabError:  # a server without /metrics: the client's rows alone
                    self._sampler = None
                _figure_imports()  # now, not at the first row: an import mid-run holds the GIL from the client
                probe = LoopLagProbe()
                self._t0 = time.perf_counter()
                self._redrawer = Redrawer(self._draw, self.draw_every_s, name="lablib-replay-redraw")
                try:  # the rows made durable at the end, cancelled, failed or not
                    with writer if writer is not None else contextlib.nullcontext():
                        replay(
                            e,
                            plan,
                            prompts,
                            max_duration_s=MAX_DURATION_S,
                            on_row=lambda row: self._on_row(row, writer),
                            server_metrics=self._sampler,
                            client_probe=probe,
                            stop=self.cancel_event,
                        )
                finally:
                    self._redrawer.close()
            finally:
                e.close()
        except Exception as ex:
            self.df = pd.DataFrame(self.rows)
            self.progress.bar_style = "danger"
            self._show_failure(ex)
            if raise_errors:
                raise
            return
        finally:
            if srv is not None:
                srv.stop()
            self.run_button.disabled, self.cancel_button.disabled = False, True
        with self._lock:
            rows = list(self.rows)
        self.df = pd.DataFrame(rows)
        self.samples = pd.DataFrame(
            self._sampler.rows() if self._sampler is not None else [], columns=["t_s", "metric", "value"]
        )
        s = replay_summary(rows, plan) if rows else {"scheduled": n, "requests": 0}
        if rows:
            s["client_headroom"] = client_headroom_of(probe, s.get("itl_p50_s"))
            s["warning"] = lag_warning(s)
        self.summary = s
        self._draw(final=True)
        self.progress.bar_style = "warning" if self.cancel_event.is_set() and len(rows) < n else "success"
        self.show_status(self._final_line(rows, n, v["out"]))

    def _on_row(self, row: dict, writer) -> None:
        if writer is not None:
            writer.append(row)
        with self._lock:
            self.rows.append(row)
            done = len(self.rows)
            lags = [r["schedule_lag_s"] for r in self.rows if r.get("schedule_lag_s") is not None]
        self.progress.value = min(done, self.progress.max)
        self.progress.description = f"{done}/{self.progress.max}"
        if not self.cancel_event.is_set():
            from lablib.results.tables import percentile

            lag = f"; send lag p99 so far {_ms(percentile(lags, 99))}" if lags else ""
            self.show_status(
                f"{done} of {self.progress.max} requests done, {time.perf_counter() - self._t0:.0f} s{lag}"
            )
        self._redrawer.stale()  # drawn in the redrawer's thread, not in the event loop that stamps tokens

    def _final_line(self, rows, n: int, out) -> str:
        s = self.summary or {}
        errors = sum(1 for r in rows if r.get("error"))
        head = (
            f"cancelled: {len(rows)} of {n} requests done (the rest not sent)"
            if self.cancel_event.is_set() and len(rows) < n
            else f"done: {len(rows)} of {n} requests"
        )
        parts = [head + (f", {errors} failed" if errors else "")]
        p99 = s.get("schedule_lag_p99_s")
        if p99 is not None:
            limit = s["max_lag_s"] * 1e3
            parts.append(
                f"send lag p99 {_ms(p99)}: "
                + (
                    f"the client kept up (within {limit:.0f} ms of the trace's times)"
                    if s.get("kept_up")
                    else f"the client did NOT keep up (above {limit:.0f} ms): the arrivals are not the trace's"
                )
            )
        head_room = s.get("client_headroom") or {}
        if head_room.get("near_limit"):
            parts.append("the client was near its own limit: its TTFT and ITL include its own delay")
        if s.get("drain_s") is not None:
            parts.append(f"the server drained {s['drain_s']:.1f} s after the last send")
        if out and rows:
            parts.append(f"rows in {out}")
        if self._draw_note:
            parts.append(self._draw_note)
        return "; ".join(parts)

    # --- the figure ---------------------------------------------------------------------------
    def figure_for(self, rows, samples):
        """The replay's figure: :func:`lablib.plots.server_timeline` of its rows and the server's samples."""
        from lablib import plots

        return plots.server_timeline(rows, samples, title=self._title)

    def _draw(self, final: bool = False) -> None:

        import pandas as pd

        from lablib.ui.widgets import _figure_widget, show_figure

        with self._lock:
            rows = list(self.rows)
        if not rows:
            return
        samples = self._sampler.rows() if self._sampler is not None else []
        try:
            fig = self.figure_for(pd.DataFrame(rows), pd.DataFrame(samples, columns=["t_s", "metric", "value"]))
        except Exception as e:  # a figure problem must not stop the run (a server without /metrics, too few rows)
            if final:
                self._draw_note = f"(figure not drawn: {first_line(e)})"
            return
        self.last_figure = fig
        if self.figure is None:
            import ipywidgets as w

            self.figure = _figure_widget() or w.Output()
            self._figure_box.children = (self.figure,)
        fw = self.figure
        show_figure(fw, fig)


def replay_panel(
    server_or_url,
    model=None,
    *,
    start: int | None = None,
    count: int | None = None,
    time_scale: float = 1.0,
    length_scale: float | None = None,
    block_tokens: int = 0,
    out: str | None = None,
    parallel: int | None = None,
    n_ctx: int | None = None,
    threads: int | None = None,
) -> ReplayPanel:
    """A :class:`ReplayPanel` on ``server_or_url``: a RunningServer, an OpenAI base URL, or a server's name
    (``"llama-server"``: started for each run with ``parallel`` slots of ``n_ctx`` tokens and ``threads``,
    by default lab 09's 2, 1024 and 1, and stopped after it; with a server or URL these three are refused:
    it runs as it was started). ``model``: the lab's model (None: the default). The slice (``start``,
    ``count``) and ``length_scale`` default to lab 09's (:data:`lablib.config.BUDGETS` ``"scheduler"``,
    quick or full); ``out``: the results file (default results/replay-<time>.jsonl; "" keeps the rows in
    memory). Show it as a cell's last value; Run replays, ``panel.run_sync()`` does so headless."""
    from lablib.config import budget

    given = {k: x for k, x in (("parallel", parallel), ("n_ctx", n_ctx), ("threads", threads)) if x is not None}
    named = isinstance(server_or_url, str) and not server_or_url.strip().lower().startswith(("http://", "https://"))
    if given and not named:
        raise LabError(
            f"{', '.join(f'{k}={x!r}' for k, x in given.items())} with a running server or URL: these set up a "
            "server the panel starts (give its name, such as 'llama-server'); a running server keeps its own"
        )
    if named:
        from lablib.engines.servers import canonical_server

        canonical_server(server_or_url)  # an unknown name is refused now, not at Run
    return ReplayPanel(
        server_or_url,
        model,
        start=budget("scheduler", "replay_start") if start is None else start,
        count=budget("scheduler", "replay_count") if count is None else count,
        time_scale=time_scale,
        length_scale=budget("scheduler", "replay_length_scale") if length_scale is None else length_scale,
        block_tokens=block_tokens,
        out=out,
        server_options=given,
    )
