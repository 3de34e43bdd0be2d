"""Figures of lab 09 (the scheduler under traffic): head-of-line blocking, the saturation knee, prefix reuse.

Pure functions of the tables :mod:`lablib.studies.scheduler` makes: a head-of-line run's per-token table
(``token_table``: request_index, role, token_index, t_s, itl_s, batch_tokens) with its summaries
(``hol_summary`` / ``hol_table``), a knee found in a rate sweep (``find_knee``'s result), a prefix-reuse
replay's table by arm (``prefix_reuse``) and multi-turn chats by turn (``turn_table``). They draw; they never
run a server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import LEGEND_COLOR, QUEUE_COLOR, SERVER_COLORS
from lablib.results.tables import need, nonempty

if TYPE_CHECKING:
    import plotly.graph_objects as go

# a head-of-line run's requests: the short streams in the running requests' colour, the long prompt in the
# queue's; their shades tell the short streams apart
SHORT_COLORS = ("#2CA58D", "#3D7DCA", "#1B6E5C", "#6FA8DC", "#145A32", "#0B3D91")
LONG_COLOR = "#C0392B"
PREFILL_SHADE = QUEUE_COLOR
TOKEN_COLUMNS = ("request_index", "role", "token_index", "t_s", "itl_s")
# a reuse run's arms (lablib.studies.scheduler.ARMS): prefix caching on in the running requests' colour, off in
# the long prompt's; on a solid line, off a dashed one (as lab 08's reuse / no reuse)
ARM_COLORS = {"on": SHORT_COLORS[0], "off": LONG_COLOR}
ARM_DASH = {"on": "solid", "off": "dash"}
ARM_NAMES = {"on": "prefix caching on", "off": "prefix caching off"}
REUSE_COLUMNS = ("prefix_cache", "prompt_tokens", "reusable_tokens", "seen_prefix_tokens", "cached_tokens")
TURN_COLUMNS = ("prefix_cache", "turn", "prompt_tokens", "cached_tokens", "seen_prefix_tokens", "ttft_p50_s")


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


def _arm(a) -> tuple[str, str, str]:
    return ARM_NAMES.get(a, str(a)), ARM_COLORS.get(a, QUEUE_COLOR), ARM_DASH.get(a, "dot")


def reuse_bars(table, title: str | None = None) -> go.Figure:
    """A replay with prefix caching on and off, from its table (:func:`lablib.studies.scheduler.prefix_reuse`,
    one row per arm). Left: the share of all prompt tokens each arm took from the cache, by the server's own
    counter (a bar per arm), beside the two bounds (the same in both arms): a perfect block cache over the
    trace's blocks (``reusable_tokens``) and a cache that kept every earlier prompt and output, at the server's
    block (``seen_prefix_tokens``). Right: TTFT p50 and p99 per arm (ms). Needs: prefix_cache, prompt_tokens,
    reusable_tokens, seen_prefix_tokens, cached_tokens, ttft_p50_s, ttft_p99_s."""
    from plotly.subplots import make_subplots

    df = _frame(table)
    need(df, (*REUSE_COLUMNS, "ttft_p50_s", "ttft_p99_s"), "reuse_bars", "lablib.studies.scheduler.prefix_reuse")
    nonempty(df, "reuse_bars", "run lablib.studies.scheduler.prefix_reuse first")
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.14,
        subplot_titles=("prompt tokens from the cache (% of all)", "TTFT (ms)"),
    )
    arms = df["prefix_cache"].tolist()
    names = [_arm(a)[0] for a in arms]
    share = [
        100 * c / p if c == c and c is not None and p else 0.0 for c, p in zip(df["cached_tokens"], df["prompt_tokens"])
    ]
    fig.add_bar(
        x=names,
        y=share,
        marker_color=[_arm(a)[1] for a in arms],
        name="the server's counter",
        text=[f"{v:.1f}%" for v in share],
        textposition="outside",
        hovertemplate="%{x}: %{y:.1f}% of the prompt tokens reused<extra></extra>",
        row=1,
        col=1,
    )
    first = df.iloc[0]
    for col, label, dash in (
        ("reusable_tokens", "perfect block cache (the trace's blocks)", "dash"),
        ("seen_prefix_tokens", "every earlier prompt and output kept", "dot"),
    ):
        v = 100 * first[col] / first["prompt_tokens"] if first["prompt_tokens"] else 0.0
        fig.add_scatter(
            x=names,
            y=[v] * len(names),
            mode="lines",
            line=dict(color=LEGEND_COLOR, dash=dash),
            name=f"bound: {label} ({v:.1f}%)",
            hoverinfo="skip",
            row=1,
            col=1,
        )
    for metric, pattern in (("ttft_p50_s", ""), ("ttft_p99_s", "/")):
        fig.add_bar(
            x=names,
            y=1000 * df[metric].astype(float),
            marker=dict(color=[_arm(a)[1] for a in arms], pattern_shape=pattern),
            name=metric.replace("_s", "").replace("ttft_", "TTFT "),
            hovertemplate=f"%{{x}}: {metric} %{{y:.0f}} ms<extra></extra>",
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text="% of prompt tokens", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        title=title or "Prefix caching on and off: reuse against its bounds, and TTFT", barmode="group", height=420
    )
    return fig


def turn_lines(table, title: str | None = None) -> go.Figure:
    """Multi-turn chats with prefix caching on and off, by turn (:func:`lablib.studies.scheduler.turn_table`):
    left, each arm's median TTFT against the turn (ms); right, its median cached tokens (the server's own
    count per request) beside the prompt's length (grey, thin) and the bound of what earlier turns held
    (``seen_prefix_tokens``, dotted). Prefix caching on is a solid line, off a dashed one. Needs: prefix_cache,
    turn, prompt_tokens, cached_tokens, seen_prefix_tokens, ttft_p50_s."""
    from plotly.subplots import make_subplots

    df = _frame(table)
    need(df, TURN_COLUMNS, "turn_lines", "lablib.studies.scheduler.turn_table")
    nonempty(df, "turn_lines", "run lablib.studies.scheduler.multi_turn first")
    fig = make_subplots(
        rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=("TTFT by turn (median, ms)", "tokens by turn (median)")
    )
    arms = list(dict.fromkeys(df["prefix_cache"].tolist()))
    for a in arms:
        name, colour, dash = _arm(a)
        g = df[df["prefix_cache"] == a].sort_values("turn")
        fig.add_scatter(
            x=g["turn"],
            y=1000 * g["ttft_p50_s"],
            mode="lines+markers",
            line=dict(color=colour, dash=dash),
            name=f"TTFT, {name}",
            hovertemplate=f"{name}, turn %{{x}}: TTFT %{{y:.0f}} ms<extra></extra>",
            row=1,
            col=1,
        )
        fig.add_scatter(
            x=g["turn"],
            y=g["cached_tokens"],
            mode="lines+markers",
            line=dict(color=colour, dash=dash),
            name=f"cached tokens, {name}",
            hovertemplate=f"{name}, turn %{{x}}: %{{y:.0f}} tokens from the cache<extra></extra>",
            row=1,
            col=2,
        )
    g = df[df["prefix_cache"] == arms[0]].sort_values("turn")
    fig.add_scatter(
        x=g["turn"],
        y=g["prompt_tokens"],
        mode="lines",
        line=dict(color=QUEUE_COLOR, width=1),
        name="prompt tokens",
        row=1,
        col=2,
    )
    fig.add_scatter(
        x=g["turn"],
        y=g["seen_prefix_tokens"],
        mode="lines",
        line=dict(color=LEGEND_COLOR, dash="dot"),
        name="bound: held by earlier requests",
        row=1,
        col=2,
    )
    for c in (1, 2):
        fig.update_xaxes(title_text="turn (0 is the first)", dtick=1, row=1, col=c)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title or "Multi-turn chats: TTFT and cached tokens by turn", height=420)
    return fig
