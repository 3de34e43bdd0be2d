"""Figures: pure functions of tidy rows (or of what a comparison stored), one module per subject.

- :mod:`lablib.plots.style`: the one style (engine colours, phase and mode looks, engine order);
- :mod:`lablib.plots.phases`, ``.first_requests``: lab 01 (where one prompt's time goes: the prefill/decode split;
  the first requests after a load, what a warm-up throws away);
- :mod:`lablib.plots.context`, ``.concurrency``: labs 02, 03 (the context sweep; the concurrency sweep and a
  run's request timeline);
- :mod:`lablib.plots.anchors`: lab 03 (the lab beside llama.cpp's own benchmarks);
- :mod:`lablib.plots.compare`, ``.batch_invariance``: lab 04 (KL per position, top-k at the divergence; where a
  prompt's greedy text changed with what shared its batch);
- :mod:`lablib.plots.serving`: lab 05, ``lablib bench`` (servers under a rate sweep; a load run seen by the
  client and by the server);
- :mod:`lablib.plots.quant`, ``.roofline``, ``.prefix``: labs 06, 07, 08;
- :mod:`lablib.plots.scheduler`: lab 09 (head-of-line blocking, the saturation knee, prefix reuse on real
  traffic and by chat turn);
- :mod:`lablib.plots.speculative`, ``.structured``: lab 10 (speedup against draft length beside Leviathan et
  al.'s prediction, acceptance by draft position; a grammar's cost and what it buys);
- :mod:`lablib.plots.adapters`: lab 11 (what a LoRA adapter costs each engine, merged and unmerged; many adapters
  at once on a server).

A figure only draws: its numbers come from :mod:`lablib.results.tables`, its columns are declared
in :mod:`lablib.results.schema`, and plotly is imported inside each function (``import lablib.plots``
stays light). ``plots.context_bars(df)`` and the other names below work as before the package.
"""

from __future__ import annotations

from lablib.plots.adapters import adapter_cost_bars, multi_lora_lines
from lablib.plots.anchors import anchor_bars
from lablib.plots.batch_invariance import parting_map
from lablib.plots.compare import kl_per_position, topk_at_divergence
from lablib.plots.concurrency import concurrency_lines, timeline
from lablib.plots.context import context_bars, context_lines
from lablib.plots.first_requests import first_request_lines
from lablib.plots.phases import prefill_decode_bars
from lablib.plots.scheduler import hol_timeline, knee_plot, reuse_bars, turn_lines
from lablib.plots.serving import rate_sweep, server_timeline
from lablib.plots.speculative import acceptance_by_position, speedup_vs_k
from lablib.plots.structured import tpot_with_without, valid_share
from lablib.plots.style import (
    ENGINE_COLORS,
    ENGINE_SYMBOL,
    LEGEND_COLOR,
    MODE_DASH,
    MODE_ORDER,
    PHASE_LEGEND_COLOR,
    PHASE_OPACITY,
    PHASE_PATTERN,
    QUEUE_COLOR,
    color,
    engine_order,
    mode_dash,
    mode_order,
)

__all__ = [
    "ENGINE_COLORS",
    "ENGINE_SYMBOL",
    "LEGEND_COLOR",
    "MODE_DASH",
    "MODE_ORDER",
    "PHASE_LEGEND_COLOR",
    "PHASE_OPACITY",
    "PHASE_PATTERN",
    "QUEUE_COLOR",
    "engine_order",
    "mode_order",
    "acceptance_by_position",
    "adapter_cost_bars",
    "anchor_bars",
    "color",
    "concurrency_lines",
    "context_bars",
    "context_lines",
    "first_request_lines",
    "hol_timeline",
    "kl_per_position",
    "knee_plot",
    "mode_dash",
    "multi_lora_lines",
    "parting_map",
    "prefill_decode_bars",
    "rate_sweep",
    "reuse_bars",
    "server_timeline",
    "speedup_vs_k",
    "timeline",
    "topk_at_divergence",
    "tpot_with_without",
    "turn_lines",
    "valid_share",
]
