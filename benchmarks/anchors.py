"""The lab against llama.cpp's own tools, on the same work, in one process tree.

The anchors (``llama-bench``, ``llama-batched-bench``) are built from the same source and CMake
flags as the lab's in-process library and run with the lab engine's threads, batch sizes and
flash-attention setting (:mod:`lablib.studies.anchors` defines each test). The anchor and the lab run in
turn, ``--rounds`` times, interleaved; medians are compared. Prints one line per test::

    anchor=llama-bench test=tg128@d0 lab_tps=X anchor_tps=Y ratio=R
    anchor=llama-batched-bench test=B4 lab_tps=X anchor_tps=Y ratio=R

    python benchmarks/anchors.py [--rounds 3] [--threads N] [--only tg128@d0,pp512,B4]

The machine is shared and noisy: the ratios of one run are the figure, not absolute tok/s.
"""

from __future__ import annotations

import argparse
import statistics

from lablib.engines import load_engine
from lablib.machine.threads import default_threads
from lablib.model.resolve import prepare
from lablib.studies.anchors import SINGLE, batched_bench, lab_batched, lab_single, llama_bench

BATCHES = (1, 2, 4, 8)
PP, TG = 64, 32  # the batched test's prompt and output, tokens


def line(anchor: str, test: str, lab: list[float], ref: list[float]) -> str:
    """Medians of both, and the median of the per-round ratios (each round ran anchor then lab,
    back to back: the machine's drift cancels within a round)."""
    lab_tps, anchor_tps = statistics.median(lab), statistics.median(ref)
    ratio = statistics.median(a / b for a, b in zip(lab, ref))
    return f"anchor={anchor} test={test} lab_tps={lab_tps:.2f} anchor_tps={anchor_tps:.2f} ratio={ratio:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="anchor/lab alternations per test (median)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default=None, help="comma-separated tests (default: all)")
    args = ap.parse_args(argv)
    threads = args.threads or default_threads()
    model = prepare()
    gguf = model.path_for("gguf", "llama.cpp")
    wanted = set(args.only.split(",")) if args.only else None
    for test, (depth, new) in SINGLE.items():
        if wanted and test not in wanted:
            continue
        # the same context as llama-bench gives itself (prompt + depth + generated tokens), so
        # attention spans the same KV cells
        engine = load_engine("llama.cpp", model, n_ctx=max(depth, 1) + max(new, 1), threads=threads)
        n_batch, flash = engine.n_batch, engine.info().flags["flash_attn"]  # the anchors run as the lab does
        lab_single(engine, test, reps=1)  # warm-up
        lab, ref = [], []
        for _ in range(args.rounds):
            ref.append(llama_bench(gguf, test, threads, n_batch, flash))
            lab.append(lab_single(engine, test))
        engine.close()
        print(line("llama-bench", test, lab, ref), flush=True)
    for b in BATCHES:
        if wanted and f"B{b}" not in wanted:
            continue
        lab, ref = [], []
        for _ in range(args.rounds):
            ref.append(batched_bench(gguf, [b], PP, TG, threads)[b])
            lab.append(lab_batched(model, b, PP, TG, threads))
        print(line("llama-batched-bench", f"B{b}", lab, ref), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
