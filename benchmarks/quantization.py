"""The quantization ladder of the default model, measured: one line per rung.

For each llama.cpp type (llama.cpp's own quantizer, from the F32 reference = the shipped Q4_1
dequantized): file bytes, bits per weight, perplexity on the lab's prose, mean KL divergence and
top-1 agreement against the reference (as llama-perplexity defines them), prefill and decode
tokens/s of one request (median of --reps). With --others, transformers (float32/bfloat16/float16)
and MLX (float32/8bit/4bit) against the same reference. With --cross-check, llama.cpp's
llama-perplexity --kl-divergence on the same text and chunks, for comparison.

The machine is shared: tokens/s are noisy; compare rungs measured in one run.

    python benchmarks/quantization.py [--types Q8_0,Q4_0] [--n-ctx 256] [--chunks 2]
        [--prompt-tokens 128] [--new-tokens 32] [--reps 1] [--others] [--cross-check] [--out FILE]

Prints ``type=T bytes=B bpw=X ppl=P kl_mean=K top1=A prefill_tps=S decode_tps=D engine=E``.
"""

from __future__ import annotations

import argparse
import sys

from lablib.studies import ladder, quality, quant
from lablib.ui.text import ladder_line


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(quant.LADDER))
    ap.add_argument("--n-ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--others", action="store_true", help="also transformers and MLX variants")
    ap.add_argument("--cross-check", action="store_true", help="also llama-perplexity --kl-divergence per rung")
    ap.add_argument("--out", default=None, help="rows to a .jsonl/.parquet file")
    ns = ap.parse_args()
    sizes = dict(
        n_ctx=ns.n_ctx, n_chunks=ns.chunks, prompt_tokens=ns.prompt_tokens, max_new_tokens=ns.new_tokens, reps=ns.reps
    )
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    rows = ladder.run_ladder(
        ns.types, out=ns.out, log=lambda m: None, on_row=lambda r: print(ladder_line(r), flush=True), **sizes
    )
    if ns.others:
        lad = ladder.Ladder(log=log, **sizes)
        for eng, variants in (("transformers", ladder.HF_DTYPES), ("mlx", ("float32", "8bit", "4bit"))):
            for v in variants:
                try:
                    row = ladder.engine_row(lad, eng, v)
                except Exception as e:  # e.g. float16 matmuls this CPU does not run
                    print(f"type={v} engine={eng} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                rows.append(row)
                print(ladder_line(row), flush=True)
    if ns.cross_check:
        from lablib.measure.workload import data_dir

        ref = rows[0]["reference_path"]
        print("\ncross-check with llama-perplexity --kl-divergence (-fa off, as the lab's engine runs):")
        for r in rows:
            if r["engine"] != "llama.cpp" or r["type"] == "F32":
                continue
            t = quality.llama_perplexity_kld(
                ref,
                r["path"],
                data_dir() / "text" / "prose.txt",
                ns.n_ctx,
                ns.chunks,
                quant.quant_home(r["model_sha256"]) / "kld",
            )
            print(
                f"type={r['type']} lab: ppl={r['ppl']:.4f} kl_mean={r['kl_mean']:.5f} top1={r['top1']:.4f} | "
                f"llama-perplexity: ppl={t.get('ppl', float('nan')):.4f} kl_mean={t.get('kl_mean', float('nan')):.5f} "
                f"top1={t.get('top1', float('nan')):.4f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
