"""Where one prompt's time goes in each engine (lab 01), and the two-panel split figure it shares with lab 02.

A split figure puts each engine's prefill/decode split (shares of its own time, stacked to 100 %) on top of
the same phases in seconds on a log axis, over one x axis: :func:`prefill_decode_bars` here (x: the
engines), :func:`lablib.plots.context.context_bars` (x: the prompt lengths). Pure functions of tidy rows
(the columns of :mod:`lablib.results.schema`, numbers from :mod:`lablib.results.tables`); rows with an
``error`` are left out; each returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.plots.style import PHASE_LEGEND_COLOR, PHASE_OPACITY, PHASE_PATTERN, color, log_ticks
from lablib.results.tables import engine_medians

if TYPE_CHECKING:
    import plotly.graph_objects as go


def shares(med):
    """``med`` (medians per engine, and prompt length) with each row's prefill + decode seconds
    (``total_s``) and the share of that total each phase takes (``prefill_share``, ``decode_share``:
    fractions of the engine's own time, summing to 1; NaN when the total is 0)."""
    total = med["prefill_s"].astype(float) + med["decode_s"].astype(float)
    safe = total.where(total > 0)
    return med.assign(
        total_s=total,
        prefill_share=med["prefill_s"].astype(float) / safe,
        decode_share=med["decode_s"].astype(float) / safe,
    )


def log_range(values, headroom: float = 0.35) -> list[float] | None:
    """A log axis's range (log10 units) for bars of ``values``: from the decade at or below the smallest
    positive value (so the shortest bar keeps a visible height) to a little above the largest (room for
    its label); None without a positive value."""
    import math

    v = [float(x) for x in values if x is not None and x == x and float(x) > 0]
    if not v:
        return None
    lo, hi = math.floor(math.log10(min(v)) - 0.25), math.log10(max(v)) + headroom
    return [lo, max(hi, lo + 1)]


def slowest_note(totals) -> str:
    """A sentence on how far apart the engines are (``totals``: engine -> seconds, one workload), the
    reason for a log scale: "mlx takes 98x as long as llama.cpp"; "" for one engine."""
    t = {e: float(v) for e, v in totals.items() if v == v and v > 0}
    if len(t) < 2:
        return ""
    fast, slow = min(t, key=t.get), max(t, key=t.get)
    ratio = t[slow] / t[fast]
    if ratio < 1.5:
        return ""
    return (
        f"{slow} takes {ratio:.0f}x as long as {fast}"
        if ratio >= 10
        else f"{slow} takes {ratio:.1f}x as long as {fast}"
    )


def slot(i: int, k: int, j: int = 0, parts: int = 1, group: float = 0.8) -> dict:
    """Where bar ``j`` of ``parts`` of engine ``i`` of ``k`` sits in its category (offset and width, in
    category units): the two panels of a split figure place their bars themselves, since plotly's
    grouping counts the bars of both panels together (the share panel's bars came out half as wide)."""
    w = group / k
    gap = 0.06 * w if parts > 1 else 0.0
    return {"offset": -group / 2 + i * w + j * w / parts + gap / 2, "width": w / parts - gap}


def split_subplots():
    """The two panels of a split figure over one shared x axis: the seconds below (row 1, plotly's ``xaxis``
    and ``yaxis``: the axis with the tick labels and the title), the shares on top (row 2, ``yaxis2``)."""
    from plotly.subplots import make_subplots

    return make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        start_cell="bottom-left",
        vertical_spacing=0.12,
        subplot_titles=(SECONDS_TITLE, SPLIT_TITLE),
    )


TOP, BOTTOM = 2, 1  # the rows of a split figure, counted from the bottom
SPLIT_TITLE = "Each engine's own time: prefill (solid) and decode (hatched), %"  # fits a sweep panel's figure too
SECONDS_TITLE = "The same phases in seconds (log scale: each gridline is 10 times the one below)"


def split_layout(fig, med, *, legend: str, x_title: str, title: str, headroom: float = 0.35):
    """A split figure's layout: its bars overlaid (each placed by :func:`slot`), the legend titled ``legend``,
    ``x_title`` under the bottom panel, the shares' axis 0-100 % on top and the seconds' log axis below, from
    the decade under the shortest bar of ``med`` (its prefill_s and decode_s) to ``headroom`` above the
    longest (:func:`log_range`). Returns ``fig``."""
    fig.update_layout(
        barmode="overlay",
        template="plotly_white",
        legend_title_text=legend,
        uniformtext=dict(minsize=9, mode="hide"),
        height=720,
        title=title,
        margin=dict(t=130),  # the title, its two lines of subtitle, then the top panel's title below them
    )
    fig.update_xaxes(title_text=x_title, row=BOTTOM, col=1)
    fig.update_yaxes(title_text="share of its time", tickformat=".0%", range=[0, 1], row=TOP, col=1)
    rng = log_range(med[["prefill_s", "decode_s"]].to_numpy().ravel(), headroom=headroom)
    ticks = log_ticks([10 ** rng[0], 10 ** rng[1]]) if rng else {"type": "log"}
    fig.update_yaxes(title_text="time (s, log)", range=rng, **ticks, row=BOTTOM, col=1)
    return fig


def prefill_decode_bars(df, title: str | None = None) -> go.Figure:
    """Where the time goes in each engine, one prompt: two panels over one engine axis.

    Top: each engine's split of its own time, prefill's share (solid) and decode's (hatched) of its
    median prefill + median decode (first to last token), stacked to 100 %, labelled in %. Bottom: the
    same medians in seconds, prefill and decode side by side, on a log axis, each bar labelled with
    its seconds.

    Why: on one linear axis of seconds the slowest engine sets the scale (MLX on Linux can take 100
    times llama.cpp's time), and the fast engines' bars shrink to a few pixels, their prefill/decode
    split unreadable. Shares show every engine's split at full height; the log axis keeps the seconds of
    every engine readable at once (an equal ratio is an equal height) and the labels give the numbers,
    since a bar on a log axis is read by where it ends, not by its length (the axis starts at the decade
    below the shortest bar).

    Needs: engine, prefill_s, decode_s, prompt_tokens, output_tokens (medians per engine:
    :func:`lablib.results.tables.engine_medians`)."""
    med = shares(engine_medians(df))
    engines = list(med.index)
    colors = [color(e) for e in engines]
    fig = split_subplots()
    custom = med[["prompt_tokens", "output_tokens", "prefill_s", "decode_s", "total_s"]].to_numpy()
    for phase in ("prefill", "decode"):
        look = dict(
            x=engines,
            legendgroup=phase,
            showlegend=False,
            marker_color=colors,
            marker_opacity=PHASE_OPACITY[phase],
            marker_pattern_shape=PHASE_PATTERN[phase],
            customdata=custom,
        )
        secs = "%{customdata[2]:.3f}" if phase == "prefill" else "%{customdata[3]:.3f}"
        fig.add_bar(
            row=TOP,
            col=1,
            name=phase,
            **slot(0, 1, group=0.6),
            y=med[f"{phase}_share"].to_numpy(),
            base=med["prefill_share"].to_numpy() if phase == "decode" else None,
            texttemplate="%{y:.0%}",
            textposition="inside",
            textangle=0,
            insidetextanchor="middle",
            hovertemplate=(
                f"<b>%{{x}}</b><br>{phase}: {secs} s, %{{y:.0%}} of its %{{customdata[4]:.3f}} s<br>"
                "prompt %{customdata[0]:.0f} tokens, output %{customdata[1]:.0f} tokens<extra></extra>"
            ),
            **look,
        )
        fig.add_bar(
            row=BOTTOM,
            col=1,
            name=f"{phase} (s)",
            **slot(0, 1, ("prefill", "decode").index(phase), 2, group=0.6),
            y=med[f"{phase}_s"].to_numpy(),
            texttemplate="%{y:.3g} s",
            textposition="outside",
            hovertemplate=(
                f"<b>%{{x}}</b><br>{phase}: %{{y:.3f}} s<br>prompt %{{customdata[0]:.0f}} tokens, "
                "output %{customdata[1]:.0f} tokens<extra></extra>"
            ),
            **look,
        )
        # the legend names the phase only (shade and hatching), in a neutral colour: the bars'
        # colour is the engine's, and a legend swatch would take the first engine's
        fig.add_bar(
            row=TOP,
            col=1,
            name=phase,
            x=[engines[0]],
            y=[None],
            legendgroup=phase,
            hoverinfo="skip",
            marker_color=PHASE_LEGEND_COLOR,
            marker_opacity=PHASE_OPACITY[phase],
            marker_pattern_shape=PHASE_PATTERN[phase],
        )
    n_in, n_out = int(med["prompt_tokens"].iloc[0]), int(med["output_tokens"].iloc[0])
    note = slowest_note(med["total_s"])
    return split_layout(
        fig,
        med,
        legend="phase",
        x_title="engine",
        title=title
        or (
            "Where the time goes in each engine: read its split on top, its seconds below"
            f"<br><sup>prefill of {n_in} prompt tokens (solid), decode of {n_out} output tokens (hatched), medians"
            f"{'<br>' + note if note else ''}</sup>"
        ),
    )
