"""ipywidgets panels: thin, they call :mod:`lablib.measure.sweep` and :mod:`lablib.plots`.

``sweep_panel()`` builds a form for a context-length or concurrency sweep. The Run
button runs the sweep in a background thread (the notebook stays responsive),
with a progress bar, an ETA and a plotly figure that grows as each request
finishes; Cancel stops it between requests (every finished row is kept, on disk
too). ``panel.run_sync()`` runs the same sweep with the panel's current values in
the calling thread: a headless run (nbval, CI) draws the same figure without a
click.
"""

from __future__ import annotations

import json
import threading
import time

from lablib import plots
from lablib.checks import csv_text, keywords_checked
from lablib.config import budget, quick_mode
from lablib.engines import IN_PROCESS, NAMES as ENGINE_NAMES
from lablib.errors import LabError
from lablib.measure import sweep
from lablib.measure.closed_loop import SCHEDULING_MODES
from lablib.ui.background import DRAW_EVERY_S, BackgroundRun, Redrawer, default_out

KINDS = ("context", "concurrency")


def defaults(kind: str = "context", quick: bool | None = None) -> dict:
    """The panel's default values for ``kind`` ("context" or "concurrency"), from
    :data:`lablib.config.BUDGETS`: small in quick mode (LABLIB_QUICK=1) so that a notebook runs
    in a few minutes on two cores."""
    quick = quick_mode() if quick is None else quick
    if kind not in KINDS:
        raise LabError(f"sweep kind {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "context":
        return dict(
            engines=list(ENGINE_NAMES),
            prompt_tokens=csv_text(budget("context_panel", "prompt_tokens", quick)),
            max_new_tokens=budget("context", "max_new_tokens", quick),
            reps=budget("context", "reps", quick),
        )
    # requests 0: the sweep's default, requests_per_client x concurrency per run
    return dict(
        engines=list(ENGINE_NAMES),
        prompt_tokens=str(budget("concurrency", "prompt_tokens", quick)),
        concurrency=csv_text(budget("concurrency", "concurrency", quick)),
        modes=list(SCHEDULING_MODES),
        requests=0,
        max_new_tokens=budget("concurrency", "max_new_tokens", quick),
    )


def _figure_widget():
    """A plotly FigureWidget, or None when anywidget (which plotly's FigureWidget needs) is missing."""
    try:
        import plotly.graph_objects as go

        return go.FigureWidget()
    except ImportError:
        return None


def show_figure(fw, fig) -> None:
    """Put plotly figure ``fig`` in the panel's figure ``fw``: a FigureWidget redrawn in one batch, or an
    ipywidgets.Output (no anywidget) whose one output is replaced; works from a run's thread too."""
    if hasattr(fw, "batch_update"):
        with fw.batch_update():
            fw.data = ()
            fw.layout = fig.layout
            fw.add_traces(list(fig.data))
    else:
        fw.outputs = (
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {
                    "application/vnd.plotly.v1+json": json.loads(fig.to_json()),
                    "text/plain": f"<plotly figure: {fig.layout.title.text}>",
                },
            },
        )


class SweepPanel(BackgroundRun):
    """A sweep form: engines, prompt lengths, concurrency levels, modes, output tokens, repetitions,
    requests, results file, Run / Cancel, progress with ETA, and a live figure.

    Attributes for code and tests: ``widget`` (the ipywidgets.VBox shown in a notebook; the panel
    displays itself), ``figure`` (the plotly FigureWidget, or an ipywidgets.Output where anywidget
    is missing), ``last_figure`` (the latest plotly Figure drawn), ``rows`` (dicts of this run),
    ``df`` (the DataFrame of the last run), ``error`` (the last error message, or None),
    ``cancel_event`` (the threading.Event given to the sweep), ``draw_every_s`` (the live figure is redrawn at most
    this often, between two points of the sweep, when no request is in flight: :class:`lablib.ui.background.Redrawer`).
    """

    def __init__(self, model=None, kind: str = "context", out: str | None = None):
        import ipywidgets as w

        if kind not in KINDS:
            raise LabError(f"sweep kind {kind!r}: expected one of {', '.join(KINDS)}")
        self.model = model
        self.rows: list[dict] = []
        self.df = None
        self.error: str | None = None
        self.last_figure = None
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._draw_error_shown = False
        self._run_kind = kind
        self.draw_every_s = DRAW_EVERY_S  # the live figure's redraws during a run (math.inf: once, at the end)

        wide = {"description_width": "120px"}

        def row_layout():  # one Layout per widget: hiding one must not hide another
            return w.Layout(width="460px")

        self.kind = w.ToggleButtons(
            options=[("context length", "context"), ("concurrency", "concurrency")],
            value=kind,
            description="sweep",
            style=wide,
        )
        # each box as wide as its name (onnxruntime-genai was cut at a fixed 130 px)
        self.engine_boxes = {
            name: w.Checkbox(
                value=name in ENGINE_NAMES,
                description=name,
                indent=False,
                style={"description_width": "initial"},
                layout=w.Layout(width="auto", margin="0 18px 0 0"),
            )
            for name in IN_PROCESS
        }
        self.prompt_tokens = w.Text(description="prompt tokens", style=wide, layout=row_layout(), placeholder="64,256")
        self.concurrency = w.Text(description="concurrency", style=wide, layout=row_layout(), placeholder="1,2,4")
        self.mode_boxes = {
            m: w.Checkbox(
                value=True,
                description=m,
                indent=False,
                style={"description_width": "initial"},
                layout=w.Layout(width="auto", margin="0 18px 0 0"),
            )
            for m in SCHEDULING_MODES
        }
        self.requests = w.BoundedIntText(
            min=0, max=10_000, description="requests per run", style=wide, layout=w.Layout(width="220px")
        )
        self._requests_hint = w.Label("0: two per client (2 x concurrency)")
        self.max_new_tokens = w.BoundedIntText(
            min=1, max=8192, description="output tokens", style=wide, layout=w.Layout(width="220px")
        )
        self.reps = w.BoundedIntText(
            min=1, max=1000, description="repetitions", style=wide, layout=w.Layout(width="220px")
        )
        self.out = w.Text(
            description="results file",
            style=wide,
            layout=w.Layout(width="460px"),
            placeholder="empty: keep results in memory only",
        )
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True)
        self.progress = w.IntProgress(
            value=0, min=0, max=1, description="0/0", style=wide, layout=w.Layout(width="460px")
        )
        self.status = w.Label(value="")
        self.message = w.HTML(value="")
        self.figure = _figure_widget()
        if self.figure is None:
            self.figure = w.Output()
        self._engine_row = w.HBox(
            [w.Label("engines", layout=w.Layout(width="124px"))] + list(self.engine_boxes.values()),
            layout=w.Layout(flex_flow="row wrap"),
        )
        self._requests_row = w.HBox([self.requests, self._requests_hint])
        self._mode_row = w.HBox([w.Label("modes", layout=w.Layout(width="124px"))] + list(self.mode_boxes.values()))
        self.widget = w.VBox(
            [
                self.kind,
                self._engine_row,
                self.prompt_tokens,
                self.concurrency,
                self._mode_row,
                self._requests_row,
                self.max_new_tokens,
                self.reps,
                self.out,
                w.HBox([self.run_button, self.cancel_button]),
                w.HBox([self.progress, self.status]),
                self.message,
                self.figure,
            ]
        )
        self.reset(kind, out)
        self.kind.observe(lambda change: self.reset(change["new"]), names="value")
        self.run_button.on_click(lambda _: self.start())
        self.cancel_button.on_click(lambda _: self.cancel())

    # --- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def reset(self, kind: str | None = None, out: str | None = None) -> None:
        """Fill the form with the defaults of ``kind`` (the current kind by default)."""
        kind = kind or self.kind.value
        d = defaults(kind)
        if self.kind.value != kind:
            self.kind.value = kind  # observe() calls reset() again; harmless
        for name, box in self.engine_boxes.items():
            box.value = name in d["engines"]
        self.prompt_tokens.value = d["prompt_tokens"]
        self.max_new_tokens.value = d["max_new_tokens"]
        if kind == "context":
            self.reps.value = d["reps"]
        else:
            self.concurrency.value = d["concurrency"]
            self.requests.value = d["requests"]
            for m, box in self.mode_boxes.items():
                box.value = m in d["modes"]
        self.out.value = out if out is not None else default_out(kind)
        show_ctx, show_conc = ("flex" if kind == "context" else "none"), ("flex" if kind != "context" else "none")
        self.reps.layout.display = show_ctx
        for widget in (self.concurrency, self._mode_row, self._requests_row):
            widget.layout.display = show_conc

    def show_message(self, text: str, error: bool = False, details: str | None = None) -> None:
        """Show ``text`` in the panel (red when ``error``; ``details`` folded below it)."""
        self._say(self.message, text, error, details)

    # --- the plan -----------------------------------------------------------------------------
    def plan(self) -> dict:
        """The sweep the form describes: {"kind", "kwargs", "total"}; LabError for invalid input."""
        kind = self.kind.value
        engines = sweep.engine_names([n for n, box in self.engine_boxes.items() if box.value])
        lengths = sweep.positive_ints(self.prompt_tokens.value, "prompt tokens")
        out = self.out.value.strip() or None
        if out is not None and not out.lower().endswith((".jsonl", ".parquet")):
            raise LabError(f"results file {out!r}: expected a name ending in .jsonl or .parquet (or empty)")
        max_new = sweep.positive_ints([self.max_new_tokens.value], "output tokens")[0]
        kwargs = dict(model=self.model, engines=engines, max_new_tokens=max_new, out=out)
        if kind == "context":
            reps = sweep.positive_ints([self.reps.value], "repetitions")[0]
            kwargs.update(prompt_tokens=lengths, reps=reps)
            total = len(engines) * len(lengths) * reps
        else:
            if len(lengths) != 1:
                raise LabError(f"prompt tokens={lengths}: a concurrency sweep uses one prompt length, such as 128")
            levels = sweep.positive_ints(self.concurrency.value, "concurrency")
            modes = [m for m, box in self.mode_boxes.items() if box.value]
            if not modes:
                raise LabError("no mode chosen: tick serial, batched or both")
            # 0: the sweep's default, 2 x concurrency
            requests = sweep.check_requests(int(self.requests.value) or None, levels)
            kwargs.update(prompt_tokens=lengths[0], concurrency=tuple(levels), modes=tuple(modes), requests=requests)
            runs = sum(len(m) for m in sweep.modes_per_engine(engines, modes).values())  # Engine.modes
            total = runs * sum(requests or 2 * c for c in levels)
        return {"kind": kind, "kwargs": kwargs, "total": total}

    # --- running ------------------------------------------------------------------------------

    def start(self) -> threading.Thread | None:
        """Run the sweep in a background thread (what Run does). Returns the thread, or None when the
        input is invalid (the message is shown in the panel) or a sweep is already running."""
        return self._start_background(
            self._plan_or_message,
            "lablib-sweep",
            lambda: self.show_message("a sweep is already running: wait for it or press Cancel"),
        )

    def _show(self, text: str, error: bool = False, details: str | None = None) -> None:
        self.show_message(text, error, details)

    def cancel(self) -> None:
        """Ask the sweep to stop after the request in flight (what Cancel does)."""
        self._cancel(
            self.show_message, "cancelling: the sweep stops after the request in flight; finished rows are kept"
        )

    def run_sync(self):
        """Run the sweep of the form's current values in the calling thread and draw its figure.

        Returns the DataFrame of the rows, or None when the input is invalid (the LabError message is
        shown in the panel). Errors from the sweep itself are shown, then raised. A run going on (Run pressed,
        another panel's) is waited for first: two at once would skew both.
        """
        self._wait_for_runs(self._runs_going(include_self=True))
        plan = self._plan_or_message()
        if plan is None:
            return None
        self._execute(plan, True)
        return self.df

    def _plan_or_message(self) -> dict | None:
        """The form's plan with a fresh cancel event, or None after showing why the input is invalid."""
        return self._checked(self.plan)

    def _execute(self, plan: dict, raise_errors: bool) -> None:
        import pandas as pd

        fn = sweep.context_sweep if plan["kind"] == "context" else sweep.concurrency_sweep
        self.rows, self.df, self.error, self._draw_error_shown = [], None, None, False
        self._run_kind = plan["kind"]  # the live figure follows the running sweep, not the toggle
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self.progress.max, self.progress.value = max(1, plan["total"]), 0
        self.progress.bar_style = ""
        self.progress.description = f"0/{plan['total']}"
        self.status.value = "loading the model and the first engine..."
        self.show_message("")
        self._t0 = time.perf_counter()
        try:
            # the live figure is drawn between two points of the sweep, with no request in flight (Redrawer)
            self._redrawer = Redrawer(self._draw_rows, self.draw_every_s, at_rest=True)
            try:
                df = fn(
                    **plan["kwargs"],
                    cancel=self.cancel_event,
                    on_row=self._on_row,
                    on_point=self._redrawer.rest,
                    progress=False,
                )
            finally:
                self._redrawer.close()
            self.df = df if df is not None and len(df) else pd.DataFrame(self.rows)
            self._draw(self.df, final=True)
            done, total = len(self.rows), plan["total"]
            # no row: no "rows in FILE" (a Cancel during the model's load said so of a file never written)
            where = f"; rows in {plan['kwargs']['out']}" if plan["kwargs"].get("out") and self.rows else ""
            if self.cancel_event.is_set() and done < total:
                self.show_message(f"cancelled after {done} of {total} requests{where}")
                self.progress.bar_style = "warning"
            else:
                self.show_message(f"done: {done} requests in {time.perf_counter() - self._t0:.1f} s{where}")
                self.progress.bar_style = "success"
        except Exception as e:  # a LabError's message; an engine crash: what, the traceback folded
            self.df = pd.DataFrame(self.rows)
            self.progress.bar_style = "danger"
            self._show_failure(e)
            if raise_errors:
                raise
        finally:
            self.run_button.disabled, self.cancel_button.disabled = False, True
            self.status.value = self._status_text(final=True)

    def _on_row(self, row: dict) -> None:
        """A finished request's row, in the measuring thread: kept, counted; the figure only marked stale."""
        with self._lock:
            self.rows.append(row)
            n = len(self.rows)
        self.progress.value = min(n, self.progress.max)
        self.progress.description = f"{n}/{self.progress.max}"
        self.status.value = self._status_text()
        self._redrawer.stale()

    def _draw_rows(self) -> None:
        """The live figure of the rows so far (between two points of the sweep)."""
        import pandas as pd

        with self._lock:
            rows = list(self.rows)
        self._draw(pd.DataFrame(rows))

    def _status_text(self, final: bool = False) -> str:
        done, total = self.progress.value, self.progress.max
        elapsed = time.perf_counter() - self._t0
        if final or done == 0:
            return f"{done}/{total} requests, {elapsed:.1f} s"
        eta = elapsed / done * (total - done)
        return f"{done}/{total} requests, {elapsed:.0f} s elapsed, ETA about {eta:.0f} s"

    # --- the figure ---------------------------------------------------------------------------
    def figure_for(self, df, kind: str | None = None):
        """The figure of a sweep kind (default: the last run's): context_bars, or concurrency_lines."""
        kind = kind or self._run_kind
        return plots.context_bars(df) if kind == "context" else plots.concurrency_lines(df)

    def _draw(self, df, final: bool = False) -> None:
        if df is None or len(df) == 0:
            return
        try:
            fig = self.figure_for(df)
        except Exception as e:  # a figure problem must not stop the sweep
            if final or not self._draw_error_shown:
                self.status.value = f"(figure not drawn: {e})"
                self._draw_error_shown = True
            return
        self.last_figure = fig
        fw = self.figure
        show_figure(fw, fig)


@keywords_checked
def sweep_panel(model=None, kind: str = "context", out: str | None = None) -> SweepPanel:
    """A sweep panel for ``model`` (None: the lab's default model), ``kind`` "context" or
    "concurrency", results appended to ``out`` (default results/<kind>-<time>.jsonl; "" keeps them
    in memory). Show it as a cell's last value; ``panel.run_sync()`` runs its defaults headless."""
    return SweepPanel(model=model, kind=kind, out=out)
