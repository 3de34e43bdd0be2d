"""`lablib roofline`: this machine's ceilings and each engine's last measured decode against its bound."""

from __future__ import annotations

import json
from pathlib import Path

from lablib.errors import LabError

RESULTS_DIRS = ("results", "labs/results")


def results_files(folders=RESULTS_DIRS) -> list[Path]:
    """Results files (.jsonl, .parquet) the lab wrote under ``folders`` (relative to the current folder)."""
    out = []
    for d in folders:
        for suffix in ("*.jsonl", "*.parquet"):
            out += sorted(Path(d).glob(suffix))
    return out


def _last_rows(files, model, engines):
    """Each engine's rows from its most recent measurement in ``files`` on this machine and model (single-stream
    rows with a decode rate), or an empty DataFrame."""
    import pandas as pd

    from lablib.machine.identity import hardware_info
    from lablib.results.store import load_results

    if not files:
        return pd.DataFrame()
    df = load_results(*files)
    keep = df["engine"].isin(engines) & df["decode_tps"].notna() if "decode_tps" in df else df["engine"].isna()
    if "error" in df:
        keep &= df["error"].isna()
    if "hostname" in df:
        keep &= df["hostname"] == hardware_info()["hostname"]
    if "model_sha256" in df:
        keep &= df["model_sha256"] == model.sha256
    if "mode" in df:
        keep &= df["mode"].isin(["single", "serial"]) | df["mode"].isna()
    d = df[keep]
    if not len(d):
        return d
    last = d.groupby("engine")["time"].transform("max") if "time" in d else None
    return d[d["time"] == last] if last is not None else d


def roofline_report(results=None, engines="transformers,llama.cpp,mlx", model=None, refresh: bool = False) -> dict:
    """{machine: {cpu_model, threads, bandwidth_gbps (read kernel's median: the roofline's),
    bandwidth_spread_gbps [min, max], copy_gbps, triad_gbps (STREAM's kernels, medians),
    gflops {dtype: median GFLOP/s (int8: GOP/s)}, measured}, engines: {engine: {decode_tps,
    decode_bound_tps, fraction_of_bound, prefill_tps, prefill_bound_tps, prompt_tokens, rows, source}}}.

    ``results``: results files (None: those under results/ and labs/results/; [] : none); an engine
    without rows from this machine and model is measured now (one warm-up, then the requests of
    :data:`lablib.config.BUDGETS` ``"roofline"``: 3 of 64 prompt and 32 output tokens)."""
    from lablib.config import budget
    from lablib.machine.ceilings import measure_machine
    from lablib.measure.sweep import engine_names, side_by_side
    from lablib.measure.workload import prompt_of_length
    from lablib.model.resolve import prepare
    from lablib.studies.roofline import add_bound_columns

    names = engine_names(engines)
    m = measure_machine(refresh=refresh)
    rm = prepare(model, log=lambda *_: None)
    files = results_files() if results is None else [Path(f) for f in results]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise LabError(f"--results {', '.join(map(str, missing))}: not found; expected results files the lab wrote")
    rows = _last_rows(files, rm, names)
    import pandas as pd

    frames = [rows.assign(source="results: " + rows["source_file"].astype(str))] if len(rows) else []
    todo = [e for e in names if not len(rows) or e not in set(rows["engine"])]
    if todo:
        n, new, reps = (budget("roofline", k) for k in ("prompt_tokens", "max_new_tokens", "reps"))
        fresh = side_by_side(
            rm, engines=todo, ids=prompt_of_length(rm, n), max_new_tokens=new, reps=reps, progress=False
        )
        frames.append(fresh.assign(source=f"measured now ({n} prompt + {new} output tokens, {reps} requests)"))
    df = add_bound_columns(pd.concat(frames, ignore_index=True), rm, machine_name=None)
    engines_out = {}
    for e, g in df.groupby("engine", sort=False):
        dec, bound = float(g["decode_tps"].median()), float(g["decode_bound_tps"].median())
        engines_out[e] = {
            "decode_tps": dec,
            "decode_bound_tps": bound,
            "fraction_of_bound": dec / bound,
            "prefill_tps": float(g["prefill_tps"].median()),
            "prefill_bound_tps": float(g["prefill_bound_tps"].median()),
            "prompt_tokens": int(g["prompt_tokens"].median()),
            "rows": len(g),
            "compute_dtype": g["compute_dtype"].iloc[0],
            "source": g["source"].iloc[0],
        }
    bw = m["bandwidth"]
    return {
        "machine": {
            "cpu_model": m["cpu_model"],
            "threads": m["threads"],
            "bandwidth_gbps": m["bytes_per_s"] / 1e9,
            "bandwidth_spread_gbps": [bw["read"]["min"] / 1e9, bw["read"]["max"] / 1e9],
            "copy_gbps": bw["copy"]["bytes_per_s"] / 1e9,
            "triad_gbps": bw["triad"]["bytes_per_s"] / 1e9,
            "gflops": {k: v / 1e9 for k, v in m["flop_per_s"].items()},
            "measured": m["time"],
        },
        "engines": engines_out,
    }


HELP = "this machine's bandwidth and FLOP/s, each engine's decode against its bound"


def add_arguments(p) -> None:
    p.add_argument(
        "--results",
        nargs="*",
        default=None,
        help="results files (default: results/ and labs/results/ here; none: a quick measurement)",
    )
    p.add_argument("--engines", default="transformers,llama.cpp,mlx")
    p.add_argument("--model", default=None)
    p.add_argument("--refresh", action="store_true", help="measure the machine again (else the cached measurement)")
    p.add_argument("--json", action="store_true", help="one JSON object")


def run(ns) -> int:
    out = roofline_report(results=ns.results, engines=ns.engines, model=ns.model, refresh=ns.refresh)
    if ns.json:
        print(json.dumps(out, default=str))
        return 0
    m = out["machine"]
    rates = ", ".join(f"{k} {v:.0f} G/s" for k, v in m["gflops"].items())
    print(
        f"{m['cpu_model']}, {m['threads']} threads: bandwidth {m['bandwidth_gbps']:.1f} GB/s (read; STREAM copy "
        f"{m['copy_gbps']:.1f}, triad {m['triad_gbps']:.1f}), matmul {rates}"
    )
    for e, r in out["engines"].items():
        print(
            f"  {e:<13} decode {r['decode_tps']:.1f} tok/s of a {r['decode_bound_tps']:.1f} tok/s bound "
            f"({100 * r['fraction_of_bound']:.0f} %), prompt {r['prompt_tokens']} tokens; {r['source']}"
        )
    return 0
