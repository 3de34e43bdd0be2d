"""The lab's one figure style: each engine keeps one colour everywhere, phases and modes one look.

Figures of every subject (:mod:`lablib.plots.phases`, ``.context``, ``.concurrency``, ``.roofline``, ``.quant``,
``.prefix``, ``.compare``, ``.anchors``) take their colours, dashes, symbols and the order of engines from here.
"""

from __future__ import annotations

ENGINE_COLORS = {
    "transformers": "#F2A900",
    "llama.cpp": "#3D7DCA",
    "mlx": "#2CA58D",
    "onnxruntime-genai": "#8E5BB5",
    "openvino": "#C0392B",
}
PHASE_OPACITY = {"prefill": 1.0, "decode": 0.55}
PHASE_LEGEND_COLOR = "#666666"  # legend swatches for phases: no engine's colour
PHASE_PATTERN = {"prefill": "", "decode": "/"}
QUEUE_COLOR = "#B0B0B0"
LEGEND_COLOR = "#555555"
# marker symbols where engines share one axis as points (the quantization ladder)
ENGINE_SYMBOL = {"llama.cpp": "circle", "transformers": "square", "mlx": "diamond"}
MODE_DASH = {"serial": "dash", "batched": "solid"}
# the server's own gauges beside the client's view (lablib.plots.serving.server_timeline)
SERVER_COLORS = {
    "in_flight": "#3D7DCA",
    "ttft_s": "#F2A900",
    "running": "#2CA58D",
    "waiting": QUEUE_COLOR,
    "kv_usage": "#8E5BB5",
}
MODE_ORDER = ("single", "serial", "batched")
# one line per server where servers share an axis (lablib.plots.serving.rate_sweep), in the order they
# come: servers are not engines (two of lab 05's three run llama.cpp), so they take colours of their own
SERVER_LINE_COLORS = ("#3D7DCA", "#F2A900", "#2CA58D", "#8E5BB5", "#C0392B", "#555555")
SERVER_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")


def color(engine: str) -> str:
    """The engine's color (grey for an engine the lab does not know)."""
    return ENGINE_COLORS.get(engine, "#888888")


def mode_dash(mode: str) -> str:
    """Line style of a scheduling mode: serial dashed, batched solid."""
    return MODE_DASH.get(mode, "dot")


def titled(fig, title: str, x: str, y: str, **layout):
    """``fig`` in the lab's template (``plotly_white``), titled ``title``, its axes ``x`` and ``y``, with any other
    ``fig.update_layout`` keywords in ``layout``; returns ``fig``."""
    return fig.update_layout(template="plotly_white", title=title, xaxis_title=x, yaxis_title=y, **layout)


def engine_order(df) -> list[str]:
    return list(dict.fromkeys(df["engine"]))


def mode_order(df) -> list[str]:
    present = list(dict.fromkeys(df["mode"]))
    return [m for m in MODE_ORDER if m in present] + [m for m in present if m not in MODE_ORDER]


# --- context sweep ------------------------------------------------------------------------------


# --- log axes -------------------------------------------------------------------------------------
LOG_MANTISSAS = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 5, 7), (1, 2, 5), (1,))


def _tick_text(v: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"


def log_ticks(values, max_ticks: int = 8) -> dict:
    """A log axis's ticks for ``values`` (the numbers it shows), written out in full: ``{"type": "log",
    "tickvals": [...], "ticktext": [...]}`` for ``fig.update_yaxes(**...)``. The finest of 1-2-...-9,
    1-2-3-5-7, 1-2-5 and powers of ten that puts at most ``max_ticks`` ticks between the smallest and the
    largest value: plotly's own ticks on a log axis write 50 as a small "5" beside the decade, which a
    reader takes for 5. Just ``{"type": "log"}`` without a positive value."""
    import math

    v = [float(x) for x in values if x is not None and x == x and math.isfinite(float(x)) and float(x) > 0]
    if not v:
        return {"type": "log"}
    lo, hi = min(v), max(v)
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
    for mantissas in LOG_MANTISSAS:
        ticks = [m * 10.0**e for e in decades for m in mantissas]
        if sum(lo <= t <= hi for t in ticks) <= max_ticks or mantissas == LOG_MANTISSAS[-1]:
            break
    # round away float noise (3 * 0.1 is 0.30000000000000004) before the labels are written
    ticks = [float(f"{t:.6g}") for t in ticks]
    return {"type": "log", "tickvals": ticks, "ticktext": [_tick_text(t) for t in ticks]}


def facet_spacing(rows: int, most: float) -> float:
    """``make_subplots``' vertical spacing for ``rows`` rows of panels (one per machine): ``most``, less where
    plotly's limit of 1 / (rows - 1) would refuse it."""
    return min(most, 0.5 / rows) if rows > 1 else 0.1


def match_y(fig, rows: int, cols: int, like=lambda col: col) -> None:
    """Each panel's y axis on one scale with row 1's panel ``like(col)`` (its own column by default): a metric
    read against the same gridlines on every machine's row of panels."""
    for row in range(1, rows + 1):
        for col in range(1, cols + 1):
            axis = fig.get_subplot(row, col).yaxis
            ref = fig.get_subplot(1, like(col)).yaxis.plotly_name.replace("yaxis", "y")
            if axis.plotly_name.replace("yaxis", "y") != ref:
                axis.matches = ref
