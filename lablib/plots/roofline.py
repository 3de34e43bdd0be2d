"""Roofline figures: pure plotly functions of tidy rows (no engine, no measurement).

:func:`roofline` draws measured rows that carry :data:`lablib.results.schema.BOUND_COLUMNS`
(:func:`lablib.studies.roofline.add_bound_columns`): log-log, arithmetic intensity (FLOP/byte) across, FLOP/s
attained up; the machine's ceilings are the bandwidth slope (intensity x bytes/s) and one flat roof per
compute type, meeting at the ridge (intensity = peak / bandwidth). :func:`batch_figure` draws a
:func:`lablib.studies.roofline.batch_sweep` table, with measured concurrency runs when given.
"""

from __future__ import annotations

import math

from lablib.errors import LabError
from lablib.plots.style import color, engine_order, log_ticks, titled
from lablib.results.tables import need as _need, nonempty as _nonempty, ok_rows as _ok

PHASE_SYMBOL = {"prefill": "circle", "decode": "diamond-open"}
DTYPE_DASH = {"float32": "solid", "bfloat16": "dash", "int8": "dot"}


def _ceilings(d) -> tuple[float, dict]:
    """(bandwidth bytes/s, {dtype: FLOP/s}) of the rows: medians per compute type."""
    bw = float(d["bound_bytes_per_s"].median())
    roofs = {str(k): float(v) for k, v in d.groupby("compute_dtype")["bound_flop_per_s"].median().items()}
    return bw, roofs


def roofline(df, title: str | None = None):
    """Log-log roofline with each engine's measured prefill (filled circles) and decode (open diamonds),
    one point per engine, phase and prompt length (medians over repetitions), in the engine's color.

    Needs: engine, prompt_tokens, compute_dtype, bound_bytes_per_s, bound_flop_per_s, prefill_intensity,
    prefill_flop_per_s, decode_intensity, decode_flop_per_s (and *_pct_of_bound for the hover).
    """
    import numpy as np
    import plotly.graph_objects as go

    cols = [
        "engine",
        "prompt_tokens",
        "compute_dtype",
        "bound_bytes_per_s",
        "bound_flop_per_s",
        "prefill_intensity",
        "prefill_flop_per_s",
        "decode_intensity",
        "decode_flop_per_s",
        "prefill_pct_of_bound",
        "decode_pct_of_bound",
    ]
    d = _nonempty(
        _ok(df), "roofline", "add the bound columns first: lablib.studies.roofline.add_bound_columns(df, model)"
    )
    _need(d, cols, "roofline")
    if "machine" in d.columns and d["machine"].nunique() > 1:  # one machine's ceilings per figure
        raise LabError(
            f"roofline: rows of {d['machine'].nunique()} machines ({', '.join(map(str, d['machine'].unique()))}); "
            "a roofline draws one machine's ceilings: give one machine's rows (df[df.machine == ...])"
        )
    bw, roofs = _ceilings(d)
    keys = ["engine", "prompt_tokens"] + (["decode_batch"] if "decode_batch" in d.columns else [])
    med = d.groupby(keys, sort=False)[[c for c in cols[5:]]].median().reset_index()
    x_all = np.concatenate([med["prefill_intensity"], med["decode_intensity"], [r / bw for r in roofs.values()]])
    x_all = x_all[np.isfinite(x_all) & (x_all > 0)]
    lo, hi = x_all.min() / 3, x_all.max() * 3
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig = go.Figure()
    for dtype, peak in sorted(roofs.items(), key=lambda kv: -kv[1]):
        fig.add_scatter(
            x=xs,
            y=np.minimum(peak, xs * bw),
            mode="lines",
            name=f"roof: {dtype} {peak / 1e9:.0f} GFLOP/s",
            line=dict(color="#444444", dash=DTYPE_DASH.get(dtype, "dashdot"), width=1.5),
            hovertemplate=(
                f"{dtype} roof<br>intensity %{{x:.2f}} FLOP/byte<br>bound %{{y:.3s}}FLOP/s"
                f"<br>ridge at {peak / bw:.1f} FLOP/byte<extra></extra>"
            ),
        )
    fig.add_scatter(
        x=[lo, hi],
        y=[lo * bw, hi * bw],
        mode="lines",
        line=dict(color="#999999", width=0.8),
        name=f"memory bandwidth {bw / 1e9:.1f} GB/s",
        hoverinfo="skip",
        visible="legendonly",
    )
    for engine in engine_order(med):
        m = med[med["engine"] == engine]
        for phase in ("prefill", "decode"):
            fig.add_scatter(
                x=m[f"{phase}_intensity"],
                y=m[f"{phase}_flop_per_s"],
                mode="markers",
                name=f"{engine} · {phase}",
                legendgroup=engine,
                marker=dict(
                    symbol=PHASE_SYMBOL[phase], size=11, color=color(engine), line=dict(width=2, color=color(engine))
                ),
                customdata=np.stack([m["prompt_tokens"], m[f"{phase}_pct_of_bound"]], axis=1),
                hovertemplate=(
                    f"{engine} · {phase}<br>prompt %{{customdata[0]:.0f}} tokens<br>intensity "
                    "%{x:.2f} FLOP/byte<br>attained %{y:.3s}FLOP/s<br>%{customdata[1]:.0f} % of the "
                    "bound<extra></extra>"
                ),
            )
    titled(
        fig,
        title or "Roofline: measured prefill and decode against this machine's ceilings",
        x="arithmetic intensity (FLOP per byte of memory traffic)",
        y="attained FLOP/s",
        legend_title_text="",
        # tall enough for the legend's roofs and every engine's two phases (9 entries for 3 engines): a shorter
        # figure scrolls its legend, and the last engine's points are left without a name
        height=max(480, 300 + 22 * (len(fig.data) + len(engine_order(med)))),
    )
    # ticks written out in full (2G, 5G, 10G; 0.5, 1, 2): plotly's own put a bare "2" and "5" between the decades
    y_all = np.concatenate([med["prefill_flop_per_s"], med["decode_flop_per_s"], [lo * bw], list(roofs.values())])
    fig.update_xaxes(**log_ticks([lo, hi], max_ticks=12))
    return fig.update_yaxes(**log_ticks(y_all))


STEP_PARTS = (  # (column, label, color) of step_figure's bars, in milliseconds per decode step
    ("tpot_ms", "measured: one decode step", None),
    ("roof_ms", "bytes ÷ bandwidth, FLOPs ÷ peak (the roofline)", "#9e9e9e"),
    ("floor_ms", "launch floor (the model's skeleton)", "#424242"),
)


def step_figure(df, title: str | None = None):
    """Where a decode step's time goes, per engine: the measured step (median TPOT, ms) beside the least time the
    roofline allows its bytes and FLOPs (``decode_roof_s``) and the engine's launch floor (``launch_floor_s``:
    :mod:`lablib.studies.launch_floor`), medians over the rows of each engine; horizontal bars. An engine whose
    floor is near its measured step is bound by launches: more bandwidth would not make it faster. Rows with a
    ``machine`` column of several values (:func:`lablib.results.reference.beside`) get one group per engine and
    machine, each against its own machine's roof and floor.

    Needs: engine, tpot_s, decode_roof_s, launch_floor_s (rows of
    :func:`lablib.studies.roofline.add_bound_columns`)."""
    import plotly.graph_objects as go

    d = _nonempty(
        _ok(df), "step_figure", "add the bound columns first: lablib.studies.roofline.add_bound_columns(df, model)"
    )
    _need(d, ["engine", "tpot_s", "decode_roof_s", "launch_floor_s"], "step_figure")
    # rows of several machines (a learner's beside a reference: lablib.results.reference.beside): one bar group per
    # engine and machine, each against its own machine's roof and floor
    machines = list(dict.fromkeys(d["machine"])) if "machine" in d.columns else []
    keys = ["engine", "machine"] if len(machines) > 1 else ["engine"]
    med = d.groupby(keys, sort=False)[["tpot_s", "decode_roof_s", "launch_floor_s"]].median()
    med = 1e3 * med.rename(columns={"tpot_s": "tpot_ms", "decode_roof_s": "roof_ms", "launch_floor_s": "floor_ms"})
    engines = [e for e in engine_order(med.reset_index()) if e in med.index.get_level_values("engine")]
    groups = [(e, m) for m in machines for e in engines if (e, m) in med.index] if len(keys) > 1 else engines
    groups = groups[::-1]  # the first on top
    labels = [f"{g[0]}<br>{g[1]}" if len(keys) > 1 else g for g in groups]
    fig = go.Figure()
    for col, label, fixed in STEP_PARTS:
        fig.add_bar(
            y=labels,
            x=[med.loc[g, col] for g in groups],
            orientation="h",
            name=label,
            marker_color=[fixed or color(g[0] if len(keys) > 1 else g) for g in groups],
            hovertemplate=f"%{{y}}<br>{label}<br>%{{x:.2f}} ms<extra></extra>",
        )
    titled(
        fig,
        title or "One decode step: measured, what the bytes allow, and the engine's launch floor",
        x="milliseconds per decode step (less is faster)",
        y="",
        barmode="group",
        height=200 + 90 * len(groups),
        legend_title_text="",
    )
    return fig.update_yaxes(categoryorder="array", categoryarray=labels)


def batch_figure(sweep_df, measured=None, title: str | None = None):
    """Predicted decode tokens/s (all sequences) against batch size, log-log, from a
    :func:`lablib.studies.roofline.batch_sweep` table; a vertical line at its crossover batch (``attrs``).
    ``measured`` (optional): rows of :func:`lablib.results.tables.run_table` (engine, mode, concurrency,
    output_tps) drawn as points, batched runs only."""
    import plotly.graph_objects as go

    _need(sweep_df, ["batch", "decode_tps_total", "bound"], "batch_figure", "lablib.studies.roofline.batch_sweep")
    engine = sweep_df.attrs.get("engine") or "predicted"
    fig = go.Figure()
    fig.add_scatter(
        x=sweep_df["batch"],
        y=sweep_df["decode_tps_total"],
        mode="lines+markers",
        name=f"{engine}: roofline bound",
        line=dict(color=color(engine)),
        customdata=sweep_df[["bound"]].to_numpy(),
        hovertemplate="batch %{x}<br>%{y:.0f} tokens/s in all<br>%{customdata[0]}-bound<extra></extra>",
    )
    cross = sweep_df.attrs.get("crossover")
    values = {"x": list(sweep_df["batch"]), "y": list(sweep_df["decode_tps_total"])}
    if cross and cross != float("inf"):
        # the line, and its label beside it: an annotation's x on a log axis is log10 of the value (add_vline's own
        # annotation would sit at 10^cross batches, far right, and stretch the axis to it)
        fig.add_vline(x=cross, line_dash="dash", line_color="#777777")
        fig.add_annotation(
            x=math.log10(cross),
            y=0,
            yref="paper",
            text=f"crossover batch {cross:.1f}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",  # below the bound's plateau, which the line meets near the top
            xshift=4,
        )
    if measured is not None and len(measured):
        _need(
            measured,
            ["engine", "mode", "concurrency", "output_tps"],
            "batch_figure measured points",
            "lablib.run_table of a concurrency sweep",
        )
        m = measured[(measured["mode"] == "batched") & (measured["engine"] == engine)]
        if len(m):
            values["y"] += list(m["output_tps"])
            fig.add_scatter(
                x=m["concurrency"],
                y=m["output_tps"],
                mode="markers",
                name=f"{engine}: measured (batched)",
                marker=dict(size=11, color=color(engine), symbol="x"),
                hovertemplate="concurrency %{x}<br>%{y:.0f} output tokens/s<extra></extra>",
            )
    titled(
        fig,
        title or f"Decode against batch size on {sweep_df.attrs.get('machine', 'the machine')}",
        x="sequences decoded together (batch size)",
        y="decode tokens/s, all sequences",
    )
    fig.update_xaxes(**log_ticks(values["x"], max_ticks=10))  # 1, 2, 5, 10 ... written out, not a bare "2" or "5"
    return fig.update_yaxes(**log_ticks(values["y"]))
