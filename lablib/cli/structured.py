"""`lablib structured`: structured output measured without a notebook (lab 10).

    lablib structured --engine E [--schema FILE_OR_NAME ...] [--regex PATTERN] [--max-new-tokens N] [--reps N]
                      [--model M] [--out FILE]

Each schema (default: the budget's shipped schemas) and the regex: a first constrained request, cached ones and
free ones of the same prompt; one line per engine x schema (:mod:`lablib.studies.decoding.structured`). A server
engine is started by the lab for the run (``--engine llama-server`` or ``vllm``).
"""

from __future__ import annotations

HELP = "structured output: a JSON schema or regex enforced per request, its compile time, TPOT and valid share"


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help="llama.cpp, transformers, llama-server or vllm")
    p.add_argument("--schema", nargs="*", default=None, help="schema files or shipped names (person, order, weather)")
    p.add_argument("--regex", default=None, help="also a regular expression the whole output must match")
    p.add_argument("--max-new-tokens", type=int, default=None, help="output budget per request, tokens")
    p.add_argument("--reps", type=int, default=None, help="cached constrained and free requests per schema")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="results file, .jsonl or .parquet (rows appended)")


def run(ns) -> int:
    from lablib.engines.base import Constraint
    from lablib.studies.decoding.structured import run_engine, structured_table

    constraints = list(ns.schema) if ns.schema else None
    if ns.regex:
        constraints = (constraints or []) + [Constraint.regex(ns.regex)]
    rows = run_engine(ns.engine, constraints, ns.max_new_tokens, ns.reps, model=ns.model, out=ns.out)
    for r in structured_table(rows).to_dict("records"):
        print(
            f"engine={r['engine']} schema={r['schema']} compile_first_s={r['compile_first_s']:.4f} "
            f"compile_cached_s={r['compile_cached_s']:.4f} ({r['compile_source']}) ttft_free_s={r['ttft_free_s']:.4f} "
            f"ttft_constrained_s={r['ttft_constrained_s']:.4f} tpot_free_s={r['tpot_free_s']:.4f} "
            f"tpot_constrained_s={r['tpot_constrained_s']:.4f} valid_free={r['valid_free']:.2f} "
            f"valid_constrained={r['valid_constrained']:.2f} requests={r['requests']}"
        )
    if ns.out:
        print(f"rows appended to {ns.out}")
    return 0
