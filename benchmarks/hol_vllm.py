"""Head-of-line blocking on vLLM (lab 09's experiment, on vLLM's own scheduler): two short streams decoding,
then one long prompt; vLLM's default token budget per step against ``--max-num-batched-tokens`` budgets
(its chunked prefill). Prints :func:`lablib.studies.scheduler.hol_table`, one column per budget.

    python benchmarks/hol_vllm.py [--budgets default,64] [--long-prompt-tokens 256]

Each budget is a vLLM start (1-2 minutes; a budget vLLM has not compiled here adds a few minutes: it is part
of its compile-cache key). Needs vLLM's environment (``make vllm``).
"""

import argparse

import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="default,64", help="tokens per step, comma-separated; default: vLLM's own")
    ap.add_argument("--long-prompt-tokens", type=int, default=256)
    args = ap.parse_args()
    model = lablib.prepare()
    runs = []
    for b in args.budgets.split(","):
        budget = None if b.strip() == "default" else int(b)
        srv = start_server(
            "vllm", model, parallel=3, n_ctx=512, threads=1, options={"max_num_batched_tokens": budget}, log=print
        )
        try:
            runs.append(scheduler.hol_blocking(srv, model, long_prompt_tokens=args.long_prompt_tokens))
        finally:
            srv.stop()
    print(scheduler.hol_table(runs).T.to_string())


if __name__ == "__main__":
    main()
