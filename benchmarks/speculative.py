"""Speculative decoding, engine x draft x draft length: what it buys here, measured beside what its acceptance predicts.

Each engine runs greedy requests plain and speculating with its own implementation
(:mod:`lablib.studies.decoding.speculative`): llama.cpp's prompt lookup in-process, transformers' assisted
generation (a bfloat16 copy of the model as the draft) and prompt lookup, llama-server with an F16 target and
lab 06's low-bit drafts (Q4_0, Q2_K), with 1 and 2 streams in flight; vllm (n-gram) and mlx (mlx-lm's own
speculative decoding, the model's decoder layers quantized to 8 bits by mlx-lm as the draft) when named. Prints the
speedup table: alpha (accepted / drafted, the engine's own counters), tokens per target pass, the measured TPOT
speedup, the one Leviathan et al. (2023) predict from alpha, k and the draft's cost c, and their ratio::

    python benchmarks/speculative.py [--engines llama.cpp,transformers,llama-server,mlx] [--k 2,4]
        [--drafts Q4_0,Q2_K] [--texts prose,code,repetitive] [--max-new-tokens 32] [--reps 2]
        [--parallel 1,2] [--out FILE]

The machine is shared and noisy: the ratios of one run are the figure, not absolute tokens/s.
"""

from __future__ import annotations

import argparse
import time

from lablib.studies.decoding.speculative import format_table, position_table, run, speedup_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="llama.cpp,transformers,llama-server")
    ap.add_argument("--k", default="2,4")
    ap.add_argument("--drafts", default="Q4_0,Q2_K")
    ap.add_argument("--texts", default="prose,code,repetitive")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--parallel", default="1,2")
    ap.add_argument("--out", default=None, help="also append the rows to this results file")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = run(
        engines=a.engines,
        drafts=a.drafts,
        ks=a.k,
        texts=a.texts,
        max_new_tokens=a.max_new_tokens,
        reps=a.reps,
        parallel=[int(x) for x in a.parallel.split(",")],
        quick=False,
        out=a.out,
        log=lambda m: print(f"# {m}", flush=True),
    )
    print(format_table(speedup_table(rows)))
    pos = position_table(rows)
    if pos:
        print("\nacceptance by position (share of drafts accepted at position j = 1..k):")
        seen: dict = {}
        for r in pos:
            key = (r["engine"], r["spec_method"], r["draft"], r["k"], r["text_kind"])
            seen.setdefault(key, []).append(f"{r['accepted_share']:.2f}")
        for key, shares in seen.items():
            print(f"  {' '.join(map(str, key))}: {' '.join(shares)}")
    print(f"\n{len(rows)} requests in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
