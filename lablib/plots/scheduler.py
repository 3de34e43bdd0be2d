"""Figures of lab 09 (the scheduler under traffic): head-of-line blocking and the saturation knee.

Pure functions of the tables :mod:`lablib.studies.scheduler` makes: a head-of-line run's per-token table
(``token_table``: request_index, role, token_index, t_s, itl_s, batch_tokens) with its summaries
(``hol_summary`` / ``hol_table``), and a knee found in a rate sweep (``find_knee``'s result). They draw;
they never run a server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import QUEUE_COLOR, SERVER_COLORS
from lablib.results.tables import need, nonempty

if TYPE_CHECKING:
    import plotly.graph_objects as go

# a head-of-line run's requests: the short streams in the running requests' colour, the long prompt in the
# queue's; their shades tell the short streams apart
SHORT_COLORS = ("#2CA58D", "#3D7DCA", "#1B6E5C", "#6FA8DC", "#145A32", "#0B3D91")
LONG_COLOR = "#C0392B"
PREFILL_SHADE = QUEUE_COLOR
TOKEN_COLUMNS = ("request_index", "role", "token_index", "t_s", "itl_s")


def _frame(x):
    import pandas as pd

    if isinstance(x, pd.DataFrame):
        return x
    if isinstance(x, dict):
        return pd.DataFrame([x])
    return pd.DataFrame([getattr(r, "summary", r) for r in x])


def hol_timeline(tokens, summaries=None, title: str | None = None) -> go.Figure:
    """The running streams' ITL over time while a long prompt arrives: one panel per ``batch_tokens`` of
    ``tokens`` (the server's token budget per step), x the time each token arrived (seconds since the
    run's first request), y its gap since the request's previous token (ITL, ms), a line per short stream
    and the long request's tokens as diamonds. Given the ``summaries`` (one ``hol_summary`` dict, a list of
    them or ``hol_table``'s DataFrame), each panel shades the long prompt's prefill: from its arrival to
    its first token, marked with its TTFT.

    With the whole prompt in one step, the short streams' lines jump once, by about the prefill time; with
    a small budget they rise a little for several steps and never stop. Needs: request_index, role,
    token_index, t_s, itl_s (batch_tokens for panels) of ``tokens``; batch_tokens, long_arrival_s,
    long_first_token_s, long_ttft_s of ``summaries``."""
    from plotly.subplots import make_subplots

    df = _frame(tokens)
    need(df, TOKEN_COLUMNS, "hol_timeline", "lablib.studies.scheduler.token_table")
    nonempty(df, "hol_timeline", "run lablib.studies.scheduler.hol_blocking first")
    if "batch_tokens" not in df.columns:
        df = df.assign(batch_tokens=None)
    budgets = list(dict.fromkeys(df["batch_tokens"].tolist()))
    windows = {}
    if summaries is not None:
        s = _frame(summaries)
        need(s, ("batch_tokens", "long_arrival_s", "long_first_token_s", "long_ttft_s"), "hol_timeline summaries")
        for _, row in s.iterrows():
            windows[row["batch_tokens"]] = row
        missing = [b for b in budgets if b not in windows]
        if missing and len(s) == 1 and len(budgets) == 1:
            windows = {budgets[0]: s.iloc[0]}
        elif missing:
            raise LabError(f"hol_timeline: no summary for batch_tokens {missing}; the summaries have {list(windows)}")

    def label(b):
        return "server's default batch" if b is None or b != b else f"batch of {int(b)} tokens per step"

    fig = make_subplots(
        rows=len(budgets), cols=1, shared_xaxes=False, vertical_spacing=0.12, subplot_titles=[label(b) for b in budgets]
    )
    for i, b in enumerate(budgets, start=1):
        part = df[df["batch_tokens"].isna()] if b is None or b != b else df[df["batch_tokens"] == b]
        shorts = sorted(part.loc[part["role"] == "short", "request_index"].unique())
        for j, req in enumerate(shorts):
            r = part[(part["request_index"] == req) & part["itl_s"].notna()].sort_values("t_s")
            fig.add_scatter(
                x=r["t_s"],
                y=1000 * r["itl_s"],
                mode="lines+markers",
                marker_size=4,
                line_color=SHORT_COLORS[j % len(SHORT_COLORS)],
                name=f"short stream {req}",
                legendgroup=f"short {req}",
                showlegend=i == 1,
                hovertemplate=f"short {req}: token at %{{x:.3f}} s, ITL %{{y:.1f}} ms<extra></extra>",
                row=i,
                col=1,
            )
        long = part[part["role"] == "long"].sort_values("t_s")
        if len(long):
            first = long[long["token_index"] == 0]
            rest = long[long["token_index"] > 0]
            fig.add_scatter(
                x=rest["t_s"],
                y=1000 * rest["itl_s"],
                mode="markers",
                marker=dict(symbol="diamond", size=8, color=LONG_COLOR),
                name="long request's tokens",
                legendgroup="long",
                showlegend=i == 1,
                hovertemplate="long: token at %{x:.3f} s, ITL %{y:.1f} ms<extra></extra>",
                row=i,
                col=1,
            )
            for _, f in first.iterrows():
                fig.add_vline(x=f["t_s"], line_dash="dot", line_color=LONG_COLOR, row=i, col=1)
        w = windows.get(b)
        if w is not None:
            fig.add_vrect(
                x0=w["long_arrival_s"],
                x1=w["long_first_token_s"],
                fillcolor=PREFILL_SHADE,
                opacity=0.3,
                line_width=0,
                annotation_text=f"long prompt: arrival to first token (TTFT {w['long_ttft_s']:.2f} s)",
                annotation_position="top left",
                row=i,
                col=1,
            )
        fig.update_yaxes(title_text="ITL (ms)", rangemode="tozero", row=i, col=1)
        fig.update_xaxes(title_text="seconds since the run's first request", row=i, col=1)
    fig.update_layout(
        title=title or "The running streams' ITL while a long prompt is prefilled",
        height=320 * len(budgets) + 80,
    )
    return fig


def knee_plot(knee: dict, title: str | None = None) -> go.Figure:
    """A rate sweep's throughput and latency against the offered rate, with its saturation knee marked: the
    result of :func:`lablib.studies.scheduler.find_knee` (its ``steps`` table: the rate, throughput and
    latency columns it was found on). Throughput (left axis) beside the line it would follow if the
    server kept up (the light-load slope through the origin, dotted); latency (right axis); a dashed line
    at the knee, its reason in the hover, and a dotted one at the Kneedle corner when it differs."""
    from plotly.subplots import make_subplots

    if not isinstance(knee, dict) or "steps" not in knee:
        raise LabError("knee_plot takes the result of lablib.studies.scheduler.find_knee(table): a dict with its steps")
    steps = knee["steps"]
    cols = [c for c in steps.columns if c not in ("throughput_gain", "latency_growth", "is_knee")]
    if len(cols) != 3:
        raise LabError(f"knee_plot: the knee's steps have {list(steps.columns)}; expected find_knee's steps table")
    need(steps, (*cols, "throughput_gain", "latency_growth", "is_knee"), "knee_plot", "find_knee")
    x, thr, lat = cols
    xs, ts, ls = steps[x].tolist(), steps[thr].tolist(), steps[lat].tolist()
    light = ts[0] / xs[0]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(
        x=xs,
        y=ts,
        mode="lines+markers",
        name=thr,
        line_color=SERVER_COLORS["running"],
        customdata=steps[["throughput_gain"]].to_numpy(),
        hovertemplate=f"{x} %{{x:g}}: {thr} %{{y:.3g}} (step gain %{{customdata[0]:.2f}}x)<extra></extra>",
    )
    fig.add_scatter(
        x=[0, xs[-1]],
        y=[0, light * xs[-1]],
        mode="lines",
        line_dash="dot",
        line_color=SERVER_COLORS["running"],
        name="if it kept up (light-load slope)",
        hoverinfo="skip",
    )
    fig.add_scatter(
        x=xs,
        y=ls,
        mode="lines+markers",
        name=lat,
        line_color=SERVER_COLORS["ttft_s"],
        customdata=steps[["latency_growth"]].to_numpy(),
        hovertemplate=f"{x} %{{x:g}}: {lat} %{{y:.3g}} (%{{customdata[0]:.1f}}x light load)<extra></extra>",
        secondary_y=True,
    )
    if knee.get("x") is not None:
        fig.add_vline(x=knee["x"], line_dash="dash", line_color=LONG_COLOR, annotation_text=f"knee: {x} {knee['x']:g}")
    if knee.get("kneedle_x") is not None and knee["kneedle_x"] != knee.get("x"):
        fig.add_vline(
            x=knee["kneedle_x"],
            line_dash="dot",
            line_color=QUEUE_COLOR,
            annotation_text="Kneedle corner",
            annotation_position="bottom right",
        )
    fig.update_xaxes(title_text=x, rangemode="tozero")
    fig.update_yaxes(title_text=thr, rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text=lat, rangemode="tozero", showgrid=False, secondary_y=True)
    fig.update_layout(
        title=title
        or (f"Saturation knee at {x} {knee['x']:g}" if knee.get("x") is not None else "No knee in the sweep"),
        height=420,
        hovermode="x",
    )
    fig.add_annotation(
        text=knee.get("reason", ""),
        xref="paper",
        yref="paper",
        x=0,
        y=-0.22,
        showarrow=False,
        align="left",
        font_size=11,
    )
    return fig
