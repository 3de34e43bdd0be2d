"""Prediction versus measurement: the roofline's prefill and decode tokens/s for each engine on this
machine, against a short context sweep of the three engines.

The machine is measured first (:func:`lablib.machine.measure_machine`, refreshed: read bandwidth and
matmul FLOP/s), then each engine runs the context sweep (one warm-up, ``--reps`` requests per length,
``--new-tokens`` output tokens; ``--weights openvino=source,onnxruntime-genai=int4`` loads those engines
with those weights). The prediction for each row follows what its engine loaded, as the row records it
(``weights``, ``compute_dtype``): prefill of its prompt at that compute roof (int8 for llama.cpp's Q4_1
and onnxruntime-genai's int4, float32 for transformers and MLX, openvino's inference precision) or its
bytes, whichever is slower; decode at the mean depth, bandwidth- or compute-bound. Prints the table of
medians, the crossover batch size per engine and weights, then one line per engine, weights and prompt
length: ``engine=NAME weights=W prompt=N decode_pred=X decode_meas=Y decode_ratio=R prefill_pred=...``.

The machine is shared with other people's jobs: the measured columns wander by multiples from run to
run (llama.cpp most: its threads wait for each other at every step when a core is taken). Compare
orders of magnitude, and run it twice.

    python benchmarks/roofline.py [--prompt-tokens 64,256] [--new-tokens 16] [--reps 2] [--results FILE]
    python benchmarks/roofline.py --engines openvino,ort --weights openvino=source,ort=int4
    LABLIB_THREADS=1 python benchmarks/roofline.py --threads 1   # engines and ceilings on one core

``--threads N`` measures the ceilings with N threads (float32 through torch, whose thread count can be set)
and is not cached; give the engines the same count with LABLIB_THREADS=N. On a loaded machine one thread
per engine avoids llama.cpp's threads waiting for each other, and compares like with like.

What it printed on the lab's shared 2-core EPYC (30 Nov 2026, load average 6-7 from other people's jobs),
``LABLIB_THREADS=1 ... --threads 1``, 16 output tokens, 2 repetitions; read 8.3 GB/s (5.4-18.6), float32
33, int8 174 GFLOP/s; measured / predicted:
    transformers  prompt  64: decode  6.2 of 15.4 (0.40), prefill 112 of 153 (0.73)
    transformers  prompt 256: decode  5.9 of 15.2 (0.39), prefill 133 of 149 (0.89)
    llama.cpp     prompt  64: decode 35.2 of 84.9 (0.41), prefill  67 of 809 (0.08)
    llama.cpp     prompt 256: decode 32.0 of 81.2 (0.39), prefill  70 of 787 (0.09)
    mlx           prompt  64: decode  2.5 of 15.4 (0.16), prefill   4 of 153 (0.03)
    mlx           prompt 256: decode  2.6 of 15.2 (0.17), prefill   4 of 149 (0.03)
With two threads at the same load, llama.cpp fell to 2-5 tokens/s (0.02-0.05 of its bound): its threads
wait for each other at every step when another process holds a core.

The two engines with a choice of weights, same machine (cached measurement: read 34.2 GB/s, float32 193,
bfloat16 428, int8 865 GFLOP/s), LABLIB_THREADS=2, 64 prompt + 8 output tokens, 2 repetitions
(``--engines openvino,onnxruntime-genai [--weights openvino=source,onnxruntime-genai=int4]``), bound
tokens/s (measured) per row; before 30 Nov 2026 every row was bounded by the engine's defaults:
    openvino          f16     decode 126.2 (48), prefill 1986 (914; float32 roof before: 897, below the measurement)
    openvino          source  decode 348.1 (61), prefill 1986 (804)   before: 126.2 and 897 (the F16 file, float32)
    onnxruntime-genai fp32    decode  63.1 (24), prefill  897 (190)
    onnxruntime-genai int4    decode 391.2 (52), prefill 4016 (264)   before: 63.1 and 897 (float32 weights and math)
"""

from __future__ import annotations

import argparse

import pandas as pd

import lablib
from lablib import machine as hardware
from lablib.machine import ceilings
from lablib.measure import sweep
from lablib.results import tables
from lablib.studies import roofline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", default="64,256")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--engines", default="transformers,llama.cpp,mlx")
    ap.add_argument("--weights", default=None, help="weight choices, e.g. openvino=source,onnxruntime-genai=int4")
    ap.add_argument("--out", default=None, help="also append the measured rows to this results file")
    ap.add_argument("--results", default=None, help="use this results file's context rows instead of measuring")
    ap.add_argument("--no-refresh", action="store_true", help="use the cached machine measurement")
    ap.add_argument("--threads", type=int, default=None, help="measure the ceilings with N threads (not cached)")
    ns = ap.parse_args()

    model = lablib.prepare(log=lambda *_: None)
    if ns.threads:
        bw = {k: hardware.stream_bandwidth(k, reps=5, threads=ns.threads) for k in hardware.STREAM_KERNELS}
        # torch's float32 (transformers' products) at full size; its bfloat16 and int8 within MAX_PRODUCT_S a product
        # (bfloat16 took 86 s a product at 2048 on an AVX2-only EPYC)
        mm = {
            k: hardware.matmul_flops(
                k,
                n=2048,
                reps=5,
                backend="torch",
                threads=ns.threads,
                max_product_s=None if k == "float32" else ceilings.MAX_PRODUCT_S,
            )
            for k in hardware.MATMUL_DTYPES
        }
        m = {"cpu_model": hardware.cpu_model(), "threads": ns.threads, "time": "now", "bandwidth": bw, "matmul": mm}
        mach = {
            "name": f"{ns.threads} thread(s)",
            "bytes_per_s": bw[hardware.ROOFLINE_KERNEL]["max"],  # the roofline's ceilings: best repetitions
            "flop_per_s": {k: v["max"] for k, v in mm.items()},
        }
    else:
        m = hardware.measure_machine(refresh=not ns.no_refresh, quick=False)
        mach = ceilings.machine("this")
    bw = m["bandwidth"]
    print(f"machine: {m['cpu_model']}, {m['threads']} threads, measured {m['time']}")
    for k, v in bw.items():
        print(
            f"  bandwidth {k:<5} {v['bytes_per_s'] / 1e9:6.1f} GB/s "
            f"(min {v['min'] / 1e9:.1f}, max {v['max'] / 1e9:.1f})"
        )
    for k, v in m["matmul"].items():
        print(
            f"  matmul {k:<8} {v['flop_per_s'] / 1e9:6.1f} GFLOP/s (min {v['min'] / 1e9:.1f}, max {v['max'] / 1e9:.1f},"
            f" n={v['n']}, {v['backend']})"
        )
        for b, r in v.get("backends", {}).items():  # float32 through each BLAS; the roof is the faster
            print(
                f"    {b:<13} {r['flop_per_s'] / 1e9:6.1f} GFLOP/s (min {r['min'] / 1e9:.1f}, max {r['max'] / 1e9:.1f})"
            )
    if ns.results:
        from lablib.results.store import load_results

        df = load_results(ns.results)
        df = df[df.get("sweep", "context") == "context"]
    else:
        df = sweep.context_sweep(
            model,
            engines=ns.engines,
            prompt_tokens=ns.prompt_tokens,
            max_new_tokens=ns.new_tokens,
            reps=ns.reps,
            progress=False,
            weights=ns.weights,
            out=ns.out,
        )
    d = roofline.add_bound_columns(df, model, machine_name=mach)
    t = tables.bound_table(d)
    t["prefill_ratio"] = t["prefill_tps"] / t["prefill_bound_tps"]
    t["decode_ratio"] = t["decode_tps"] / t["decode_bound_tps"]
    cols = [
        "engine",
        *(["weights"] if "weights" in t.columns else []),
        "prompt_tokens",
        "prefill_bound_tps",
        "prefill_tps",
        "prefill_ratio",
        "decode_bound_tps",
        "decode_tps",
        "decode_ratio",
    ]
    with pd.option_context("display.float_format", "{:,.2f}".format, "display.width", 160):
        print("\npredicted (bound) versus measured, tokens/s, medians:")
        print(t[cols].to_string(index=False))
    print("\ncrossover batch (decode turns compute-bound), at depth 256:")
    runs = d.reindex(columns=["engine", "weights", "compute_dtype"]).drop_duplicates()
    for e, w, c in runs.itertuples(index=False):
        prof = roofline.engine_profile(model, e, w, c)
        print(
            f"  {e:<17} {str(prof['weights'] or '-'):<8} {roofline.crossover_batch(prof, mach, 256):.1f} sequences "
            f"({prof['compute_dtype']} roof {ceilings.peak_flops(mach, prof['compute_dtype']) / 1e9:.0f} GFLOP/s, "
            f"{prof['weight_bytes'] / 1e6:.1f} MB of weights)"
        )
    print()
    for r in t.itertuples():
        w = getattr(r, "weights", None)
        print(
            f"engine={r.engine} weights={w if isinstance(w, str) else '-'} prompt={r.prompt_tokens} "
            f"decode_pred={r.decode_bound_tps:.1f} "
            f"decode_meas={r.decode_tps:.1f} decode_ratio={r.decode_ratio:.2f} prefill_pred={r.prefill_bound_tps:.0f} "
            f"prefill_meas={r.prefill_tps:.0f} prefill_ratio={r.prefill_ratio:.2f}"
        )


if __name__ == "__main__":
    main()
