"""Figures of serving (lab 05, ``lablib bench``): a load run seen by the client and by the server.

Pure functions of tidy rows: the request rows of a run (:mod:`lablib.results.schema` columns) and the
server's samples of it (:class:`lablib.engines.http.metrics.MetricsSampler` rows, ``<out>.server.jsonl``);
the numbers come from :func:`lablib.results.tables.client_server_timeline`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.plots.style import SERVER_COLORS
from lablib.results.tables import client_server_timeline

if TYPE_CHECKING:
    import plotly.graph_objects as go


def server_timeline(df, server, title: str | None = None) -> go.Figure:
    """Two rows on one shared time axis (seconds since the run's first t_submit): the client's view
    (requests in flight, a step line; each request's TTFT, a marker at its first token, right axis) above
    the server's view (``running`` and ``waiting`` requests, step lines; ``kv_usage``, % on the right axis).

    Both come from the lab's clock (the sampler stamps its rows with the traces' clock); LabError when the
    samples do not overlap the run. Needs: t_submit, t_start, t_first_token, t_last_token (ttft_s,
    request_index when present) of ``df``, one run; t_s, metric, value of ``server``.
    """
    import pandas as pd
    from plotly.subplots import make_subplots

    df = df if isinstance(df, pd.DataFrame) else pd.DataFrame(list(df))
    server = server if isinstance(server, pd.DataFrame) else pd.DataFrame(list(server))
    flight, ttft, samples = client_server_timeline(df, server)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("the client's view", "the server's view (its /metrics)"),
        specs=[[{"secondary_y": True}], [{"secondary_y": True}]],
    )
    fig.add_scatter(
        x=flight["t_s"],
        y=flight["in_flight"],
        mode="lines",
        line_shape="hv",
        name="requests in flight (client)",
        line_color=SERVER_COLORS["in_flight"],
        hovertemplate="%{x:.3f} s: %{y} in flight<extra></extra>",
        row=1,
        col=1,
    )
    fig.add_scatter(
        x=ttft["t_s"],
        y=ttft["ttft_s"],
        mode="markers",
        name="TTFT of each request (s, at its first token)",
        marker_color=SERVER_COLORS["ttft_s"],
        customdata=ttft[["request_index"]].to_numpy(),
        hovertemplate="request %{customdata[0]}: TTFT %{y:.3f} s, first token at %{x:.3f} s<extra></extra>",
        row=1,
        col=1,
        secondary_y=True,
    )
    for metric, label in (("running", "running (server)"), ("waiting", "waiting (server)")):
        m = samples[samples["metric"] == metric]
        if len(m):
            fig.add_scatter(
                x=m["t_s"],
                y=m["value"],
                line_shape="hv",
                mode="lines+markers",
                name=label,
                line_color=SERVER_COLORS[metric],
                hovertemplate=f"%{{x:.3f}} s: %{{y}} {metric}<extra></extra>",
                row=2,
                col=1,
            )
    kv = samples[samples["metric"] == "kv_usage"]
    if len(kv):
        fig.add_scatter(
            x=kv["t_s"],
            y=100 * kv["value"].astype(float),
            mode="lines+markers",
            line_dash="dot",
            name="KV cache used (server, %)",
            line_color=SERVER_COLORS["kv_usage"],
            hovertemplate="%{x:.3f} s: KV cache %{y:.1f}% used<extra></extra>",
            row=2,
            col=1,
            secondary_y=True,
        )
    fig.update_yaxes(title_text="requests in flight", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(
        title_text="TTFT (s)", rangemode="tozero", tickmode="auto", showgrid=False, row=1, col=1, secondary_y=True
    )
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1, secondary_y=False)
    fig.update_yaxes(
        title_text="KV cache used (%)", range=[0, 100], tickmode="auto", showgrid=False, row=2, col=1, secondary_y=True
    )
    fig.update_xaxes(title_text="seconds since the run's first request (the lab's clock)", row=2, col=1)
    fig.update_layout(
        title=title or f"{len(ttft)} requests: the client's and the server's view", height=560, hovermode="x"
    )
    return fig
