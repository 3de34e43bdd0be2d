"""`lablib speculate`: speculative decoding through each engine's own implementation (lab 10).

    lablib speculate [--engine a,b] [--draft Q4_0,Q2_K] [--k 2,4] [--text prose,code,repetitive]
                     [--max-new-tokens N] [--reps N] [--parallel 1,2] [--model M] [--out FILE] [--json]

Each engine plain and speculating (llama.cpp: prompt lookup; transformers: assisted generation with a bfloat16
draft and prompt lookup; llama-server: an F16 target with lab 06's low-bit drafts; vllm: n-gram), greedy; prints
the speedup table (alpha, tokens per pass, measured and predicted speedup) and writes the rows
(:mod:`lablib.studies.decoding.speculative`).
"""

from __future__ import annotations

import json

HELP = "speculative decoding: acceptance, tokens per pass, measured and predicted speedup per engine x draft x k"


def add_arguments(p) -> None:
    p.add_argument("--engine", default=None, help="comma-separated engines and servers (default: the budget's)")
    p.add_argument("--draft", default=None, help="draft GGUF kinds for a GGUF server, e.g. Q4_0,Q2_K (or paths)")
    p.add_argument("--k", default=None, help="draft lengths, e.g. 2,4 (tokens drafted per step)")
    p.add_argument("--text", default=None, help="text kinds: prose, code, repetitive (comma-separated)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="output tokens per request (EOS ignored)")
    p.add_argument("--reps", type=int, default=None, help="requests per arm and text after a warm-up")
    p.add_argument("--parallel", default=None, help="streams in flight on a server, e.g. 1,2")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (rows appended as they finish)")
    p.add_argument("--json", action="store_true", help="the speedup table as JSON lines")


def keywords(ns) -> dict:
    """:func:`lablib.studies.decoding.speculative.run`'s keywords that are not the flags' names, as the flags."""
    return {"engines": "--engine", "drafts": "--draft", "ks": "--k", "texts": "--text"}


def run(ns) -> int:
    from lablib.checks import csv_list, whole
    from lablib.cli.common import flags
    from lablib.studies.decoding.speculative import format_table, run, speedup_table

    parallel = None
    if ns.parallel:
        parallel = [
            whole(x, "parallel", "whole numbers of streams, at least 1", strings=True)
            for x in csv_list(ns.parallel, "parallel")
        ]
    rows = run(
        engines=ns.engine,
        drafts=ns.draft,
        ks=ns.k,
        texts=ns.text,
        parallel=parallel,
        log=lambda m: print(f"# {m}", flush=True),
        **flags(ns, "max_new_tokens", "reps", "model", "out"),
    )
    table = speedup_table(rows)
    if ns.json:
        for r in table:
            print(json.dumps(r, default=str))
    else:
        print(format_table(table))
    if ns.out:
        print(f"{len(rows)} rows appended to {ns.out}")
    return 0
