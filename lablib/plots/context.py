"""Figures of the context sweep (lab 02): where the time goes at each prompt length, and prefill speed and
TPOT against it. Pure functions of context rows (``sweep == "context"``; numbers from
:func:`lablib.results.tables.context_medians`); each returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.phases import BOTTOM, TOP, shares, slot, slowest_note, split_layout, split_subplots
from lablib.plots.style import PHASE_OPACITY, PHASE_PATTERN, color, engine_order, facet_spacing, log_ticks, match_y
from lablib.results.schema import FACETS
from lablib.results.tables import context_medians, facet_rows

if TYPE_CHECKING:
    import plotly.graph_objects as go


def context_bars(df, title: str | None = None) -> go.Figure:
    """Where the time goes, per engine and prompt length, in two panels over one prompt-length axis.

    Top: each engine's split of its own time: prefill's share (solid) and decode's (hatched) of its
    median prefill + decode, stacked to 100 %, one bar per engine side by side in each prompt-length
    group. Bottom: the same medians in seconds, prefill and decode side by side, on a log axis.

    Why two panels: one linear axis of seconds is set by the slowest engine. With MLX on Linux 100x
    slower than llama.cpp, the other engines' bars were a few pixels high and their split could not be
    read, while the split of each engine, side by side, is what the figure is for. Shares put every
    engine on the same 0-100 % scale whatever its speed; the log axis below keeps the seconds (and
    "prefill grows with the prompt") readable for every engine at once, an equal ratio being an equal
    height. Bars on a log axis are read by where they end against the gridlines, not by their length:
    the axis starts at the decade below the shortest bar and hover gives each number.

    Needs: engine, prompt_tokens, output_tokens, prefill_s, decode_s (context rows: ``sweep ==
    "context"``, or no ``sweep`` column). Values are medians over repetitions
    (:func:`lablib.results.tables.context_medians`).
    """
    med = shares(context_medians(df))
    lengths = sorted(med["prompt_tokens"].unique())
    cats = [str(int(n)) for n in lengths]
    fig = split_subplots()
    order = engine_order(med)
    for i, engine in enumerate(order):
        m = med[med["engine"] == engine]
        x = [str(int(n)) for n in m["prompt_tokens"]]
        custom = m[
            ["prompt_tokens", "output_tokens", "n", "prefill_tps", "tpot_ms", "prefill_s", "decode_s", "total_s"]
        ].to_numpy()
        for phase in ("prefill", "decode"):
            extra = (
                "prefill %{customdata[3]:.1f} tokens/s"
                if phase == "prefill"
                else "%{customdata[1]:.0f} output tokens, TPOT %{customdata[4]:.1f} ms"
            )
            secs = "%{customdata[5]:.3f}" if phase == "prefill" else "%{customdata[6]:.3f}"
            look = dict(
                marker_color=color(engine),
                marker_opacity=PHASE_OPACITY[phase],
                marker_pattern_shape=PHASE_PATTERN[phase],
                customdata=custom,
                legendgroup=engine,
                x=x,
            )
            fig.add_bar(
                row=TOP,
                col=1,
                name=f"{engine} · {phase}",
                **slot(i, len(order)),
                y=m[f"{phase}_share"].to_numpy(),
                base=m["prefill_share"].to_numpy() if phase == "decode" else None,
                texttemplate="%{y:.0%}" if phase == "prefill" else None,
                textposition="inside",
                textangle=0,
                insidetextanchor="middle",
                hovertemplate=(
                    f"<b>{engine}</b> · {phase}<br>prompt %{{customdata[0]:.0f}} tokens<br>{phase}: {secs} s, "
                    f"%{{y:.0%}} of its %{{customdata[7]:.3f}} s (median of %{{customdata[2]}})<br>{extra}"
                    "<extra></extra>"
                ),
                **look,
            )
            fig.add_bar(
                row=BOTTOM,
                col=1,
                name=f"{engine} · {phase} (s)",
                showlegend=False,
                **slot(i, len(order), ("prefill", "decode").index(phase), 2),
                y=m[f"{phase}_s"].to_numpy(),
                hovertemplate=(
                    f"<b>{engine}</b> · {phase}<br>prompt %{{customdata[0]:.0f}} tokens<br>"
                    f"{phase}: %{{y:.3f}} s (median of %{{customdata[2]}})<br>{extra}<extra></extra>"
                ),
                **look,
            )
    n_out = int(med["output_tokens"].median())
    longest = med[med["prompt_tokens"] == lengths[-1]].set_index("engine")["total_s"]
    note = slowest_note(longest)
    note = (
        f"<br>at {int(lengths[-1])} prompt tokens {note}" if note else ""
    )  # a line of its own: a panel's figure is narrow
    split_layout(
        fig,
        med,
        legend="engine · phase",
        x_title="prompt length (tokens)",
        headroom=0.15,
        title=title
        or (
            "Where the time goes in each engine: read its split on top, its seconds below"
            f"<br><sup>prefill of the prompt (solid), decode of {n_out} output tokens (hatched), medians{note}</sup>"
        ),
    )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=cats)
    return fig


def context_lines(df, facet_by: str | None = None, title: str | None = None) -> go.Figure:
    """Two panels against prompt length (log x): prefill tokens/s and TPOT in ms; one line per engine,
    medians with min-max error bars; both y axes logarithmic.

    Why log y: the engines differ by up to 100x here (MLX on Linux against llama.cpp), and on a linear
    axis the fast engines' lines lie flat on the slow one's scale, or the slow one's on the floor. On a
    log axis every engine's line keeps its shape, and the lesson is in the shape: prefill tokens/s
    levelling off and falling as attention grows with the square of the prompt, TPOT creeping up as the
    KV cache grows; the same ratio is the same height for every engine, so slopes compare directly.

    Needs: engine, prompt_tokens, prefill_tps, tpot_s (context rows). TPOT is None for
    one-token outputs: such points are left out. ``facet_by`` (a column of
    :data:`lablib.results.schema.FACETS`: "machine" for a learner's rows beside a reference,
    :func:`lablib.results.reference.beside`, or a room's machines: :func:`lablib.results.tables.facet_rows`)
    puts each machine on its own row of panels, each metric on one
    scale across the rows, so a GPU's line and this machine's are read against the same gridlines.
    """
    from plotly.subplots import make_subplots

    if facet_by is not None and facet_by not in FACETS:
        raise LabError(f"facet_by={facet_by!r}: expected None or one of {', '.join(map(repr, FACETS))}")
    df = facet_rows(df, facet_by, "context_lines(facet_by=...)")
    med = context_medians(df, facet_by)
    # the machines in the order the rows give them (a learner's first, then the references), not by prompt length
    facets = [f for f in dict.fromkeys(df[facet_by]) if (med[facet_by] == f).any()] if facet_by else [None]
    fig = make_subplots(
        rows=len(facets),
        cols=2,
        horizontal_spacing=0.1,
        vertical_spacing=facet_spacing(len(facets), 0.14),
        subplot_titles=[t for _ in facets for t in ("Prefill speed (compute-bound)", "Decode: time per output token")],
        row_titles=[str(f) for f in facets] if facet_by else None,
    )
    shown = set()
    for row, facet in enumerate(facets, 1):
        rows = med[med[facet_by] == facet] if facet_by else med
        for engine in engine_order(rows):
            m = rows[rows["engine"] == engine]
            for col, (key, unit, fmt) in enumerate((("prefill_tps", "tokens/s", ".1f"), ("tpot_ms", "ms", ".2f")), 1):
                y = m[key].to_numpy(dtype=float)
                fig.add_scatter(
                    row=row,
                    col=col,
                    x=m["prompt_tokens"].to_numpy(),
                    y=y,
                    mode="lines+markers",
                    name=engine,
                    legendgroup=engine,
                    showlegend=col == 1 and engine not in shown,
                    line=dict(color=color(engine), width=2),
                    marker=dict(color=color(engine), size=8),
                    error_y=dict(
                        type="data",
                        symmetric=False,
                        array=m[f"{key}_max"].to_numpy(dtype=float) - y,
                        arrayminus=y - m[f"{key}_min"].to_numpy(dtype=float),
                        thickness=1,
                        width=3,
                    ),
                    customdata=m[["n"]].to_numpy(),
                    hovertemplate=(
                        f"<b>{engine}</b>{' · ' + str(facet) if facet_by else ''}<br>prompt %{{x}} tokens<br>"
                        f"%{{y:{fmt}}} {unit} (median of %{{customdata[0]}})<extra></extra>"
                    ),
                )
            shown.add(engine)
    lengths = sorted(med["prompt_tokens"].unique())
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(int(n)) for n in lengths])
    fig.update_xaxes(title_text="prompt length (tokens)", row=len(facets))
    # one set of ticks per metric, over every machine's values, and one scale: the rows of a metric match
    spans = {key: med[[key, f"{key}_min", f"{key}_max"]].to_numpy().ravel() for key in ("prefill_tps", "tpot_ms")}
    for row in range(1, len(facets) + 1):
        fig.update_yaxes(title_text="prefill (tokens/s, log)", **log_ticks(spans["prefill_tps"]), row=row, col=1)
        fig.update_yaxes(title_text="TPOT (ms, log)", **log_ticks(spans["tpot_ms"]), row=row, col=2)
    match_y(fig, len(facets), 2)
    fig.update_layout(
        template="plotly_white",
        legend_title_text="engine",
        height=None if facet_by is None else 360 * len(facets) + 120,
        title=title
        or (
            "Prefill speed and decode time per token against prompt length (medians)"
            "<br><sup>log scales: read each engine's slope, the same ratio is the same height for every engine</sup>"
        ),
    )
    return fig
