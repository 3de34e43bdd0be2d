"""Rows to tables: medians, percentiles and per-run numbers, as pandas DataFrames.

Every function is a pure function of tidy rows (one row per measured request, the
columns of :mod:`lablib.results.schema`); the figures in :mod:`lablib.plots` draw these
tables. Rows with an ``error`` are left out. Seconds unless a name says otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.results.schema import CLOCKS, COLUMNS, MANIFEST_SUMMARY

if TYPE_CHECKING:
    import pandas as pd


# --- selecting rows -----------------------------------------------------------------------------
def need(df, columns, what: str) -> None:
    """Raise LabError naming the columns of ``columns`` that ``df`` lacks (each one a column of
    :data:`lablib.results.schema.COLUMNS`)."""
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:  # a figure or table asking for a column the lab never writes
        raise LabError(f"{what} asks for {unknown}, which are not columns of a result row (lablib.results.schema)")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise LabError(f"{what} needs the columns {', '.join(missing)}; the data has {', '.join(map(str, df.columns))}")


def ok_rows(df):
    """Rows without an error."""
    if "error" in df.columns:
        df = df[df["error"].isna()]
    return df


def sweep_rows(df, sweep: str):
    """The rows of one sweep kind ("context" or "concurrency"), errors left out.

    Rows without a ``sweep`` column (``side_by_side``) count as context rows.
    """
    df = ok_rows(df)
    if "sweep" not in df.columns:
        return df if sweep == "context" else df.iloc[0:0]
    return df[df["sweep"] == sweep]


def nonempty(df, what: str, hint: str):
    """``df``, or LabError saying there is nothing to show and what to run (``hint``)."""
    if len(df) == 0:
        raise LabError(f"{what}: no rows to plot; {hint}")
    return df


def percentile(values, q: float) -> float:
    """Percentile ``q`` in [0, 100] with linear interpolation (numpy's default) of the values that
    are not None or NaN; NaN when there are none."""
    import numpy as np

    vals = [float(v) for v in values if v is not None and v == v]  # NaN != NaN
    return float(np.percentile(vals, q)) if vals else float("nan")


# --- one engine run and the context sweep ----------------------------------------------------------
def summary_table(df) -> pd.DataFrame:
    """Per engine and prompt length: medians of prefill, TTFT, prefill tokens/s, TPOT, decode tokens/s,
    e2e, and the e2e spread (min, max), seconds; the output tokens and repetitions behind them."""
    g = ok_rows(df).groupby(["engine", "prompt_tokens"], sort=False)
    return g.agg(
        output_tokens=("output_tokens", "first"),
        reps=("e2e_s", "size"),
        prefill_s=("prefill_s", "median"),
        ttft_s=("ttft_s", "median"),
        prefill_tps=("prefill_tps", "median"),
        tpot_s=("tpot_s", "median"),
        decode_tps=("decode_tps", "median"),
        e2e_s=("e2e_s", "median"),
        e2e_min_s=("e2e_s", "min"),
        e2e_max_s=("e2e_s", "max"),
        dtype=("dtype", "first"),
    )


def context_medians(df) -> pd.DataFrame:
    """Per engine and prompt length of the context rows: medians (and min, max) of prefill_s,
    decode_s, prefill_tps and TPOT in ms, the median output tokens, and ``n`` (repetitions);
    sorted by prompt length."""
    d = nonempty(
        sweep_rows(df, "context"),
        "context figure",
        "run lablib.measure.sweep.context_sweep(...) or load a results file with context rows",
    )
    need(
        d,
        ["engine", "prompt_tokens", "output_tokens", "prefill_s", "decode_s", "prefill_tps", "tpot_s"],
        "context figure",
    )
    d = d.assign(tpot_ms=d["tpot_s"].astype(float) * 1000.0)
    g = d.groupby(["engine", "prompt_tokens"], sort=False)
    med = g.agg(
        prefill_s=("prefill_s", "median"),
        decode_s=("decode_s", "median"),
        prefill_tps=("prefill_tps", "median"),
        prefill_tps_min=("prefill_tps", "min"),
        prefill_tps_max=("prefill_tps", "max"),
        tpot_ms=("tpot_ms", "median"),
        tpot_ms_min=("tpot_ms", "min"),
        tpot_ms_max=("tpot_ms", "max"),
        output_tokens=("output_tokens", "median"),
        n=("prefill_s", "size"),
    ).reset_index()
    return med.sort_values("prompt_tokens", kind="stable")


def engine_medians(df) -> pd.DataFrame:
    """Per engine (first-seen order): median prefill_s, decode_s, prompt_tokens and output_tokens."""
    d = ok_rows(df)
    need(d, ["engine", "prefill_s", "decode_s", "prompt_tokens", "output_tokens"], "engine medians")
    return d.groupby("engine", sort=False)[["prefill_s", "decode_s", "prompt_tokens", "output_tokens"]].median()


# --- the concurrency sweep -------------------------------------------------------------------------
def run_table(df) -> pd.DataFrame:
    """One row per concurrency run (``run_id``): engine, mode, concurrency, requests,
    output_tokens, makespan_s, output_tps (all output tokens / makespan), requests_per_s,
    and p50/p95/p99 of queue_s, ttft_s, tpot_s and e2e_s (seconds); hostname and
    cpu_model kept when present (to facet by machine). Rows with an ``error`` are skipped.
    """
    import pandas as pd

    d = df[df["sweep"] == "concurrency"] if "sweep" in df else df
    d = ok_rows(d)
    out = []
    for run_id, g in d.groupby("run_id", sort=False):
        makespan = float(g["t_last_token"].max() - g["t_submit"].min())
        tokens = int(g["output_tokens"].sum())
        rec = {
            "run_id": run_id,
            "engine": g["engine"].iloc[0],
            "mode": g["mode"].iloc[0],
            "concurrency": int(g["concurrency"].iloc[0]),
            "requests": len(g),
            "output_tokens": tokens,
            "makespan_s": makespan,
            "output_tps": tokens / makespan if makespan > 0 else float("nan"),
            "requests_per_s": len(g) / makespan if makespan > 0 else float("nan"),
        }
        for metric in ("queue_s", "ttft_s", "tpot_s", "e2e_s"):
            for q in (50, 95, 99):
                rec[f"{metric[:-2]}_p{q}_s"] = percentile(g[metric], q)
        for col in ("hostname", "cpu_model"):
            if col in g:
                rec[col] = g[col].iloc[0]
        out.append(rec)
    return pd.DataFrame(out)


def concurrency_summary(df, facet_by: str | None = None) -> pd.DataFrame:
    """Per (facet, engine, mode, concurrency): median run output_tps over runs, and TTFT p50/p95 (s)
    over all requests of those runs. Needs the columns of :func:`run_table`."""
    import pandas as pd

    d = ok_rows(df)
    runs = run_table(d)
    keys = ([facet_by] if facet_by else []) + ["engine", "mode", "concurrency"]
    rows = []
    for key, r in d.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        sel = runs[runs["run_id"].isin(r["run_id"].unique())]
        rows.append(
            dict(
                zip(keys, key),
                runs=len(sel),
                requests=len(r),
                output_tps=float(sel["output_tps"].median()),
                ttft_p50_s=percentile(r["ttft_s"], 50),
                ttft_p95_s=percentile(r["ttft_s"], 95),
            )
        )
    return pd.DataFrame(rows)


def timeline_segments(run) -> pd.DataFrame:
    """Segments of one run, times relative to its first t_submit (s): a DataFrame with one row
    per request in arrival order: request_index, prompt_tokens, output_tokens, queue (start, end),
    prefill (start, end) and decode (start, end).

    Needs: t_submit, t_start, t_first_token, t_last_token (request_index when present)."""
    need(run, CLOCKS, "timeline")
    r = run.copy()
    if "request_index" not in r.columns:
        r["request_index"] = range(len(r))
    r = r.sort_values(["t_submit", "request_index"], kind="stable")
    t0 = r["t_submit"].min()
    out = r[["request_index"] + [c for c in ("prompt_tokens", "output_tokens") if c in r.columns]].copy()
    out["queue_start"], out["queue_end"] = r["t_submit"] - t0, r["t_start"] - t0
    out["prefill_start"], out["prefill_end"] = r["t_start"] - t0, r["t_first_token"] - t0
    out["decode_start"], out["decode_end"] = r["t_first_token"] - t0, r["t_last_token"] - t0
    return out.reset_index(drop=True)


# --- prefix caching (lab 08) -------------------------------------------------------------------------
PREFIX_AXES = {"prefix_shared": "shared_tokens", "prefix_chat": "turn"}


def prefix_medians(df, sweep: str = "prefix_shared") -> pd.DataFrame:
    """Per engine, ``reuse`` and step of a prefix-caching run (``shared_tokens`` for sweep
    "prefix_shared", ``turn`` for "prefix_chat"): medians of ttft_s and prefill_s, prompt_tokens,
    cached_tokens and evaluated_tokens, ``n`` (requests), and ``speedup`` on the reuse rows (median
    TTFT without reuse / with, at the same step). Sorted by engine order, step, reuse."""
    if sweep not in PREFIX_AXES:
        raise LabError(f"sweep={sweep!r}: expected one of {', '.join(PREFIX_AXES)}")
    axis = PREFIX_AXES[sweep]
    d = nonempty(
        sweep_rows(df, sweep),
        f"{sweep} table",
        "run lablib.studies.prefix.shared_prefix(...) or lablib.studies.prefix.chat(...)",
    )
    need(d, ["engine", "reuse", axis, "ttft_s", "prefill_s", "prompt_tokens", "cached_tokens"], f"{sweep} table")
    cols = {"ttft_s": "median", "prefill_s": "median", "prompt_tokens": "median", "cached_tokens": "median"}
    if "evaluated_tokens" in d.columns:
        cols["evaluated_tokens"] = "median"
    d = d.assign(reuse=d["reuse"].astype(bool))
    med = d.groupby(["engine", axis, "reuse"], sort=False).agg(
        **{k: (k, v) for k, v in cols.items()}, n=("ttft_s", "size")
    )
    med = med.reset_index()
    base = med[~med["reuse"]].set_index(["engine", axis])["ttft_s"]
    key = list(zip(med["engine"], med[axis]))
    med["speedup"] = [
        base.get(k, float("nan")) / t if r else float("nan") for k, t, r in zip(key, med["ttft_s"], med["reuse"])
    ]
    order = {e: i for i, e in enumerate(dict.fromkeys(d["engine"]))}
    med = med.sort_values([axis, "reuse"], kind="stable").sort_values(
        "engine", key=lambda s: s.map(order), kind="stable"
    )
    return med.reset_index(drop=True)


# --- the manifest -----------------------------------------------------------------------------
def manifest_table(df) -> pd.DataFrame:
    """The manifest basics (:data:`lablib.results.schema.MANIFEST_SUMMARY`), one row per (hostname, engine):
    versions, dtype, threads, quantization, model, CPU, cores, RAM (GiB), accelerator, lablib
    version, first/last time, and row counts."""
    d = df.copy()
    cols = [c for c in MANIFEST_SUMMARY if c in d.columns]
    if "ram_bytes" in cols:
        d["ram_gib"] = (d["ram_bytes"].astype(float) / 2**30).round(1)
        cols[cols.index("ram_bytes")] = "ram_gib"
    keys = [c for c in ("hostname", "engine") if c in cols]
    if not keys:
        return d.iloc[0:0]
    agg = {c: (c, "first") for c in cols if c not in keys}
    if "time" in d.columns:
        agg.update(first_time=("time", "min"), last_time=("time", "max"))
    agg["requests"] = (keys[0], "size")
    return d.groupby(keys, sort=False, dropna=False).agg(**agg).reset_index()


# --- measured against the roofline's bound ----------------------------------------------------------
def bound_table(df) -> pd.DataFrame:
    """Per engine (and weight choice, where rows record one: ``weights``) and prompt length: medians of
    measured and bound tokens/s and % of bound, prefill and decode, of rows that carry the bound columns
    (:func:`lablib.studies.roofline.add_bound_columns`)."""
    keys = ["engine", "weights", "prompt_tokens"] if "weights" in df.columns else ["engine", "prompt_tokens"]
    g = df.groupby(keys, sort=False, dropna=False)
    return g.agg(
        prefill_tps=("prefill_tps", "median"),
        prefill_bound_tps=("prefill_bound_tps", "median"),
        prefill_pct_of_bound=("prefill_pct_of_bound", "median"),
        decode_tps=("decode_tps", "median"),
        decode_bound_tps=("decode_bound_tps", "median"),
        decode_pct_of_bound=("decode_pct_of_bound", "median"),
    ).reset_index()
