"""Lab 03's figure: the lab's numbers beside llama.cpp's own benchmarks (:mod:`lablib.studies.anchors`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.plots.style import color, titled
from lablib.results.tables import need

if TYPE_CHECKING:
    import plotly.graph_objects as go


def anchor_bars(rows, title: str | None = None) -> go.Figure:
    """Grouped bars: generated tokens/s across the batch at each concurrency, the lab's run next
    to llama.cpp's own benchmark on the same work (:func:`lablib.studies.anchors.batched_rows`).

    Needs: source ("lab" or the anchor's name), concurrency, output_tps."""
    import pandas as pd
    import plotly.graph_objects as go

    df = pd.DataFrame(rows)
    need(df, ["source", "concurrency", "output_tps"], "anchor_bars", "lablib.studies.anchors.batched_rows")
    fig = go.Figure()
    for source in df["source"].unique():
        part = df[df["source"] == source]
        lab = source == "lab"
        fig.add_bar(
            name=source,
            x=[f"B = {b}" for b in part["concurrency"]],
            y=part["output_tps"],
            marker_color=color("llama.cpp"),
            marker_opacity=1.0 if lab else 0.45,
            marker_pattern_shape="" if lab else ".",
            hovertemplate=f"<b>{source}</b><br>%{{x}}: %{{y:.1f}} tokens/s<extra></extra>",
        )
    return titled(
        fig,
        title or "llama.cpp batched decode: the lab against llama-batched-bench",
        x="sequences decoded together",
        y="generated tokens/s (all sequences)",
        barmode="group",
        legend_title_text="measured by",
    )


# --- engine or model? (lablib.studies.compare) ----------------------------------------------------------
