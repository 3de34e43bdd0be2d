"""Figures of the concurrency sweep (lab 03): throughput and TTFT against the clients, and one run's request
timeline (queue, prefill, decode per request). Pure functions of concurrency rows (``sweep == "concurrency"``;
numbers from :mod:`lablib.results.tables`); rows with an ``error`` are left out; each returns a
``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import (
    LEGEND_COLOR,
    PHASE_OPACITY,
    PHASE_PATTERN,
    QUEUE_COLOR,
    color,
    engine_order,
    facet_spacing,
    log_ticks,
    match_y,
    mode_dash,
    mode_order,
)
from lablib.results.schema import CLOCKS, FACETS
from lablib.results.tables import (
    concurrency_summary,
    facet_rows,
    need,
    nonempty,
    ok_rows,
    sweep_rows,
    timeline_segments,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go


def concurrency_lines(df, facet_by: str | None = None, title: str | None = None) -> go.Figure:
    """Three panels against concurrency (log x): run output tokens/s, TTFT p50 and TTFT p95 (ms,
    shared y axis); one line per engine and mode, serial dashed, batched solid; every y axis logarithmic.

    Why log y: the engines' throughputs and TTFTs differ by up to 100x (MLX on Linux against
    llama.cpp), and on a linear axis the slowest engine sets the scale and flattens the others, whose
    batching gain and queueing then cannot be read. The questions the figure answers are ratios (does
    batching multiply throughput? how many times does TTFT p95 grow with the clients?), and on a log axis
    an equal ratio is an equal height for every engine, so each engine's lines are read by their slope.

    Needs: run_id, engine, mode, concurrency, output_tokens, t_submit, t_last_token, ttft_s
    (concurrency rows: ``sweep == "concurrency"``). ``facet_by`` ("hostname", "cpu_model" or "machine": a
    learner's rows beside a reference, :func:`lablib.results.reference.beside`; for rows without that column, a
    room's files, each row's :func:`lablib.results.tables.machine_names`, which tells apart machines of one
    hostname) puts each machine on its own row of panels, with matched y axes, so machines compare directly.
    """
    from plotly.subplots import make_subplots

    d = nonempty(
        sweep_rows(df, "concurrency"),
        "concurrency figure",
        "run lablib.measure.sweep.concurrency_sweep(...) or load a results file with concurrency rows",
    )
    if facet_by is not None:
        if facet_by not in FACETS:
            raise LabError(f"facet_by={facet_by!r}: expected None or one of {', '.join(map(repr, FACETS))}")
        d = facet_rows(d, facet_by, "concurrency_lines(facet_by=...)")
    summ = concurrency_summary(d, facet_by)
    facets = list(dict.fromkeys(summ[facet_by])) if facet_by else [None]
    fig = make_subplots(
        rows=len(facets),
        cols=3,
        horizontal_spacing=0.09,
        vertical_spacing=facet_spacing(len(facets), 0.12),
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
    match_y(fig, len(facets), 3, like=lambda col: 2 if col == 3 else col)
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
