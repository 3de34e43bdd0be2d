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


def side_by_side(model=None, engines=("transformers", "llama.cpp", "mlx"), messages=None, ids=None,
                 max_new_tokens: int | None = None, warmup: int = 1, reps: int | None = None,
                 progress: bool = True):
    """The same prompt ids through each engine: one row per measured request.

    ``messages`` (chat, rendered by the lab's tokenizer) or ``ids`` give the
    prompt (default: the question "What is the capital of France?"). Budgets
    default to 64 tokens x 5 repetitions, 16 x 2 in quick mode. Each engine is
    loaded, measured and closed in turn (one in memory at a time). Returns a
    pandas DataFrame with the metrics, ``text`` and the manifest fields.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from .engines import load_engine
    from .models import ResolvedModel, prepare
    from .workload import chat_ids

    rm = model if isinstance(model, ResolvedModel) else prepare(model)
    if ids is None:
        ids = chat_ids(rm, messages or [{"role": "user", "content": "What is the capital of France?"}])
    quick = quick_mode()
    max_new_tokens = max_new_tokens or (16 if quick else 64)
    reps = reps or (2 if quick else 5)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    rows = []
    for name in tqdm(list(engines), desc="engines", disable=not progress):
        engine = load_engine(name, rm)
        try:
            for row in measure(engine, ids, cfg, warmup=warmup, reps=reps):
                row["text"] = engine.detokenize(row["token_ids"])
                rows.append(row)
        finally:
            engine.close()
    return pd.DataFrame(rows)


def summary_table(df):
    """Per engine: medians of prefill, TTFT, TPOT, decode tok/s, e2e, and the e2e spread."""
    g = df.groupby("engine", sort=False)
    out = g.agg(prompt_tokens=("prompt_tokens", "first"), output_tokens=("output_tokens", "first"),
                reps=("e2e_s", "size"), prefill_s=("prefill_s", "median"), ttft_s=("ttft_s", "median"),
                prefill_tps=("prefill_tps", "median"), tpot_s=("tpot_s", "median"),
                decode_tps=("decode_tps", "median"), e2e_s=("e2e_s", "median"),
                e2e_min_s=("e2e_s", "min"), e2e_max_s=("e2e_s", "max"), dtype=("dtype", "first"))
    return out
