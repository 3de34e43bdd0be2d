"""Does the sweep panel's live figure distort what it measures? Lab 03's panel in quick mode, llama.cpp batched
at concurrency 1 and 2 (2 requests per client): the second wave's queue time (a closed loop submits it the moment
the first wave finishes, so it should be ~0) with the figure redrawn inside the row callback, as the panel did
before lablib.ui.background.Redrawer, and off the measuring thread, as it does now; alternated, 3 rounds.

    python benchmarks/panel_redraw.py
"""

import os
import statistics

os.environ["LABLIB_QUICK"] = "1"

import lablib  # noqa: E402

model = lablib.prepare()


def panel(inline: bool):
    p = lablib.sweep_panel(model, kind="concurrency", out="")
    for name, box in p.engine_boxes.items():
        box.value = name == "llama.cpp"
    for name, box in p.mode_boxes.items():
        box.value = name == "batched"
    if inline:  # the old _on_row: the whole figure redrawn in the callback
        old = p._on_row

        def on_row(row):
            old(row)
            p._draw_rows()

        p._on_row = on_row
    return p


res = {"inline": [], "off-thread": []}
for rep in range(3):  # alternated: both arms see the same machine
    for kind in ("inline", "off-thread"):
        p = panel(kind == "inline")
        df = p.run_sync()
        second = df[(df["concurrency"] == 2) & (df["request_index"] >= 2)]
        res[kind].append(float(second["queue_s"].max()))
        print(kind, rep, [round(x, 3) for x in second["queue_s"]], flush=True)
for k, v in res.items():
    print(
        f"{k}: second wave's longest queue, median of {len(v)} runs: {statistics.median(v):.3f} s ({[round(x, 3) for x in v]})"
    )
