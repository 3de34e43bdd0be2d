"""Lab 05's panel: a load run on any OpenAI-compatible server from widgets (base URL, rate or
concurrency, goodput targets, requests, results file), its summary line printed (:func:`lablib.ui.text.summary_line`)."""

from __future__ import annotations

import threading

from lablib.errors import LabError
from lablib.ui.background import BackgroundRun, default_out, status_plain

MAX_DURATION_S = 120.0  # a run's bound (seconds): a workshop's panel never holds a server for long


class ServingPanel(BackgroundRun):
    """Widgets for a load run on any server: base URL; an open loop at a rate (requests/s, nothing capping the
    requests in flight) or a closed loop of C clients (the field of the other loop greyed); TTFT and
    TPOT targets, requests, results file. A run is :func:`lablib.measure.load.bench`'s (what ``lablib bench``
    runs: one warm-up request, then the measured ones, each row appended to the results file as it finishes, the
    run's summary beside them in ``<file>.runs.jsonl``; at most :data:`MAX_DURATION_S`, the status line saying how
    many were sent when that bound came first). Run starts it in the background (the notebook stays live; Cancel
    sends no further request, the ones in flight finish and their rows are kept) and prints its one-line summary
    in the panel (and, when requests failed, a line with the first one's error);
    ``run_sync()`` runs the current values in the calling thread (headless notebooks) and returns those lines.
    ``model``: the lab's model (None: the default); ``out``: the results file (default:
    ``results/serving-<time>.jsonl``, beside the notebook)."""

    def __init__(
        self,
        model,
        base_url: str = "",
        rate: float = 1.0,
        concurrency: int = 1,
        requests: int = 4,
        prompt_tokens: int = 32,
        max_new_tokens: int = 8,
        ttft_s: float = 2.0,
        tpot_s: float = 0.1,
        out: str | None = None,
    ):
        import ipywidgets as w

        self.model = model
        # the descriptions in one column of 150 px (ipywidgets' default cut them at about 90 px: "TTFT targ..."),
        # the checkbox's as wide as its words, the long part of it in a label beside it
        label = {"description_width": "150px"}
        whole = {"description_width": "initial"}

        def box(width: str = "280px"):
            return w.Layout(width=width)

        self.base_url = w.Text(value=base_url, description="base URL", style=label, layout=box("480px"))
        self.open_loop = w.Checkbox(
            value=True, description="open loop: requests arrive at the rate", indent=False, style=whole
        )
        self._loop_hint = w.Label("(unticked: a closed loop of C clients, each sending its next when one ends)")
        self.rate = w.FloatText(value=rate, description="rate (requests/s)", style=label, layout=box())
        self.concurrency = w.BoundedIntText(
            value=concurrency, min=1, max=64, description="concurrency (C)", style=label, layout=box()
        )
        # an open loop has no C: a cap on the requests in flight kept them waiting in the lab, not in the server's
        # queue (a 4-slot server, capped at 1, measured as a one-slot one); greyed there, as the rate is in a closed one
        self.open_loop.observe(lambda _: self._loop_fields(), names="value")
        self._loop_fields()
        self.requests = w.BoundedIntText(
            value=requests, min=1, max=1000, description="requests", style=label, layout=box()
        )
        self.ttft = w.FloatText(value=ttft_s, description="TTFT target (s)", style=label, layout=box())
        self.tpot = w.FloatText(value=tpot_s, description="TPOT target (s)", style=label, layout=box())
        self.out = w.Text(
            value=out or default_out("serving"), description="results file", style=label, layout=box("480px")
        )
        self.prompt_tokens, self.max_new_tokens = prompt_tokens, max_new_tokens
        self.run_button = w.Button(description="Run", button_style="primary")
        self.cancel_button = w.Button(description="Cancel", disabled=True)
        self.status = w.HTML()
        self.output = w.Output()
        self.cancel_event = threading.Event()
        self.run_button.on_click(lambda _: self.start())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.widget = w.VBox(
            [
                self.base_url,
                w.HBox([self.open_loop, self._loop_hint]),
                w.HBox([self.rate, self.concurrency]),
                w.HBox([self.requests]),
                w.HBox([self.ttft, self.tpot]),
                self.out,
                w.HBox([self.run_button, self.cancel_button]),
                self.status,
                self.output,
            ]
        )
        self.rows: list[dict] = []
        self.summary: dict | None = None
        self.line: str | None = None
        self.error: str | None = None

    def _loop_fields(self) -> None:
        """The rate is the open loop's field, the concurrency the closed loop's: the other one greyed."""
        self.rate.disabled, self.concurrency.disabled = not self.open_loop.value, self.open_loop.value

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    # --- the form -----------------------------------------------------------------------------

    def values(self) -> dict:
        """The form's values a run needs, checked before any request; LabError naming the field and what it
        expects."""
        import math

        from lablib.results.store import _suffix

        url = self.base_url.value.strip()
        if not url:
            raise LabError("base URL is empty: expected a server's OpenAI URL such as http://127.0.0.1:8080/v1")
        checks = [("TTFT target (s)", self.ttft.value), ("TPOT target (s)", self.tpot.value)]
        if self.open_loop.value:
            checks.insert(0, ("rate (requests/s)", self.rate.value))
        for what, v in checks:
            if not (math.isfinite(v) and v > 0):
                hint = "untick open loop for C clients instead" if what.startswith("rate") else "a goodput target"
                raise LabError(f"{what}={v:g}: expected a number above 0 ({hint})")
        out = self.out.value.strip()
        if not out:
            raise LabError("results file is empty: expected a file name such as results/serving.jsonl")
        _suffix(out)  # a name ending in .jsonl or .parquet (its place is refused before any request, by bench)
        return {
            "base_url": url,
            "mode": "open" if self.open_loop.value else "closed",
            "rate": float(self.rate.value) if self.open_loop.value else None,
            "concurrency": None if self.open_loop.value else int(self.concurrency.value),
            "requests": int(self.requests.value),
            "ttft_s": float(self.ttft.value),
            "tpot_s": float(self.tpot.value),
            "out": out,
        }

    def _show(self, text: str, error: bool = False, details: str | None = None) -> None:
        self._say(self.status, text, error, details)

    @property
    def status_text(self) -> str:
        """The status line as text."""
        return status_plain(self.status.value)

    # --- running ------------------------------------------------------------------------------

    def start(self) -> threading.Thread | None:
        """Run in a background thread (what Run does). Returns the thread, or None when a value is refused
        (the message is in the status line) or a run is going on."""
        return self._start_background(
            lambda: self._checked(self.values),
            "lablib-serving",
            lambda: self._show("a run is going on: wait for it, or press Cancel"),
        )

    def cancel(self) -> None:
        """Send no further request; the ones in flight finish, then the run ends (what Cancel does)."""
        self._cancel(self._show, "cancelling: the requests in flight finish, no other is sent; finished rows are kept")

    def run_sync(self) -> str:
        """Run the form's current values in the calling thread; the summary line (and, when requests failed, a
        line with the first one's error). A refused value or a failed run: LabError (also in the status line).
        A run going on (Run pressed, another panel's) is waited for first: two at once would skew both."""
        self._wait_for_runs(self._runs_going(include_self=True))
        try:
            v = self.values()
        except LabError as e:
            self._show(str(e), error=True)
            raise
        self.cancel_event = threading.Event()
        self._execute(v, True)
        return self.line

    def _execute(self, v: dict, raise_errors: bool) -> None:
        """One run of the values ``v`` (:meth:`values`), in this thread; its lines in the panel's output when run
        in the background (``raise_errors`` False: Run), returned by :meth:`run_sync` otherwise."""
        self.rows, self.summary, self.line, self.error = [], None, None, None
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self._show(f"running: a warm-up request, then {v['requests']} requests ({v['mode']} loop) ...")
        try:
            self._measure(v)
        except Exception as e:
            self._show_failure(e)
            if raise_errors:
                raise
            return
        finally:
            self.run_button.disabled, self.cancel_button.disabled = False, True
        failed = sum(1 for r in self.rows if r.get("error"))  # said here too, as the replay panel does
        where = (f", {failed} failed" if failed else "") + (f"; rows in {v['out']}" if self.rows else "")
        if self.cancel_event.is_set() and len(self.rows) < v["requests"]:
            self._show(f"cancelled after {len(self.rows)} of {v['requests']} requests{where}")
        elif self.summary is not None and len(self.rows) < v["requests"]:  # the run's time bound came first
            fit = "fewer requests or a higher rate" if v["mode"] == "open" else "fewer requests"
            self._show(
                f"done: {len(self.rows)} of {v['requests']} requests: the run's bound of {MAX_DURATION_S:g} s came "
                f"before the rest were sent ({fit} fit in it){where}"
            )
        else:
            self._show(f"done: {len(self.rows)} requests{where}")
        if not raise_errors:
            self.output.append_stdout(self.line + "\n")

    def _measure(self, v: dict) -> None:
        from lablib.measure.load import bench
        from lablib.model.resolve import ResolvedModel, prepare
        from lablib.ui.text import stream_note, summary_line

        if not isinstance(self.model, ResolvedModel):  # None: the lab's model, as the other panels take it
            self.model = prepare(self.model, log=lambda *_: None)
        summaries = bench(
            base_url=v["base_url"],
            out=v["out"],
            requests=v["requests"],
            prompt_tokens=self.prompt_tokens,
            max_new_tokens=self.max_new_tokens,
            rates=None if v["rate"] is None else [v["rate"]],
            concurrency=v["concurrency"],
            model=self.model,
            ttft_s=v["ttft_s"],
            tpot_s=v["tpot_s"],
            max_duration_s=MAX_DURATION_S,
            log=lambda *_: None,  # a server without /metrics: its rows alone, as bench's own note says
            on_row=self.rows.append,
            stop=self.cancel_event,
        )
        if not summaries:  # Cancel pressed during the warm-up: no run started
            self.line = "cancelled during the warm-up request: nothing measured"
            return
        self.summary = s = summaries[0]
        line = summary_line(s["server"], s["mode"], s["rate"], s["concurrency"], s)
        if note := stream_note(s):
            line += f"\n  {note}"
        failed = [r["error"] for r in self.rows if r.get("error")]
        if failed:  # errors=N/M alone did not say why (a base URL without /v1: every stream cut, 0 tokens)
            line += f"\n  {len(failed)} of {len(self.rows)} requests failed; the first: {str(failed[0]).strip()[:300]}"
        self.line = line
