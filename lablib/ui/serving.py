"""Lab 05's panel: a load run on any OpenAI-compatible server from widgets (base URL, rate or
concurrency, goodput targets, requests), its summary line printed (:func:`lablib.ui.text.summary_line`)."""

from __future__ import annotations

from lablib.errors import LabError


class ServingPanel:
    """Widgets for a load run on any server: base URL, rate (empty: closed loop), concurrency, TTFT and
    TPOT targets, requests. ``run_sync()`` runs the current values here (headless notebooks) and returns
    the one-line summary (and, when requests failed, a line with the first one's error); the Run button does the
    same and prints it (greyed, "Running ...", until the run ends). ``model``: the lab's model (None: the
    default)."""

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
        self.requests = w.BoundedIntText(
            value=requests, min=1, max=1000, description="requests", style=label, layout=box()
        )
        self.ttft = w.FloatText(value=ttft_s, description="TTFT target (s)", style=label, layout=box())
        self.tpot = w.FloatText(value=tpot_s, description="TPOT target (s)", style=label, layout=box())
        self.prompt_tokens, self.max_new_tokens = prompt_tokens, max_new_tokens
        self.button = w.Button(description="Run", button_style="primary")
        self.output = w.Output()
        self.button.on_click(lambda _: self._click())
        self.widget = w.VBox(
            [
                self.base_url,
                w.HBox([self.open_loop, self._loop_hint]),
                w.HBox([self.rate, self.concurrency]),
                w.HBox([self.requests]),
                w.HBox([self.ttft, self.tpot]),
                self.button,
                self.output,
            ]
        )
        self.rows: list[dict] = []
        self.summary: dict | None = None

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def _click(self):
        # the run holds the kernel until it ends: Run greyed and saying so meanwhile (a second click queued a
        # second whole run, and nothing showed that the first had started)
        self.button.disabled, self.button.description = True, "Running ..."
        try:
            with self.output:
                try:
                    print(self.run_sync())
                except LabError as e:
                    print(f"lablib: {e}")
        finally:
            self.button.disabled, self.button.description = False, "Run"

    def _check(self) -> None:
        """The form's values a run needs, before any request; LabError naming the field and what it expects."""
        import math

        if not self.base_url.value.strip():
            raise LabError("base URL is empty: expected a server's OpenAI URL such as http://127.0.0.1:8080/v1")
        checks = [("TTFT target (s)", self.ttft.value), ("TPOT target (s)", self.tpot.value)]
        if self.open_loop.value:
            checks.insert(0, ("rate (requests/s)", self.rate.value))
        for what, v in checks:
            if not (math.isfinite(v) and v > 0):
                hint = "untick open loop for C clients instead" if what.startswith("rate") else "a goodput target"
                raise LabError(f"{what}={v:g}: expected a number above 0 ({hint})")

    def run_sync(self) -> str:
        from lablib.engines import load_engine
        from lablib.engines.base import GenerationConfig
        from lablib.measure.load import run_load, summarize
        from lablib.measure.workload import distinct_prompts
        from lablib.model.resolve import ResolvedModel, prepare
        from lablib.ui.text import summary_line

        self._check()
        if not isinstance(self.model, ResolvedModel):  # None: the lab's model, as the other panels take it
            self.model = prepare(self.model, log=lambda *_: None)
        n = self.requests.value
        prompts = distinct_prompts(self.model, self.prompt_tokens, n)
        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens)
        e = load_engine("http", self.model, base_url=self.base_url.value.strip())
        try:
            mode = "open" if self.open_loop.value else "closed"
            self.rows = run_load(
                e,
                prompts,
                mode,
                concurrency=self.concurrency.value,
                rate=self.rate.value if mode == "open" else None,
                cfg=cfg,
                max_duration_s=120,
            )
        finally:
            e.close()
        self.summary = summarize(self.rows, ttft_s=self.ttft.value, tpot_s=self.tpot.value)
        line = summary_line(
            e.kind, mode, self.rate.value if mode == "open" else None, self.concurrency.value, self.summary
        )
        failed = [r["error"] for r in self.rows if r.get("error")]
        if failed:  # errors=N/M alone did not say why (a base URL without /v1: every stream cut, 0 tokens)
            line += f"\n  {len(failed)} of {len(self.rows)} requests failed; the first: {str(failed[0]).strip()[:300]}"
        return line
