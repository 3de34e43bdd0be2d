"""The lab against llama.cpp's own tools, on the same work, in one process tree.

The anchors are ``llama-bench`` and ``llama-batched-bench``, built from the same source and
CMake flags as the lab's in-process library (``lablib.llama_build.llama_tool``). For each test
the anchor and the lab run in turn (``--rounds`` times, interleaved), with the same threads,
batch sizes, flash-attention setting and an empty KV cache; medians are compared.

- ``tg128@d0`` / ``tg128@d512``: 128 decode steps after a context of 0 / 512 tokens.
  llama-bench: its ``-n 128 -d D`` test. The lab: a prompt of max(D, 1) tokens, then 128 new
  tokens; decode tok/s = 1 / TPOT of that request.
- ``pp512``: a 512-token prompt. llama-bench ``-p 512``; the lab: prefill tok/s.
- ``B1``..``B8``: B sequences of 64 prompt tokens, 32 new tokens each, decoded together.
  llama-batched-bench: ``S_TG`` (generated tokens/s across the batch). The lab: a batched
  concurrency run with B clients and B requests; B / median TPOT.

Prints one line per test::

    anchor=llama-bench test=tg128@d0 lab_tps=X anchor_tps=Y ratio=R
    anchor=llama-batched-bench test=B4 lab_tps=X anchor_tps=Y ratio=R

    python benchmarks/anchors.py [--rounds 3] [--threads N] [--only tg128@d0,pp512,B4]

The machine is shared and noisy: the ratios of one run are the figure, not absolute tok/s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig, default_threads
from lablib.llama_build import llama_tool
from lablib.models import prepare
from lablib.workload import prompt_of_length

SINGLE = {"tg128@d0": (0, 128), "tg128@d512": (512, 128), "pp512": (512, 0)}  # test: (context, new tokens)
BATCHES = (1, 2, 4, 8)
PP, TG = 64, 32  # the batched test's prompt and output, tokens


def bench_anchor(gguf: str, test: str, threads: int, n_batch: int, flash: str) -> float:
    """llama-bench's tok/s for one test (its own average over -r 3)."""
    depth, new = SINGLE[test]
    args = ["-p", "512", "-n", "0"] if new == 0 else ["-p", "0", "-n", str(new), "-d", str(depth)]
    out = subprocess.run([str(llama_tool("llama-bench")), "-m", gguf, "-t", str(threads), "-b", str(n_batch),
                          "-ub", str(n_batch), "-fa", flash, "-r", "3", "-o", "jsonl", *args],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["avg_ts"]


def bench_lab(engine, test: str, reps: int = 3) -> float:
    depth, new = SINGLE[test]
    ids = prompt_of_length(engine.model, max(depth, 1))
    if new == 0:
        tps = [engine.generate(ids, GenerationConfig(max_new_tokens=1)).prefill_tps for _ in range(reps)]
    else:
        tps = [engine.generate(ids, GenerationConfig(max_new_tokens=new)).decode_tps for _ in range(reps)]
    return statistics.median(tps)


def batched_anchor(gguf: str, b: int, threads: int, n_batch: int, flash: str) -> float:
    """llama-batched-bench's S_TG (generated tokens/s over the whole batch) for B = b."""
    out = subprocess.run([str(llama_tool("llama-batched-bench")), "-m", gguf, "-t", str(threads),
                          "-c", str(b * (PP + TG) + 16), "-b", str(n_batch), "-ub", str(n_batch), "-fa", flash,
                          "-npp", str(PP), "-ntg", str(TG), "-npl", str(b), "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in (out.stdout + out.stderr).splitlines() if line.startswith("{")]
    return rows[-1]["speed_tg"]


def batched_lab(model, b: int, threads: int, n_batch: int) -> float:
    from lablib.concurrency import run_closed_loop

    engine = load_engine("llama.cpp", model, n_ctx=b * (PP + TG) + 16, n_seq_max=max(b, 1), threads=threads,
                         n_batch=n_batch)
    try:
        ids = [prompt_of_length(model, PP, offset=PP * i) for i in range(b)]
        traces = run_closed_loop(engine, ids, b, "batched", GenerationConfig(max_new_tokens=TG))
        return b / statistics.median(t.tpot_s for t in traces)
    finally:
        engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="anchor/lab alternations per test (median)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default=None, help="comma-separated tests (default: all)")
    args = ap.parse_args(argv)
    threads = args.threads or default_threads()
    model = prepare()
    gguf = model.path_for("gguf", "llama.cpp")
    engine = load_engine("llama.cpp", model, n_ctx=1024, threads=threads)
    n_batch, flash = engine.n_batch, engine.info().flags["flash_attn"]  # the anchors run as the lab does
    wanted = set(args.only.split(",")) if args.only else None
    for test in SINGLE:
        if wanted and test not in wanted:
            continue
        bench_lab(engine, test, reps=1)  # warm-up
        lab, anchor = [], []
        for _ in range(args.rounds):
            anchor.append(bench_anchor(gguf, test, threads, n_batch, flash))
            lab.append(bench_lab(engine, test))
        lab_tps, anchor_tps = statistics.median(lab), statistics.median(anchor)
        print(f"anchor=llama-bench test={test} lab_tps={lab_tps:.2f} anchor_tps={anchor_tps:.2f} "
              f"ratio={lab_tps / anchor_tps:.3f}", flush=True)
    engine.close()
    for b in BATCHES:
        if wanted and f"B{b}" not in wanted:
            continue
        lab, anchor = [], []
        for _ in range(args.rounds):
            anchor.append(batched_anchor(gguf, b, threads, n_batch, flash))
            lab.append(batched_lab(model, b, threads, n_batch))
        lab_tps, anchor_tps = statistics.median(lab), statistics.median(anchor)
        print(f"anchor=llama-batched-bench test=B{b} lab_tps={lab_tps:.2f} anchor_tps={anchor_tps:.2f} "
              f"ratio={lab_tps / anchor_tps:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
