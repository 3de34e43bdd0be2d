"""Figures of serving (lab 05, ``lablib bench``): servers under a rate sweep, and a load run seen by the
client and by the server.

Pure functions of tidy rows: the per-(server, rate) rows of a rate sweep
(:func:`lablib.studies.serving.rate_sweep_table`, each a :func:`lablib.results.tables.run_summary` of one
run); the request rows of a run (:mod:`lablib.results.schema` columns) and the server's samples of it
(:class:`lablib.engines.http.metrics.MetricsSampler` rows, ``<out>.server.jsonl``), whose numbers come
from :func:`lablib.results.tables.client_server_timeline`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.plots.style import SERVER_COLORS, SERVER_LINE_COLORS, SERVER_SYMBOLS, log_ticks
from lablib.results.tables import client_server_timeline, need, nonempty

if TYPE_CHECKING:
    import plotly.graph_objects as go


RATE_SWEEP_ROWS = "lablib.studies.serving.rate_sweep_table"
TARGET_COLOR = "#B00020"


def rate_sweep(table, ttft_s: float | None = None, tpot_s: float | None = None, title: str | None = None) -> go.Figure:
    """Servers under a Poisson rate sweep: three panels against the arrival rate (requests/s, log x), one
    line per server in each: goodput (requests/s that met every target, linear, beside a dotted line where
    goodput equals the arrival rate: every request within its targets), TTFT p95 and TPOT p50 (seconds and
    milliseconds, log y), with the targets ``ttft_s`` and ``tpot_s`` drawn as dashed lines when given.

    Why these three: goodput alone says *that* a server fell behind, not why; TTFT p95 rising through its
    target is a queue (a one-slot server past its capacity), TPOT rising through its target is a batch
    computing for several requests at once (continuous batching on few cores). TTFT and TPOT are on log
    axes because a server past its capacity queues without bound: its TTFT grows 10x and 100x while the
    others' stay put, and on a linear axis it would flatten them. Hover gives each run's share of
    requests within every target.

    Needs the rows of :func:`lablib.studies.serving.rate_sweep_table`: server, rate, goodput_rps,
    goodput_fraction, ttft_p95_s, tpot_p50_s (a DataFrame or a list of dicts)."""
    import math

    import pandas as pd
    from plotly.subplots import make_subplots

    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    cols = ["server", "rate", "goodput_rps", "goodput_fraction", "ttft_p95_s", "tpot_p50_s"]
    need(nonempty(df, "rate_sweep", f"expected the rows of {RATE_SWEEP_ROWS}"), cols, "rate_sweep", RATE_SWEEP_ROWS)
    rates = sorted(float(r) for r in df["rate"].unique())
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.09,
        subplot_titles=(
            "Goodput: requests/s within every target",
            "Time to first token, p95 (s, log)",
            "Time per output token, p50 (ms, log)",
        ),
    )
    fig.add_scatter(
        row=1,
        col=1,
        x=rates,
        y=rates,
        mode="lines",
        name="arrival rate (every request within targets)",
        line=dict(color="#999999", dash="dot", width=1.5),
        hovertemplate="goodput = the arrival rate, %{x:g} requests/s<extra></extra>",
    )
    for i, (server, g) in enumerate(df.groupby("server", sort=False)):
        g = g.sort_values("rate")
        colour, symbol = SERVER_LINE_COLORS[i % len(SERVER_LINE_COLORS)], SERVER_SYMBOLS[i % len(SERVER_SYMBOLS)]
        custom = g[["goodput_fraction"]]
        panels = (
            (g["goodput_rps"].astype(float), "goodput %{y:.2f} requests/s"),
            (g["ttft_p95_s"].astype(float), "TTFT p95 %{y:.3f} s"),
            (g["tpot_p50_s"].astype(float) * 1000.0, "TPOT p50 %{y:.1f} ms"),
        )
        for col, (y, what) in enumerate(panels, 1):
            fig.add_scatter(
                row=1,
                col=col,
                x=g["rate"].astype(float).to_numpy(),
                y=y.to_numpy(),
                mode="lines+markers",
                name=str(server),
                legendgroup=str(server),
                showlegend=col == 1,
                line=dict(color=colour, width=2),
                marker=dict(color=colour, size=9, symbol=symbol),
                customdata=custom.to_numpy(),
                hovertemplate=(
                    f"<b>{server}</b> at %{{x:g}} requests/s<br>{what}<br>"
                    "%{customdata[0]:.0%} of its requests within every target<extra></extra>"
                ),
            )
    for col, target, scale, label in (
        (2, ttft_s, 1.0, "TTFT target {:g} s"),
        (3, tpot_s, 1000.0, "TPOT target {:g} ms"),
    ):
        if target is None:
            continue
        # the line, a shape (a trace would be one more line per server to the legend and the hover), and its
        # label, an annotation: on a log axis an annotation's y is the log10 of the value, a shape's the value
        axis = fig.get_subplot(1, col)
        xref, yref = axis.xaxis.plotly_name.replace("axis", ""), axis.yaxis.plotly_name.replace("axis", "")
        fig.add_shape(
            type="line",
            xref=f"{xref} domain",
            x0=0,
            x1=1,
            yref=yref,
            y0=target * scale,
            y1=target * scale,
            line=dict(color=TARGET_COLOR, dash="dash", width=1),
        )
        fig.add_annotation(
            xref=f"{xref} domain",
            x=0,
            xanchor="left",
            yref=yref,
            y=math.log10(target * scale),
            yanchor="bottom",
            text=label.format(target * scale),
            showarrow=False,
            font=dict(color=TARGET_COLOR, size=11),
        )
    # each target within its panel's range, however far above or below the medians it lies
    for col, target, scale, key in ((2, ttft_s, 1.0, "ttft_p95_s"), (3, tpot_s, 1000.0, "tpot_p50_s")):
        vals = [float(v) * scale for v in df[key] if v is not None and v == v and float(v) > 0]
        if target is not None:
            vals.append(target * scale)
        if vals:
            lo, hi = math.log10(min(vals)) - 0.15, math.log10(max(vals)) + 0.25
            fig.update_yaxes(range=[lo, hi], **log_ticks([10**lo, 10**hi]), row=1, col=col)
    fig.update_xaxes(
        type="log", tickvals=rates, ticktext=[f"{r:g}" for r in rates], title_text="arrival rate (requests/s)"
    )
    fig.update_yaxes(title_text="goodput (requests/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TTFT p95 (s)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="TPOT p50 (ms)", type="log", row=1, col=3)
    fig.update_layout(
        template="plotly_white",
        legend_title_text="server",
        legend=dict(orientation="h", yanchor="top", y=-0.25, x=0),
        margin=dict(b=110),
        height=460,
        title=title
        or (
            "Goodput and TTFT p95 against the arrival rate: which server keeps its requests within the targets?"
            "<br><sup>a server keeps up while its goodput follows the dotted line; TTFT through its target is a queue,"
            " TPOT through its target a batch computing for several requests</sup>"
        ),
    )
    return fig


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
