"""`lablib lora`: what a LoRA adapter costs each engine, merged and unmerged, and many adapters on a server (lab 11).

    lablib lora [--engines a,b] [--servers llama-server,vllm] [--ranks 8,64] [--concurrency 1,4]
                [--prompt-tokens N] [--max-new-tokens N] [--reps N] [--model M] [--out FILE] [--json]

Each in-process engine without an adapter, then with the lab's adapter of each rank unmerged and merged; each
server with several adapters loaded, in a closed loop where all requests use the base model, the same adapter, or
each a different one (:mod:`lablib.studies.adapters`). Prints the cost table and the multi-LoRA table; the rows
go to ``--out``.
"""

from __future__ import annotations

import json

from lablib.cli.common import quick_full

HELP = "LoRA adapters: TTFT/TPOT/memory per engine x rank x merged/unmerged; multi-LoRA closed loops on servers"


def add_arguments(p) -> None:
    p.add_argument(
        "--engines", default=None, help=f"in-process engines ('' for none; default {quick_full('adapters', 'engines')})"
    )
    p.add_argument(
        "--servers",
        default=None,
        help=f"servers the lab starts ('' for none; default {quick_full('adapters', 'servers')})",
    )
    p.add_argument("--ranks", default=None, help=f"adapter ranks (default {quick_full('adapters', 'ranks')})")
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"clients of the servers' loops (default {quick_full('adapters', 'concurrency')})",
    )
    p.add_argument("--prompt-tokens", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None, help="output tokens per request (EOS ignored)")
    p.add_argument("--reps", type=int, default=None, help="requests per in-process arm after a warm-up")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (rows appended as they finish)")
    p.add_argument("--json", action="store_true", help="the two tables as JSON lines")


def run(ns) -> int:
    from lablib.cli.common import flags
    from lablib.studies.adapters import cost_table, format_cost_table, format_multi_table, multi_table, run

    rows = run(
        ranks=ns.ranks,
        concurrency=ns.concurrency,
        log=lambda m: print(f"# {m}", flush=True),
        **flags(ns, "engines", "servers", "prompt_tokens", "max_new_tokens", "reps", "model", "out"),
    )
    costs, multi = cost_table(rows), multi_table(rows)
    if ns.json:
        for r in costs + multi:
            print(json.dumps(r, default=str))
    else:
        if costs:
            print(format_cost_table(costs))
        if multi:
            print()
            print(format_multi_table(multi))
    if ns.out:
        print(f"{len(rows)} rows appended to {ns.out}")
    return 0
