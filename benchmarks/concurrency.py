"""Serial queue versus continuous batching, per engine, at C = 1, 2, 4, 8.

For each engine and mode: a closed loop of C clients and R = 2 x C requests
(prompts of 64 tokens, 32 output tokens, greedy, EOS ignored), after one
warm-up request per mode. Prints a table of output tokens/s, requests/s,
TTFT p50/p95 and TPOT p50, then one line per engine, mode and C:
``engine=NAME mode=MODE c=C output_tps=X ttft_p50_s=Y``.

The batching evidence (most sequences advanced in one engine step) is read
from the engine's own counters (lablib.measure.closed_loop.run_closed_loop(...).stats).

    python benchmarks/concurrency.py [--engines ...] [--concurrency 1,2,4,8] [--out results/concurrency.jsonl]
"""

from __future__ import annotations

import argparse

import lablib
from lablib.measure import sweep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="llama.cpp,transformers,mlx")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="also append the rows to this .jsonl/.parquet file")
    ns = ap.parse_args(argv)

    model = lablib.prepare()
    df = sweep.concurrency_sweep(
        model,
        engines=ns.engines,
        concurrency=ns.concurrency,
        modes=("serial", "batched"),
        prompt_tokens=ns.prompt_tokens,
        max_new_tokens=ns.max_new_tokens,
        out=ns.out,
        progress=False,
    )
    table = lablib.run_table(df)
    cols = [
        "engine",
        "mode",
        "concurrency",
        "requests",
        "output_tps",
        "requests_per_s",
        "queue_p50_s",
        "ttft_p50_s",
        "ttft_p95_s",
        "tpot_p50_s",
        "e2e_p50_s",
    ]
    print(f"\n{ns.prompt_tokens}-token prompts, {ns.max_new_tokens} output tokens, R = 2 x C requests per run")
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print()
    for r in table.itertuples():
        print(
            f"engine={r.engine} mode={r.mode} c={r.concurrency} output_tps={r.output_tps:.2f} "
            f"ttft_p50_s={r.ttft_p50_s:.3f}"
        )


if __name__ == "__main__":
    main()
