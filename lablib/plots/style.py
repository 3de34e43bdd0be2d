"""The lab's one figure style: each engine keeps one colour everywhere, phases and modes one look.

Figures of every subject (:mod:`lablib.plots.sweeps`, ``.roofline``, ``.quant``, ``.prefix``, ``.compare``,
``.anchors``) take their colours, dashes, symbols and the order of engines from here.
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


def color(engine: str) -> str:
    """The engine's color (grey for an engine the lab does not know)."""
    return ENGINE_COLORS.get(engine, "#888888")


def mode_dash(mode: str) -> str:
    """Line style of a scheduling mode: serial dashed, batched solid."""
    return MODE_DASH.get(mode, "dot")


def engine_order(df) -> list[str]:
    return list(dict.fromkeys(df["engine"]))


def mode_order(df) -> list[str]:
    present = list(dict.fromkeys(df["mode"]))
    return [m for m in MODE_ORDER if m in present] + [m for m in present if m not in MODE_ORDER]


# --- context sweep ------------------------------------------------------------------------------
