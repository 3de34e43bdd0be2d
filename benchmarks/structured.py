"""The structured-output table (lab 10): engine x schema, the grammar's compile time (first request, cached), TTFT
and TPOT without and with the constraint (medians, seconds), and the share of outputs that validate (jsonschema)
without and with it. One run; the machine's noise is in every number, so read ratios, not digits.

    .venv/bin/python benchmarks/structured.py [--engines llama.cpp,transformers,llama-server,vllm] [--reps N]
"""

import argparse
import sys

from lablib.studies.decoding.structured import run_engine, structured_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="llama.cpp,transformers,llama-server")
    ap.add_argument("--schemas", default="person,order,weather")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ns = ap.parse_args()
    from lablib.engines.base import Constraint
    from lablib.studies.decoding.structured import REGEX

    constraints = ns.schemas.split(",") + [Constraint.regex(REGEX, "product_code")]
    rows = []
    for name in ns.engines.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows += run_engine(name, constraints, ns.max_new_tokens, ns.reps)
    table = structured_table(rows)
    cols = [
        "engine", "schema", "compile_source", "compile_first_s", "compile_cached_s", "ttft_free_s",
        "ttft_constrained_s", "tpot_free_s", "tpot_constrained_s", "tpot_ratio", "valid_free", "valid_constrained",
    ]  # fmt: skip
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))


if __name__ == "__main__":
    main()
