"""Figures of the quantization ladder (plotly), from the rows of :mod:`lablib.studies.ladder`.

Each function takes a pandas DataFrame of ladder rows (``lablib.results.store.load_results`` or
``pd.DataFrame(run_ladder(...))``) and returns a ``plotly.graph_objects.Figure``. Every figure is
"relative to the dequantized Q4_1 reference" (the rows' ``reference`` column says which).
"""

from __future__ import annotations

from lablib.plots.style import ENGINE_SYMBOL
from lablib.results.tables import need, nonempty

LADDER_ROWS = "lablib.studies.ladder.run_ladder or `lablib quantize --out FILE`"


def _need(df, cols, what):
    """The ladder rows' check: rows (:func:`lablib.results.tables.nonempty`), and the columns ``cols``
    (:func:`lablib.results.tables.need`)."""
    need(nonempty(df, what, f"expected ladder rows from {LADDER_ROWS}"), cols, what, LADDER_ROWS)


def _title(df, text):
    ref = df["reference"].dropna().iloc[0] if "reference" in df and df["reference"].notna().any() else "reference"
    return f"{text}<br><sup>relative to the {ref}</sup>"


def _scatter(df, x, y, what, xlog=True, ylog=False):
    import plotly.graph_objects as go

    fig = go.Figure()
    for eng, d in df.groupby("engine", sort=False):
        fig.add_trace(
            go.Scatter(
                x=d[x],
                y=d[y],
                mode="markers+text",
                name=eng,
                text=d["type"],
                textposition="top center",
                marker={"size": 10, "symbol": ENGINE_SYMBOL.get(eng, "circle")},
            )
        )
    fig.update_xaxes(type="log" if xlog else "linear")
    fig.update_yaxes(type="log" if ylog else "linear")
    return fig


def pareto_front(df, x: str, y: str, higher_is_better: bool):
    """Rows on the Pareto front of smaller ``x`` and better ``y`` (sorted by ``x``)."""
    d = df.sort_values(x)
    best, keep = None, []
    for i, v in zip(d.index, d[y]):
        if best is None or (v > best if higher_is_better else v < best):
            keep.append(i)
            best = v
    return d.loc[keep]


def quality_vs_size(df, metric: str = "kl_mean"):
    """KL divergence (or another quality column) against file bytes, log-log, front drawn."""
    import plotly.graph_objects as go

    _need(df, ["bytes", metric, "type", "engine"], "quality vs size")
    d = df[df[metric] > 0] if metric.startswith("kl") else df
    fig = _scatter(d, "bytes", metric, "quality", ylog=metric.startswith("kl"))
    front = pareto_front(d, "bytes", metric, higher_is_better=metric == "top1")
    fig.add_trace(
        go.Scatter(
            x=front["bytes"], y=front[metric], mode="lines", name="Pareto front", line={"dash": "dot", "color": "gray"}
        )
    )
    fig.update_layout(
        title=_title(df, f"{metric} against size (lower-left is better)"),
        xaxis_title="bytes (weights file)",
        yaxis_title=f"{metric} (nats)" if metric.startswith("kl") else metric,
    )
    return fig


def speed_vs_size(df, metric: str = "decode_tps"):
    """Decode (or prefill) tokens/s against bytes, with the Pareto front of small and fast."""
    import plotly.graph_objects as go

    _need(df, ["bytes", metric, "type", "engine"], "speed vs size")
    d = df.dropna(subset=[metric])
    fig = _scatter(d, "bytes", metric, "speed")
    front = pareto_front(d, "bytes", metric, higher_is_better=True)
    fig.add_trace(
        go.Scatter(
            x=front["bytes"], y=front[metric], mode="lines", name="Pareto front", line={"dash": "dot", "color": "gray"}
        )
    )
    fig.update_layout(
        title=_title(df, f"{metric} against size (upper-left is better; shared CPU: noisy)"),
        xaxis_title="bytes (weights file)",
        yaxis_title=f"{metric} (tokens/s)",
    )
    return fig


def type_mix(df):
    """Stacked bars: the share of weights each GGML type holds in each llama.cpp file (the K-quant
    fallback on rows of 576 shows here)."""
    import json

    import plotly.graph_objects as go

    _need(df, ["tensor_types", "type"], "tensor-type mix")
    d = df.dropna(subset=["tensor_types"]).drop_duplicates("type")
    shares: dict[str, dict] = {}
    for _, r in d.iterrows():
        groups = json.loads(r["tensor_types"]) if isinstance(r["tensor_types"], str) else r["tensor_types"]
        n = sum(g["n_elements"] for g in groups)
        for g in groups:
            shares.setdefault(g["type"], {})[r["type"]] = 100 * g["n_elements"] / n
    fig = go.Figure([go.Bar(name=t, x=list(d["type"]), y=[s.get(x, 0) for x in d["type"]]) for t, s in shares.items()])
    fig.update_layout(
        barmode="stack",
        title="What each file really holds: share of weights per tensor type",
        xaxis_title="requested type (llama.cpp ftype)",
        yaxis_title="% of weights",
    )
    return fig


def decode_vs_bytes_per_token(df):
    """Decode tokens/s against the weight bytes read per decoded token (all weights, once: a
    memory-bound decode follows tokens/s ≈ bandwidth / bytes per token)."""
    _need(df, ["bytes_per_token", "decode_tps", "type", "engine"], "decode vs bytes per token")
    d = df.dropna(subset=["decode_tps"])
    fig = _scatter(d, "bytes_per_token", "decode_tps", "decode", xlog=True, ylog=True)
    fig.update_layout(
        title="decode tokens/s against bytes read per token (shared CPU: noisy)",
        xaxis_title="weight bytes read per decoded token",
        yaxis_title="decode tokens/s",
    )
    return fig
