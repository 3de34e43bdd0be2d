"""Measuring requests: warm-up, repetitions, one tidy row per measured request.

Warm-up requests run first and are not recorded (first-call costs: allocator,
kernel selection, MLX graph compilation). Each measured request starts from an
empty KV cache (the engines guarantee it), so prefill is always the whole prompt.
"""
from __future__ import annotations

import os

from .engines.base import GenerationConfig
from .errors import LabError
from .results import run_manifest, trace_row


def quick_mode() -> bool:
    """True when LABLIB_QUICK is set to a true value (small budgets for notebooks and CI)."""
    return os.environ.get("LABLIB_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def measure(engine, ids: list[int], cfg: GenerationConfig | None = None, warmup: int = 1,
            reps: int = 3, workload: dict | None = None, **labels) -> list[dict]:
    """Run ``ids`` on ``engine`` ``warmup`` times unrecorded, then ``reps`` times.

    Returns ``reps`` rows (dicts: labels, metrics of DESIGN.md, manifest fields,
    ``token_ids``). Raises LabError for reps < 1 or warmup < 0, and
    ContextOverflowError before any work when the request cannot fit.
    """
    cfg = cfg or GenerationConfig()
    if reps < 1 or warmup < 0:
        raise LabError(f"reps={reps}, warmup={warmup}: expected reps >= 1 and warmup >= 0")
    engine.check_context(len(ids), cfg.max_new_tokens)
    for _ in range(warmup):
        engine.generate(ids, cfg)
    manifest = run_manifest(engine, workload or {"prompt_tokens": len(ids),
                                                 "max_new_tokens": cfg.max_new_tokens,
                                                 "warmup": warmup, "reps": reps})
    rows = []
    for rep in range(reps):
        trace = engine.generate(ids, cfg)
        row = trace_row(trace, manifest, repetition=rep, **labels)
        row["token_ids"] = list(trace.token_ids)
        rows.append(row)
    return rows
