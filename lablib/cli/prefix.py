"""`lablib prefix`: prefix caching measured without a notebook (lab 08's experiments).

    lablib prefix [--engines a,b,c] [--shared-tokens 64,256] [--questions N] [--reps N]
                  [--max-new-tokens N] [--turns N] [--model M] [--out FILE] [--json]

A shared system prompt of S tokens and a question, TTFT with and without reuse of the system
turn's KV cache, and the bytes the kept cache holds; with ``--turns``, also a chat whose every turn
reuses the previous ones (:mod:`lablib.studies.prefix`).
"""

from __future__ import annotations

import json

from lablib.cli.common import flags

HELP = "prefix caching: TTFT with and without reuse of a shared system prompt's KV cache (lab 08)"


def add_arguments(p) -> None:
    p.add_argument("--engines", default=None, help="comma-separated (default: the lab's three in-process engines)")
    p.add_argument("--shared-tokens", default=None, help="system prompt lengths, e.g. 64,256 (default: the budget)")
    p.add_argument("--questions", type=int, default=None, help="different questions after the system prompt")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each question")
    p.add_argument("--max-new-tokens", type=int, default=None, help="output tokens per request")
    p.add_argument("--turns", type=int, default=0, help="also a chat of this many turns, previous turns reused or not")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (rows appended as they finish)")
    p.add_argument("--json", action="store_true", help="one JSON object")


def run(ns) -> int:
    from lablib.studies.prefix import report

    rep = report(
        **flags(ns, "engines", "shared_tokens", "questions", "reps", "max_new_tokens", "turns", "model", "out")
    )
    if ns.json:
        print(json.dumps(rep, default=str))
        return 0
    for r in rep["shared"]:
        print(
            f"engine={r['engine']} shared_tokens={r['shared_tokens']} reuse={r['reuse']} ttft_s={r['ttft_s']:.4f} "
            f"prompt_tokens={r['prompt_tokens']:.0f} cached_tokens={r['cached_tokens']:.0f} "
            f"evaluated_tokens={r.get('evaluated_tokens', float('nan')):.0f} n={r['n']}"
            + (f" speedup={r['speedup']:.2f}" if r["reuse"] else "")
        )
    for r in rep["memory"]:
        print(
            f"engine={r['engine']} kept_tokens={r['tokens']} kept_bytes={r['kept_bytes']} formula_bytes={r['formula_bytes']}"
        )
    for r in rep.get("chat", []):
        print(
            f"engine={r['engine']} turn={r['turn']} reuse={r['reuse']} ttft_s={r['ttft_s']:.4f} "
            f"prompt_tokens={r['prompt_tokens']:.0f} cached_tokens={r['cached_tokens']:.0f}"
        )
    if ns.out:
        print(f"rows appended to {ns.out}")
    return 0
