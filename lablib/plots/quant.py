"""Figures of the quantization ladder (plotly), from the rows of :mod:`lablib.studies.ladder`.

Each function takes a pandas DataFrame of ladder rows (``lablib.results.store.load_results`` or
``pd.DataFrame(run_ladder(...))``) and returns a ``plotly.graph_objects.Figure``. Every figure is
"relative to the dequantized Q4_1 reference" (the rows' ``reference`` column says which).
"""

from __future__ import annotations

from lablib.plots.style import ENGINE_SYMBOL, color, log_ticks, titled
from lablib.results.tables import need, nonempty

LADDER_ROWS = "lablib.studies.ladder.run_ladder or `lablib quantize --out FILE`"
# a ladder column in words, with its unit, for axis titles and titles
METRIC_WORDS = {
    "kl_mean": "mean KL divergence (nats)",
    "kl_p99": "KL divergence, p99 (nats)",
    "kl_max": "largest KL divergence (nats)",
    "top1": "top-1 agreement (share of tokens)",
    "ppl": "perplexity",
    "dp_top_abs_mean": "mean |Δp| of the top token",
    "decode_tps": "decode (tokens/s)",
    "prefill_tps": "prefill (tokens/s)",
}


def _words(metric: str) -> str:
    return METRIC_WORDS.get(metric, metric)


def _need(df, cols, what):
    """The ladder rows' check: rows (:func:`lablib.results.tables.nonempty`), and the columns ``cols``
    (:func:`lablib.results.tables.need`)."""
    need(nonempty(df, what, f"expected ladder rows from {LADDER_ROWS}"), cols, what, LADDER_ROWS)


def _title(df, text):
    ref = df["reference"].dropna().iloc[0] if "reference" in df and df["reference"].notna().any() else "reference"
    return f"{text}<br><sup>relative to the {ref}</sup>"


# the labels' geometry: the plot area a figure of this module gets in a notebook (968 px wide less its margins and
# legend; HEIGHT less its title and axes), a character's width and a line's height of the labels, a marker's radius
HEIGHT = 460
PLOT_PX = (620.0, 300.0)
CHAR_PX, LINE_PX, MARKER_PX = 7.5, 14.0, 6.0
POSITIONS = (
    "top center",
    "bottom center",
    "middle right",
    "middle left",
    "top right",
    "top left",
    "bottom right",
    "bottom left",
)


def _span(values, log: bool) -> list[float]:
    """An axis range over ``values`` with room for the labels (log10 units on a log axis, as plotly takes them)."""
    import math

    v = [math.log10(x) if log else x for x in values if x == x and (x > 0 or not log)]
    lo, hi = min(v), max(v)
    pad = max(0.12 * (hi - lo), 0.05 if log else 0.05 * (abs(hi) or 1.0))
    return [lo - pad, hi + pad]


def _overlap(a, b) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def label_positions(xs, ys, texts, ranges, logs) -> list[str]:
    """A plotly ``textposition`` for each point's label such that labels overlap no other label or point where a
    place is free (greedy, points left to right; a label leaving the plot area costs as much as an overlap).
    Rungs of nearly the same size (Q5_0 and Q4_K_M: 105.0 and 105.5 MB; Q2_K and Q4_0) would otherwise print
    their names over each other. ``ranges``: the axes' ranges (:func:`_span`), ``logs``: whether each is log."""
    import math

    def px(v, axis):
        t = math.log10(v) if logs[axis] else v
        lo, hi = ranges[axis]
        return (t - lo) / (hi - lo) * PLOT_PX[axis]

    pts = [(px(x, 0), px(y, 1)) for x, y in zip(xs, ys)]
    boxes = [(X - MARKER_PX, Y - MARKER_PX, X + MARKER_PX, Y + MARKER_PX) for X, Y in pts]
    area = (0.0, 0.0, *PLOT_PX)
    chosen: dict[int, str] = {}
    for i in sorted(range(len(pts)), key=lambda k: pts[k]):
        (X, Y), w, h = pts[i], CHAR_PX * len(str(texts[i])), LINE_PX
        best = None
        for pos in POSITIONS:
            v, hz = pos.split()
            x0 = X - w / 2 if hz == "center" else (X + MARKER_PX if hz == "right" else X - MARKER_PX - w)
            y0 = Y - h / 2 if v == "middle" else (Y + MARKER_PX if v == "top" else Y - MARKER_PX - h)
            box = (x0, y0, x0 + w, y0 + h)
            cost = sum(_overlap(box, b) for b in boxes) + (w * h - _overlap(box, area))
            if best is None or cost < best[0] - 1e-9:
                best = (cost, pos, box)
        boxes.append(best[2])
        chosen[i] = best[1]
    return [chosen[i] for i in range(len(pts))]


def _scatter(df, x, y, what, xlog=True, ylog=False):
    """A point per row (its ``type`` written beside it, where no other label or point is), one trace per engine in
    its colour and symbol; log axes with their ticks written out (:func:`lablib.plots.style.log_ticks`)."""
    import plotly.graph_objects as go

    d = df.dropna(subset=[x, y])
    if ylog:
        d = d[d[y] > 0]
    fig = go.Figure()
    ranges, logs = (_span(d[x], xlog), _span(d[y], ylog)), (xlog, ylog)
    where = dict(zip(d.index, label_positions(list(d[x]), list(d[y]), list(d["type"]), ranges, logs)))
    for eng, g in d.groupby("engine", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g[x],
                y=g[y],
                mode="markers+text",
                name=eng,
                text=g["type"],
                textposition=[where[i] for i in g.index],
                cliponaxis=False,  # a label beside the highest point stays whole
                marker={"size": 10, "symbol": ENGINE_SYMBOL.get(eng, "circle"), "color": color(eng)},
                textfont={"color": color(eng)},
            )
        )
    for axis, col, log, rng in (("x", x, xlog, ranges[0]), ("y", y, ylog, ranges[1])):
        update = fig.update_xaxes if axis == "x" else fig.update_yaxes
        update(**(log_ticks(d[col]) if log else {"type": "linear"}), range=rng)
    return fig.update_layout(height=HEIGHT)


def pareto_front(df, x: str, y: str, higher_is_better: bool):
    """Rows on the Pareto front of smaller ``x`` and better ``y`` (sorted by ``x``)."""
    d = df.sort_values(x)
    best, keep = None, []
    for i, v in zip(d.index, d[y]):
        if best is None or (v > best if higher_is_better else v < best):
            keep.append(i)
            best = v
    return d.loc[keep]


def _against_size(d, metric: str, what: str, *, ylog: bool, higher_is_better: bool, title: str, y_title: str):
    """``metric`` of each rung in ``d`` against its file size (log x; a point per rung, :func:`_scatter`), the
    Pareto front of smaller and better dotted through them (:func:`pareto_front`)."""
    import plotly.graph_objects as go

    fig = _scatter(d, "bytes", metric, what, ylog=ylog)
    front = pareto_front(d, "bytes", metric, higher_is_better=higher_is_better)
    fig.add_trace(
        go.Scatter(
            x=front["bytes"], y=front[metric], mode="lines", name="Pareto front", line={"dash": "dot", "color": "gray"}
        )
    )
    return titled(fig, title, x="file size (bytes, log)", y=y_title)


def quality_vs_size(df, metric: str = "kl_mean"):
    """KL divergence (or another quality column) against file bytes, front drawn; log-log for KL.

    Log axes: rungs and engines differ in KL by orders of magnitude (Q8_0 against Q2_K, float32 against
    4-bit), and on a linear axis every file but the worst would lie on the floor."""
    _need(df, ["bytes", metric, "type", "engine"], "quality vs size")
    d = df[df[metric] > 0] if metric.startswith("kl") else df
    better = "upper-left" if metric == "top1" else "lower-left"
    return _against_size(
        d,
        metric,
        "quality",
        ylog=metric.startswith("kl"),
        higher_is_better=metric == "top1",
        title=_title(df, f"Quality against file size: {_words(metric)} ({better} is better)"),
        y_title=_words(metric).replace("(nats)", "(nats, log)"),
    )


def speed_vs_size(df, metric: str = "decode_tps"):
    """Decode (or prefill) tokens/s against bytes, with the Pareto front of small and fast; both axes log.

    Why log y: the rungs of one engine differ by a few times, but engines differ by up to 100x (MLX on
    Linux against llama.cpp), and on a linear axis the slow engine's points lie on the floor; on a log
    axis every engine's points keep their spread, and the same ratio is the same height for each."""
    _need(df, ["bytes", metric, "type", "engine"], "speed vs size")
    return _against_size(
        df.dropna(subset=[metric]),
        metric,
        "speed",
        ylog=True,
        higher_is_better=True,
        title=_title(df, f"Speed against file size: {_words(metric)} (upper-left is better; shared CPU: noisy)"),
        y_title=_words(metric).replace("(tokens/s)", "(tokens/s, log)"),
    )


# llama.cpp's three prefill paths (lablib.engines.ggml_kernels), in the order its CPU backend tries them
KERNEL_PATHS = ("repacked", "tinyBLAS", "row by row")
KERNEL_COLORS = {"repacked": "#2CA58D", "tinyBLAS": "#3D7DCA", "row by row": "#C0392B"}


def kernel_path(kernels: str) -> str:
    """The path of a rung's first type (its most tensors) in a ``matmul_kernels`` line ('Q5_0 tinyBLAS, Q4_K
    repacked q4_K_8x8' -> 'tinyBLAS'); "" when it names none."""
    first = str(kernels).split(", ")[0]
    return next((p for p in KERNEL_PATHS if f" {p}" in first), "")


def prefill_kernels(df):
    """Two panels of llama.cpp's rungs (median per type): prefill tokens/s (left) and decode tokens/s (right),
    one bar per type, sorted by prefill and coloured by the kernel prefill multiplies most of its layers'
    weights with (``matmul_kernels``: weights re-laid at load, llamafile's tinyBLAS, or a dot product per row).
    Prefill follows the kernel; decode, one column per product, reads every weight once, so its bytes weigh more
    there than its kernel (on a shared CPU, quick mode's 8 tokens leave decode noisy). Hover: every type's path."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    _need(df, ["type", "engine", "prefill_tps", "decode_tps", "matmul_kernels"], "prefill by kernel")
    d = df[df["matmul_kernels"].notna() & df["prefill_tps"].notna()]
    d = nonempty(d, "prefill by kernel", f"expected llama.cpp rungs measured for speed from {LADDER_ROWS}")
    g = d.groupby("type", sort=False).agg(
        prefill_tps=("prefill_tps", "median"), decode_tps=("decode_tps", "median"), kernels=("matmul_kernels", "first")
    )
    g = g.sort_values("prefill_tps", ascending=False)
    g["path"] = [kernel_path(k) or "?" for k in g["kernels"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill (tokens/s)", "decode (tokens/s)"))
    for path in [*KERNEL_PATHS, "?"]:
        rows = g[g["path"] == path]
        if rows.empty:
            continue
        for col, metric in ((1, "prefill_tps"), (2, "decode_tps")):
            fig.add_trace(
                go.Bar(
                    x=list(rows.index),
                    y=rows[metric],
                    name=path,
                    legendgroup=path,
                    showlegend=col == 1,
                    marker_color=KERNEL_COLORS.get(path, "#999999"),
                    customdata=list(rows["kernels"]),
                    hovertemplate="%{x}: %{y:.0f} tokens/s<br>%{customdata}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    for col in (1, 2):
        fig.update_xaxes(categoryorder="array", categoryarray=list(g.index), title_text="type", row=1, col=col)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    title = "llama.cpp on this CPU: each type's prefill by the kernel it takes, its decode beside it"
    return fig.update_layout(
        title=title, height=HEIGHT, legend_title_text="prefill kernel (most of the layers' weights)"
    )


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
    return titled(
        fig,
        "Does decode speed follow the bytes read per token?"
        "<br><sup>memory-bound: tokens/s ≈ bandwidth / bytes, a line of slope -1 on these log axes;"
        " shared CPU: noisy</sup>",
        x="weight bytes read per decoded token (log)",
        y="decode (tokens/s, log)",
    )
