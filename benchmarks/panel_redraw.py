"""Does the sweep panel's live figure distort what it measures? One llama.cpp run, serial, 1 client, 8 requests of
16-token prompts and 16 output tokens, three ways, alternated over 3 rounds:

* ``direct``: ``lablib.measure.sweep.concurrency_sweep`` alone, no panel (the reference);
* ``off-thread``: the panel, its figure redrawn every second by a thread of its own while requests run (how the
  panel drew from the first Redrawer until it drew at rest);
* ``at rest``: the panel as it is: the figure drawn only between two points of the sweep
  (:class:`lablib.ui.background.Redrawer`, ``at_rest=True``), with no request in flight.

Per arm: each request's prefill and TPOT in ms (in order), their medians, and the run's slowest request over its
median (max / median), for prefill and for TPOT: a draw that overlaps a request shows as one request far above
the others, whatever the machine's speed that minute.

    python benchmarks/panel_redraw.py

Measured on a quiet 2-core AMD EPYC (AVX2 only), load about 1, 2026-12-07 (slowest request / median, rounds 0-2):

    direct:     prefill 1.23, 1.20, 1.23; TPOT 1.07, 1.08, 1.15
    off-thread: prefill 2.04, 2.67, 3.08; TPOT 1.83, 1.81, 1.83   (the request after the first row: 161-202 ms
                against a median of 66-79 ms; a second draw later in the run: TPOT 16-21 ms against 9-11.5)
    at rest:    prefill 1.21, 1.01, 1.02; TPOT 1.15, 1.03, 1.02
"""

import os
import statistics

os.environ["LABLIB_QUICK"] = "1"

import lablib  # noqa: E402
from lablib.measure import sweep  # noqa: E402
from lablib.ui import background, widgets  # noqa: E402

model = lablib.prepare()
ENGINE = "llama.cpp"
KW = dict(engines=[ENGINE], concurrency=[1], modes=["serial"], requests=8, prompt_tokens=16, max_new_tokens=16)


class OffThread(background.Redrawer):
    """The panel's redrawer as it was: a thread draws while the requests run; ``rest`` does nothing."""

    def __init__(self, draw, every_s=background.DRAW_EVERY_S, name="lablib-sweep-redraw", at_rest=False):
        super().__init__(draw, every_s, name=name, at_rest=False)


def panel_run(redrawer) -> tuple:
    widgets.Redrawer = redrawer
    p = lablib.sweep_panel(model, kind="concurrency", out="")
    for name, box in p.engine_boxes.items():
        box.value = name == ENGINE
    for mode, box in p.mode_boxes.items():
        box.value = mode == "serial"
    p.concurrency.value, p.prompt_tokens.value, p.requests.value, p.max_new_tokens.value = "1", "16", 8, 16
    df = p.run_sync()
    return df, p._redrawer.draws


def per_request(df) -> tuple[list, list]:
    df = df.sort_values("t_submit")
    return [round(1000 * x) for x in df["prefill_s"]], [round(1000 * x, 1) for x in df["tpot_s"]]


spikes = {"direct": [], "off-thread": [], "at rest": []}
for rnd in range(3):
    arms = {"direct": (per_request(sweep.concurrency_sweep(model, progress=False, **KW)), 0)}
    for name, cls in (("off-thread", OffThread), ("at rest", background.Redrawer)):
        df, draws = panel_run(cls)
        arms[name] = (per_request(df), draws)
    for name, ((pre, tpot), draws) in arms.items():
        r_pre, r_tpot = max(pre) / statistics.median(pre), max(tpot) / statistics.median(tpot)
        spikes[name].append((r_pre, r_tpot))
        print(
            f"round {rnd} {name:>10} (draws while it ran: {draws}): prefill ms median {statistics.median(pre):.0f} "
            f"{pre}, max/median {r_pre:.2f}; TPOT ms median {statistics.median(tpot):.1f} {tpot}, "
            f"max/median {r_tpot:.2f}",
            flush=True,
        )
for name, v in spikes.items():
    print(
        f"{name:>10}: slowest request / median, per round: prefill {', '.join(f'{a:.2f}' for a, _ in v)}; "
        f"TPOT {', '.join(f'{b:.2f}' for _, b in v)}"
    )
