"""`lablib prefix`: prefix caching measured without a notebook (lab 08's experiments).

    lablib prefix [--engines a,b,c] [--shared-tokens 64,256] [--questions N] [--reps N]
                  [--max-new-tokens N] [--turns N] [--model M] [--out FILE] [--json]

A shared system prompt of S tokens and a question, TTFT with and without reuse of the system
turn's KV cache, and the bytes the kept cache holds; with ``--turns``, also a chat whose every turn
reuses the previous ones (:mod:`lablib.studies.prefix`).
"""

from __future__ import annotations

import json


def prefix_report(
    engines=None, shared_tokens=None, questions=None, reps=None, max_new_tokens=None, turns=0, model=None, out=None
) -> dict:
    """{"shared": [one dict per engine, shared_tokens and reuse: medians of ttft_s, prefill_s, prompt,
    cached and evaluated tokens, n, speedup], "memory": [per engine and length: kept_bytes,
    formula_bytes...], "chat": [per engine, turn and reuse, as "shared"] (with ``turns``)}."""
    from lablib.studies import prefix
    from lablib.results import tables
    from lablib.engines import NAMES
    from lablib.model.resolve import prepare

    rm = prepare(model, log=lambda *_: None)
    names = engines or NAMES
    df = prefix.shared_prefix(
        rm,
        engines=names,
        shared_tokens=shared_tokens,
        questions=questions,
        reps=reps,
        max_new_tokens=max_new_tokens,
        out=out,
        progress=False,
    )
    report = {
        "shared": tables.prefix_medians(df).to_dict("records"),
        "memory": prefix.memory_table(df, rm).to_dict("records"),
    }
    if turns:
        ch = prefix.chat(rm, engines=names, turns=turns, out=out, progress=False)
        report["chat"] = tables.prefix_medians(ch, "prefix_chat").to_dict("records")
    return report


def cmd_prefix(ns) -> int:
    rep = prefix_report(
        engines=ns.engines,
        shared_tokens=ns.shared_tokens,
        questions=ns.questions,
        reps=ns.reps,
        max_new_tokens=ns.max_new_tokens,
        turns=ns.turns,
        model=ns.model,
        out=ns.out,
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


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "prefix", help="prefix caching: TTFT with and without reuse of a shared system prompt's KV cache (lab 08)"
    )
    p.add_argument("--engines", default=None, help="comma-separated (default: the lab's three in-process engines)")
    p.add_argument("--shared-tokens", default=None, help="system prompt lengths, e.g. 64,256 (default: the budget)")
    p.add_argument("--questions", type=int, default=None, help="different questions after the system prompt")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each question")
    p.add_argument("--max-new-tokens", type=int, default=None, help="output tokens per request")
    p.add_argument("--turns", type=int, default=0, help="also a chat of this many turns, previous turns reused or not")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (rows appended as they finish)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_prefix)
