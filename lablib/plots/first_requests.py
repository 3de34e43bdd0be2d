"""Lab 01's figure of the first requests after a load (:mod:`lablib.studies.first_requests`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.plots.style import color, engine_order, log_ticks, titled
from lablib.results.tables import need, one_row_each

if TYPE_CHECKING:
    import plotly.graph_objects as go

# the process's first load of an engine solid, later loads in the same process dashed
LOAD_DASH = ("solid", "dash", "dot", "dashdot")


def first_request_lines(rows, title: str | None = None) -> go.Figure:
    """TTFT (ms, log axis) of each request after a load, in order (1: the first after the load): one line per engine
    and load, the engine's colour, the process's first load solid and later loads dashed. A first point above the
    rest of its line is what a warm-up request throws away.

    Needs: engine, load_number, request_number, ttft_s (:func:`lablib.studies.first_requests.first_requests`)."""
    import pandas as pd
    import plotly.graph_objects as go

    source = "lablib.studies.first_requests.first_requests"
    df = one_row_each(pd.DataFrame(rows), ["engine", "load_number", "request_number"], "first_request_lines", source)
    need(df, ["ttft_s"], "first_request_lines", source)
    fig = go.Figure()
    for engine in engine_order(df):
        for load, part in df[df["engine"] == engine].groupby("load_number", sort=True):
            part = part.sort_values("request_number")
            load = int(load)
            label = f"{engine}, load {load}" + (" (fresh process)" if load == 1 else "")
            fig.add_scatter(
                x=part["request_number"],
                y=1000.0 * part["ttft_s"],
                name=label,
                mode="lines+markers",
                line={"color": color(engine), "dash": LOAD_DASH[(load - 1) % len(LOAD_DASH)]},
                hovertemplate=f"<b>{label}</b><br>request %{{x}} after the load: TTFT %{{y:.1f}} ms<extra></extra>",
            )
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(**log_ticks(1000.0 * df["ttft_s"].to_numpy(dtype=float)))
    return titled(
        fig,
        title or "The first requests after a load: what a warm-up throws away",
        x="request after the load (1: the first)",
        y="TTFT (ms, log scale)",
        legend_title_text="engine, load",
    )
