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


def context_bars(df, title: str | None = None) -> go.Figure:
    """Stacked prefill (solid) and decode (hatched) bars: median seconds per engine, side by side,
    grouped by prompt length.

    Needs: engine, prompt_tokens, output_tokens, prefill_s, decode_s (context rows: ``sweep ==
    "context"``, or no ``sweep`` column). Bar heights are the medians over repetitions.
    """
    import plotly.graph_objects as go

    med = context_medians(df)
    lengths = sorted(med["prompt_tokens"].unique())
    fig = go.Figure()
    for engine in engine_order(med):
        m = med[med["engine"] == engine]
        x = [str(int(n)) for n in m["prompt_tokens"]]
        custom = m[["prompt_tokens", "output_tokens", "n", "prefill_tps", "tpot_ms"]].to_numpy()
        for phase in ("prefill", "decode"):
            extra = (
                "prefill %{customdata[3]:.1f} tokens/s"
                if phase == "prefill"
                else "%{customdata[1]:.0f} output tokens, TPOT %{customdata[4]:.1f} ms"
            )
            fig.add_bar(
                name=f"{engine} · {phase}",
                legendgroup=engine,
                offsetgroup=engine,
                x=x,
                y=m[f"{phase}_s"].to_numpy(),
                base=m["prefill_s"].to_numpy() if phase == "decode" else None,
                marker_color=color(engine),
                marker_opacity=PHASE_OPACITY[phase],
                marker_pattern_shape=PHASE_PATTERN[phase],
                customdata=custom,
                hovertemplate=(
                    f"<b>{engine}</b> · {phase}<br>prompt %{{customdata[0]:.0f}} tokens<br>"
                    f"{phase}: %{{y:.3f}} s (median of %{{customdata[2]}})<br>{extra}<extra></extra>"
                ),
            )
    n_out = int(med["output_tokens"].median())
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        legend_title_text="engine · phase",
        title=title or f"Where the time goes: prefill (solid) and decode of {n_out} tokens (hatched), median",
        xaxis_title="prompt length (tokens)",
        yaxis_title="time (s)",
    )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[str(int(n)) for n in lengths])
    return fig


def context_lines(df, title: str | None = None) -> go.Figure:
    """Two panels against prompt length (log x): prefill tokens/s and TPOT in ms; one line per engine,
    medians with min-max error bars.

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
    fig.update_yaxes(title_text="prefill (tokens/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TPOT (ms)", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        template="plotly_white",
        legend_title_text="engine",
        title=title or "Prefill speed and decode time per token against prompt length (median)",
    )
    return fig


# --- concurrency sweep --------------------------------------------------------------------------
def concurrency_lines(df, facet_by: str | None = None, title: str | None = None) -> go.Figure:
    """Three panels against concurrency (log x): run output tokens/s, TTFT p50 and TTFT p95 (ms,
    shared y axis); one line per engine and mode, serial dashed, batched solid.

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
    for row in range(1, len(facets) + 1):
        fig.update_yaxes(title_text="output (tokens/s)", rangemode="tozero", row=row, col=1)
        fig.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", row=row, col=2)
        fig.update_yaxes(rangemode="tozero", row=row, col=3)
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
        title=title or "Concurrency: throughput and time to first token (serial dashed, batched solid)",
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
        title=title or f"Request timeline at concurrency {conc}",
    )
    return fig


# --- one-engine-run figure (lab 01) ---------------------------------------------------------------
def prefill_decode_bars(df, title: str | None = None) -> go.Figure:
    """Stacked bars, one per engine side by side: median prefill time and median
    decode time (first to last token) of the requests in ``df``, seconds.

    Needs: engine, prefill_s, decode_s, prompt_tokens, output_tokens."""
    import plotly.graph_objects as go

    med = engine_medians(df)
    engines = list(med.index)
    fig = go.Figure()
    for phase in ("prefill", "decode"):
        pattern = "" if phase == "prefill" else "/"
        fig.add_bar(
            name=phase,
            x=engines,
            y=med[f"{phase}_s"],
            legendgroup=phase,
            showlegend=False,
            marker_color=[color(e) for e in engines],
            marker_opacity=PHASE_OPACITY[phase],
            marker_pattern_shape=pattern,
            customdata=med[["prompt_tokens", "output_tokens"]].to_numpy(),
            hovertemplate=(
                f"<b>%{{x}}</b><br>{phase}: %{{y:.3f}} s<br>prompt %{{customdata[0]:.0f}} tokens, "
                "output %{customdata[1]:.0f} tokens<extra></extra>"
            ),
        )
        # the legend names the phase only (shade and hatching), in a neutral colour: the bars'
        # colour is the engine's, and a legend swatch would take the first engine's
        fig.add_bar(
            name=phase,
            x=[engines[0]],
            y=[None],
            legendgroup=phase,
            hoverinfo="skip",
            marker_color=PHASE_LEGEND_COLOR,
            marker_opacity=PHASE_OPACITY[phase],
            marker_pattern_shape=pattern,
        )
    n_in, n_out = int(med["prompt_tokens"].iloc[0]), int(med["output_tokens"].iloc[0])
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        legend_title_text="phase",
        title=title or f"Prefill ({n_in} prompt tokens) and decode ({n_out} output tokens), median",
        yaxis_title="time (s)",
        xaxis_title="engine",
    )
    return fig
