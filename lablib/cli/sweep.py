"""`lablib sweep context|concurrency ...`: a sweep, rows appended to --out, a table printed."""

from __future__ import annotations

from lablib.checks import csv_text
from lablib.cli.common import ctrl_c_also_cancels, flags, quick_full
from lablib.config import budget
from lablib.engines import NAMES
from lablib.errors import LabError
from lablib.measure import sweep
from lablib.measure.closed_loop import SCHEDULING_MODES
from lablib.results.schema import METRICS
from lablib.results.store import _suffix, runs_path
from lablib.results.tables import run_table

HELP = "sweep context length or concurrency; rows appended to --out"


def add_arguments(p) -> None:
    p.add_argument("kind", choices=["context", "concurrency"])
    p.add_argument(
        "--engines",
        default=None,
        help=f"comma-separated (default: those of {','.join(NAMES)} that can read the model; lablib doctor --model "
        "says which)",
    )
    p.add_argument("--model", default=None)
    p.add_argument(
        "--prompt-tokens",
        default=None,
        help="context: lengths such as 64,256,1024, default log-spaced to the trained context "
        f"({csv_text(budget('context', 'prompt_tokens', True))} in quick mode); concurrency: one length, "
        f"default {quick_full('concurrency', 'prompt_tokens')}",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"output tokens per request; default: context {quick_full('context', 'max_new_tokens')}, "
        f"concurrency {quick_full('concurrency', 'max_new_tokens')}",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"context: repetitions per length, default {quick_full('context', 'reps')}",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"concurrency: client counts, default {quick_full('concurrency', 'concurrency')}",
    )
    p.add_argument(
        "--mode", default=",".join(SCHEDULING_MODES), help="concurrency: serial, batched, or serial,batched (default)"
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"concurrency: requests per level (default {budget('concurrency', 'requests_per_client')} x C)",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="weight choices per engine, e.g. openvino=source,onnxruntime-genai=int4 (default: each engine's own)",
    )
    p.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="the machine's price for one hour (any currency): each point's cost per million output tokens, in "
        "the run records beside --out (name.runs.jsonl for name.jsonl), with the machine's own counters (GPU through NVML, CPU energy through RAPL)",
    )
    p.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def keywords(ns) -> dict:
    """The sweeps' keywords that are not the flags' names, as the flags (:func:`lablib.cli.in_flags`)."""
    return {"modes": "--mode"}


def run(ns) -> int:
    _suffix(ns.out)  # refuse a bad file name before any work
    common = dict(
        progress=not ns.quiet,
        **flags(ns, "model", "engines", "max_new_tokens", "warmup", "out", "weights", "price_per_hour"),
    )
    if ns.kind == "context":
        with ctrl_c_also_cancels() as cancel:
            df = sweep.context_sweep(prompt_tokens=ns.prompt_tokens, reps=ns.reps, cancel=cancel, **common)
        cols = ["engine", "prompt_tokens", "repetition", *(m for m in METRICS if m != "queue_s")]
        table = df[cols] if len(df) else df
    else:
        n_prompt = sweep.positive_ints(ns.prompt_tokens, "prompt_tokens") if ns.prompt_tokens else [None]
        if len(n_prompt) != 1:
            raise LabError(f"--prompt-tokens {ns.prompt_tokens}: a concurrency sweep takes one prompt length")
        with ctrl_c_also_cancels() as cancel:
            df = sweep.concurrency_sweep(
                concurrency=ns.concurrency,
                modes=ns.mode,
                requests=ns.requests,
                prompt_tokens=n_prompt[0],
                cancel=cancel,
                **common,
            )
        table = run_table(df) if len(df) else df
    print(table.to_string(index=False) if len(table) else "no rows")
    print(f"{len(df)} rows appended to {ns.out}; each point's counters and cost in {runs_path(ns.out)}")
    return 0
