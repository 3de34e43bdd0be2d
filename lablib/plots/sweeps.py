"""Figures of the sweeps (labs 01-03): context length, concurrency, one run's timeline, the prefill/decode split.

Axes carry units; hover shows numbers; colours come from :mod:`lablib.plots.style`.

Every function here is a pure function of tidy rows (a results DataFrame, one row
per measured request, the columns of :mod:`lablib.results.schema`) or of what a comparison
stored (:mod:`lablib.studies.compare`), and returns a ``plotly.graph_objects.Figure``. The
numbers come from :mod:`lablib.results.tables`; a figure only draws. Rows with an ``error``
are left out. One HTML report of several figures: :mod:`lablib.ui.report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import (
    LEGEND_COLOR,
    PHASE_LEGEND_COLOR,
    PHASE_OPACITY,
    PHASE_PATTERN,
    QUEUE_COLOR,
    color,
    engine_order,
    log_ticks,
    mode_dash,
    mode_order,
)
from lablib.results.schema import CLOCKS, FACETS
from lablib.results.tables import (
    concurrency_summary,
    context_medians,
    engine_medians,
    need,
    nonempty,
    ok_rows,
    sweep_rows,
    timeline_segments,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go


def _shares(med):
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


def _log_range(values, headroom: float = 0.35) -> list[float] | None:
    """A log axis's range (log10 units) for bars of ``values``: from the decade at or below the smallest
    positive value (so the shortest bar keeps a visible height) to a little above the largest (room for
    its label); None without a positive value."""
    import math

    v = [float(x) for x in values if x is not None and x == x and float(x) > 0]
    if not v:
        return None
    lo, hi = math.floor(math.log10(min(v)) - 0.25), math.log10(max(v)) + headroom
    return [lo, max(hi, lo + 1)]


def _slowest_note(totals) -> str:
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


def _slot(i: int, k: int, j: int = 0, parts: int = 1, group: float = 0.8) -> dict:
    """Where bar ``j`` of ``parts`` of engine ``i`` of ``k`` sits in its category (offset and width, in
    category units): the two panels of a split figure place their bars themselves, since plotly's
    grouping counts the bars of both panels together (the share panel's bars came out half as wide)."""
    w = group / k
    gap = 0.06 * w if parts > 1 else 0.0
    return {"offset": -group / 2 + i * w + j * w / parts + gap / 2, "width": w / parts - gap}


def _split_subplots():
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
SPLIT_TITLE = "Each engine's own time, split: prefill (solid) and decode (hatched), % of prefill + decode"
SECONDS_TITLE = "The same phases in seconds (log scale: each gridline is 10 times the one below)"


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
    med = _shares(context_medians(df))
    lengths = sorted(med["prompt_tokens"].unique())
    cats = [str(int(n)) for n in lengths]
    fig = _split_subplots()
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
                **_slot(i, len(order)),
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
                **_slot(i, len(order), ("prefill", "decode").index(phase), 2),
                y=m[f"{phase}_s"].to_numpy(),
                hovertemplate=(
                    f"<b>{engine}</b> · {phase}<br>prompt %{{customdata[0]:.0f}} tokens<br>"
                    f"{phase}: %{{y:.3f}} s (median of %{{customdata[2]}})<br>{extra}<extra></extra>"
                ),
                **look,
            )
    n_out = int(med["output_tokens"].median())
    longest = med[med["prompt_tokens"] == lengths[-1]].set_index("engine")["total_s"]
    note = _slowest_note(longest)
    note = f"; at {int(lengths[-1])} prompt tokens {note}" if note else ""
    fig.update_layout(
        barmode="overlay",
        template="plotly_white",
        legend_title_text="engine · phase",
        uniformtext=dict(minsize=9, mode="hide"),
        height=720,
        title=title
        or (
            "Where the time goes in each engine: read its split on top, its seconds below"
            f"<br><sup>prefill of the prompt (solid), decode of {n_out} output tokens (hatched), medians{note}</sup>"
        ),
    )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=cats)
    fig.update_xaxes(title_text="prompt length (tokens)", row=BOTTOM, col=1)
    fig.update_yaxes(title_text="share of its time", tickformat=".0%", range=[0, 1], row=TOP, col=1)
    rng = _log_range(med[["prefill_s", "decode_s"]].to_numpy().ravel(), headroom=0.15)
    ticks = log_ticks([10 ** rng[0], 10 ** rng[1]]) if rng else {"type": "log"}
    fig.update_yaxes(title_text="time (s, log)", range=rng, **ticks, row=BOTTOM, col=1)
    return fig


def context_lines(df, title: str | None = None) -> go.Figure:
    """Two panels against prompt length (log x): prefill tokens/s and TPOT in ms; one line per engine,
    medians with min-max error bars; both y axes logarithmic.

    Why log y: the engines differ by up to 100x here (MLX on Linux against llama.cpp), and on a linear
    axis the fast engines' lines lie flat on the slow one's scale, or the slow one's on the floor. On a
    log axis every engine's line keeps its shape, and the lesson is in the shape: prefill tokens/s
    levelling off and falling as attention grows with the square of the prompt, TPOT creeping up as the
    KV cache grows; the same ratio is the same height for every engine, so slopes compare directly.

    Needs: engine, prompt_tokens, prefill_tps, tpot_s (context rows). TPOT is None for
    one-token outputs: such points are left out.
    """
    from plotly.subplots import make_subplots

    med = context_medians(df)
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=("Prefill speed (compute-bound)", "Decode: time per output token"),
    )
    for engine in engine_order(med):
        m = med[med["engine"] == engine]
        for col, (key, unit, fmt) in enumerate((("prefill_tps", "tokens/s", ".1f"), ("tpot_ms", "ms", ".2f")), 1):
            y = m[key].to_numpy(dtype=float)
            fig.add_scatter(
                row=1,
                col=col,
                x=m["prompt_tokens"].to_numpy(),
                y=y,
                mode="lines+markers",
                name=engine,
                legendgroup=engine,
                showlegend=col == 1,
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
                    f"<b>{engine}</b><br>prompt %{{x}} tokens<br>%{{y:{fmt}}} {unit} "
                    "(median of %{customdata[0]})<extra></extra>"
                ),
            )
    lengths = sorted(med["prompt_tokens"].unique())
    fig.update_xaxes(
        type="log", title_text="prompt length (tokens)", tickvals=lengths, ticktext=[str(int(n)) for n in lengths]
    )
    spans = {key: med[[key, f"{key}_min", f"{key}_max"]].to_numpy().ravel() for key in ("prefill_tps", "tpot_ms")}
    fig.update_yaxes(title_text="prefill (tokens/s, log)", **log_ticks(spans["prefill_tps"]), row=1, col=1)
    fig.update_yaxes(title_text="TPOT (ms, log)", **log_ticks(spans["tpot_ms"]), row=1, col=2)
    fig.update_layout(
        template="plotly_white",
        legend_title_text="engine",
        title=title
        or (
            "Prefill speed and decode time per token against prompt length (medians)"
            "<br><sup>log scales: read each engine's slope, the same ratio is the same height for every engine</sup>"
        ),
    )
    return fig


# --- concurrency sweep --------------------------------------------------------------------------
def concurrency_lines(df, facet_by: str | None = None, title: str | None = None) -> go.Figure:
    """Three panels against concurrency (log x): run output tokens/s, TTFT p50 and TTFT p95 (ms,
    shared y axis); one line per engine and mode, serial dashed, batched solid; every y axis logarithmic.

    Why log y: the engines' throughputs and TTFTs differ by up to 100x (MLX on Linux against
    llama.cpp), and on a linear axis the slowest engine sets the scale and flattens the others, whose
    batching gain and queueing then cannot be read. The questions the figure answers are ratios (does
    batching multiply throughput? how many times does TTFT p95 grow with the clients?), and on a log axis
    an equal ratio is an equal height for every engine, so each engine's lines are read by their slope.

    Needs: run_id, engine, mode, concurrency, output_tokens, t_submit, t_last_token, ttft_s
    (concurrency rows: ``sweep == "concurrency"``). ``facet_by`` ("hostname" or "cpu_model") puts
    each machine on its own row of panels, with matched y axes, so machines compare directly.
    """
    from plotly.subplots import make_subplots

    d = nonempty(
        sweep_rows(df, "concurrency"),
        "concurrency figure",
        "run lablib.measure.sweep.concurrency_sweep(...) or load a results file with concurrency rows",
    )
    if facet_by is not None:
        if facet_by not in FACETS:
            raise LabError(f"facet_by={facet_by!r}: expected None, 'hostname' or 'cpu_model'")
        need(d, [facet_by], "concurrency_lines(facet_by=...)")
    summ = concurrency_summary(d, facet_by)
    facets = list(dict.fromkeys(summ[facet_by])) if facet_by else [None]
    fig = make_subplots(
        rows=len(facets),
        cols=3,
        horizontal_spacing=0.09,
        vertical_spacing=0.12 if len(facets) > 1 else 0.1,
        subplot_titles=[t for _ in facets for t in ("Output tokens/s of the run", "TTFT p50", "TTFT p95")],
        row_titles=[str(f) for f in facets] if facet_by else None,
    )
    panels = (
        ("output_tps", 1.0, "tokens/s", ".1f"),
        ("ttft_p50_s", 1000.0, "ms", ".0f"),
        ("ttft_p95_s", 1000.0, "ms", ".0f"),
    )
    shown = set()
    for row, facet in enumerate(facets, 1):
        s = summ[summ[facet_by] == facet] if facet_by else summ
        for engine in engine_order(s):
            for mode in mode_order(s[s["engine"] == engine]):
                m = s[(s["engine"] == engine) & (s["mode"] == mode)].sort_values("concurrency")
                name = f"{engine} · {mode}"
                for col, (key, scale, unit, fmt) in enumerate(panels, 1):
                    fig.add_scatter(
                        row=row,
                        col=col,
                        x=m["concurrency"].to_numpy(),
                        y=m[key].to_numpy(dtype=float) * scale,
                        mode="lines+markers",
                        name=name,
                        legendgroup=name,
                        showlegend=name not in shown,
                        line=dict(color=color(engine), dash=mode_dash(mode), width=2),
                        marker=dict(color=color(engine), size=8, symbol="circle" if mode == "batched" else "square"),
                        customdata=m[["requests", "runs"]].to_numpy(),
                        hovertemplate=(
                            f"<b>{engine}</b> · {mode}<br>concurrency %{{x}}<br>%{{y:{fmt}}} {unit}"
                            "<br>%{customdata[0]} requests in %{customdata[1]} run(s)<extra></extra>"
                        ),
                    )
                    shown.add(name)
    levels = sorted(summ["concurrency"].unique())
    fig.update_xaxes(type="log", tickvals=levels, ticktext=[str(int(c)) for c in levels])
    fig.update_xaxes(title_text="concurrency (clients)", row=len(facets))
    # one set of ticks per metric, over every machine's values (the panels of a metric share their scale)
    tps_ticks = log_ticks(summ["output_tps"].to_numpy(dtype=float))
    ttft_ticks = log_ticks(1000.0 * summ[["ttft_p50_s", "ttft_p95_s"]].to_numpy(dtype=float).ravel())
    for row in range(1, len(facets) + 1):
        fig.update_yaxes(title_text="output (tokens/s, log)", **tps_ticks, row=row, col=1)
        fig.update_yaxes(title_text="TTFT (ms, log)", **ttft_ticks, row=row, col=2)
        fig.update_yaxes(**ttft_ticks, row=row, col=3)
        # TTFT p50 and p95 on one scale; each metric on one scale across machines
        for col in (1, 2, 3):
            axis = fig.get_subplot(row, col).yaxis
            ref = fig.get_subplot(1, 2 if col == 3 else col).yaxis.plotly_name.replace("yaxis", "y")
            if axis.plotly_name.replace("yaxis", "y") != ref:
                axis.matches = ref
    # the legend below the panels: three panels need the whole width
    fig.update_layout(
        template="plotly_white",
        legend_title_text="engine · mode",
        legend=dict(orientation="h", yanchor="top", y=-0.22 / len(facets), x=0),
        margin=dict(b=120),
        height=380 * len(facets) + 140,
        title=title
        or (
            "Concurrency: does batching raise throughput (left) and keep TTFT down (middle, right)?"
            "<br><sup>serial dashed, batched solid; log scales: read each line's slope, the same ratio is the same"
            " height for every engine</sup>"
        ),
    )
    return fig


def _pick_runs(df, mode, concurrency):
    """The rows of one run per (mode, engine): the first run at ``concurrency`` (default: the highest)."""
    d = sweep_rows(df, "concurrency")
    if len(d) == 0:
        d = ok_rows(df)
    d = nonempty(d, "timeline", "run lablib.measure.sweep.concurrency_sweep(...) first")
    need(d, ["engine", "mode", "concurrency", *CLOCKS], "timeline")
    if mode is not None:
        if mode not in set(d["mode"]):
            raise LabError(f"timeline: mode={mode!r} is not in the data (modes: {', '.join(mode_order(d))})")
        d = d[d["mode"] == mode]
    levels = sorted(int(c) for c in d["concurrency"].unique())
    if concurrency is None:
        concurrency = levels[-1]
    elif int(concurrency) not in levels:
        raise LabError(f"timeline: concurrency={concurrency} is not in the data (levels: {levels})")
    d = d[d["concurrency"] == int(concurrency)]
    run_key = "run_id" if "run_id" in d.columns else None
    picked = {}
    for m in mode_order(d):
        for engine in engine_order(d[d["mode"] == m]):
            r = d[(d["mode"] == m) & (d["engine"] == engine)]
            if run_key:
                r = r[r[run_key] == r[run_key].iloc[0]]
            picked[(m, engine)] = r
    return picked, int(concurrency)


def timeline(df, mode: str | None = None, concurrency: int | None = None, title: str | None = None) -> go.Figure:
    """Request timeline: one panel per engine (columns) and mode (rows); one bar row per request
    in arrival order, with segments queue (grey, t_submit→t_start), prefill (solid,
    t_start→t_first_token) and decode (hatched, t_first_token→t_last_token), in seconds since the
    run's first t_submit. One run per panel: the first at ``concurrency`` (default the highest).

    Each panel has its own time axis (small multiples with independent scales): an engine 100x slower
    than another would otherwise squeeze the fast engine's run into a sliver at the left, and what the
    figure shows is the *shape* of each run (a staircase of queueing, or overlapping bars), which needs
    the whole width. The seconds are in each panel's title and on its axis.

    Needs: engine, mode, concurrency, t_submit, t_start, t_first_token, t_last_token (run_id to tell
    runs apart; request_index, prompt_tokens, output_tokens for hover).
    """
    from plotly.subplots import make_subplots

    picked, conc = _pick_runs(df, mode, concurrency)
    modes = list(dict.fromkeys(m for m, _ in picked))
    engines = list(dict.fromkeys(e for _, e in picked))
    titles = []
    for m in modes:
        for e in engines:
            r = picked.get((m, e))
            if r is None:
                titles.append(f"{e} · {m}: no run")
            else:
                span = float(r["t_last_token"].max() - r["t_submit"].min())
                titles.append(f"{e} · {m}: {len(r)} requests in {span:.2f} s")
    n_max = max(len(r) for r in picked.values())
    row_px = 110 + 24 * n_max
    height = 130 + len(modes) * row_px
    fig = make_subplots(
        rows=len(modes),
        cols=len(engines),
        subplot_titles=titles,
        horizontal_spacing=0.06,
        vertical_spacing=min(0.3, 100 / height) if len(modes) > 1 else 0.1,
    )
    labels = {"queue": "queue (waiting)", "prefill": "prefill (solid)", "decode": "decode (hatched)"}
    for phase in ("queue", "prefill", "decode"):  # legend entries in a neutral color: engines keep theirs
        fig.add_bar(
            row=1,
            col=1,
            orientation="h",
            x=[None],
            y=[None],
            name=labels[phase],
            legendgroup=phase,
            marker_color=QUEUE_COLOR if phase == "queue" else LEGEND_COLOR,
            marker_opacity=1.0 if phase == "queue" else PHASE_OPACITY[phase],
            marker_pattern_shape="" if phase == "queue" else PHASE_PATTERN[phase],
            hoverinfo="skip",
        )
    for (m, e), r in picked.items():
        row, col = modes.index(m) + 1, engines.index(e) + 1
        seg = timeline_segments(r)
        y = list(range(len(seg)))
        for phase in ("queue", "prefill", "decode"):
            start, end = seg[f"{phase}_start"].to_numpy(), seg[f"{phase}_end"].to_numpy()
            custom = (
                seg[["request_index"]]
                .assign(p=seg.get("prompt_tokens", 0), o=seg.get("output_tokens", 0), s=start, e=end)
                .to_numpy()
            )
            fig.add_bar(
                row=row,
                col=col,
                orientation="h",
                y=y,
                x=end - start,
                base=start,
                name=f"{e} · {phase}",
                legendgroup=phase,
                showlegend=False,
                marker_color=QUEUE_COLOR if phase == "queue" else color(e),
                marker_opacity=1.0 if phase == "queue" else PHASE_OPACITY[phase],
                marker_pattern_shape="" if phase == "queue" else PHASE_PATTERN[phase],
                customdata=custom,
                hovertemplate=(
                    f"<b>{e}</b> · {m} · request %{{customdata[0]}}<br>{phase}: %{{customdata[3]:.3f}} → "
                    "%{customdata[4]:.3f} s (%{x:.3f} s)<br>prompt %{customdata[1]} tokens, "
                    "output %{customdata[2]} tokens<extra></extra>"
                ),
            )
        fig.update_yaxes(
            row=row,
            col=col,
            autorange="reversed",
            tickvals=y,
            ticktext=[f"req {int(i)}" for i in seg["request_index"]],
            title_text=f"{m}: arrival order" if col == 1 else None,
        )
        fig.update_xaxes(
            row=row,
            col=col,
            rangemode="tozero",
            title_text="time since first submit (s)" if row == len(modes) else None,
        )
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        template="plotly_white",
        legend_title_text="phase",
        height=height,
        title=title
        or (
            f"Request timeline at concurrency {conc}: does a request wait (grey) for the ones before it?"
            "<br><sup>each panel on its own time axis: compare the shapes, read the seconds in its title</sup>"
        ),
    )
    fig.update_annotations(font_size=12)  # the panels' titles, three or more side by side
    return fig


# --- one-engine-run figure (lab 01) ---------------------------------------------------------------
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
    med = _shares(engine_medians(df))
    engines = list(med.index)
    colors = [color(e) for e in engines]
    fig = _split_subplots()
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
            **_slot(0, 1, group=0.6),
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
            **_slot(0, 1, ("prefill", "decode").index(phase), 2, group=0.6),
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
    note = _slowest_note(med["total_s"])
    fig.update_layout(
        barmode="overlay",
        template="plotly_white",
        legend_title_text="phase",
        uniformtext=dict(minsize=9, mode="hide"),
        height=720,
        title=title
        or (
            "Where the time goes in each engine: read its split on top, its seconds below"
            f"<br><sup>prefill of {n_in} prompt tokens (solid), decode of {n_out} output tokens (hatched), medians"
            f"{'; ' + note if note else ''}</sup>"
        ),
    )
    fig.update_xaxes(title_text="engine", row=BOTTOM, col=1)
    fig.update_yaxes(title_text="share of its time", tickformat=".0%", range=[0, 1], row=TOP, col=1)
    rng = _log_range(med[["prefill_s", "decode_s"]].to_numpy().ravel())
    ticks = log_ticks([10 ** rng[0], 10 ** rng[1]]) if rng else {"type": "log"}
    fig.update_yaxes(title_text="time (s, log)", range=rng, **ticks, row=BOTTOM, col=1)
    return fig
