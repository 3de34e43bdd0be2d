"""`lablib bench --base-url URL ...`: load on any OpenAI-compatible server, closed or open loop.

    lablib bench --base-url URL [--model ID] [--api completions|chat] [--rate R | --concurrency C]
                 [--max-concurrency C] [--arrival poisson|constant|gamma] [--burstiness B] [--seed S]
                 --requests N --prompt-tokens P --max-new-tokens M [--prompts prose|random]
                 --out FILE [--max-duration-s S] [--read-timeout-s S] [--connect-timeout-s S]
                 [--request-timeout-s S]
                 [--ttft-target-s X] [--tpot-target-s X] [--e2e-target-s X]
                 [--client-processes N|auto] [--start-at TIME]

One tidy row per request (the sweeps' columns plus the HTTP ones) is written as each finishes, with
the server's name and version in every row's engine columns, and one summary line is printed per
rate (:func:`lablib.ui.text.summary_line`), with the server's own counters of the run under it when it
answers ``/metrics`` (:func:`lablib.ui.text.server_line`; its samples go to ``<out>.server.jsonl``).
Prompts are exact-length cuts of the lab's prose at different offsets, so no request shares a prefix
with another; ``--prompts random``: the ids of the prompts ``vllm bench serve --dataset-name random
--seed S`` sends (:func:`lablib.measure.workload.random_prompts`). The run is
:func:`lablib.measure.load.bench`; this module parses the flags and prints. Ctrl-C (SIGINT) or SIGTERM
stops it: the requests in flight are written as error rows, one line says how many rows of the run are in
``--out`` (none when it came before the first was written), exit code 130 / 143.
"""

from __future__ import annotations

import sys

from lablib.children import first_interrupt_only
from lablib.cli.common import GOODPUT_KEYWORDS, add_goodput_targets, flags, goodput_targets

HELP = "measure an OpenAI-compatible server: closed or open loop, rows to --out"


def add_arguments(p) -> None:
    p.add_argument("--base-url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument(
        "--model",
        default=None,
        help="the model id requests name, one the server lists at GET /v1/models (default: its first); rows record it "
        "as server_model, and as model the lab's model (--lab-model), whose tokenizer makes and counts the prompts",
    )
    p.add_argument("--lab-model", default=None, help="the lab's model whose tokenizer makes prompts (default: SmolLM2)")
    p.add_argument("--api", default="completions", choices=["completions", "chat", "native"])
    p.add_argument("--server", default="auto", help="server kind (default: asked from the server)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", help="open loop: requests per second ('inf': all at once); a sweep as 0.5,1,2")
    g.add_argument("--concurrency", type=int, help="closed loop: clients")
    p.add_argument("--max-concurrency", type=int, default=None, help="open loop: cap on requests in flight")
    p.add_argument("--arrival", default="poisson", help="open loop: constant, poisson or gamma")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, <1 burstier)")
    p.add_argument("--seed", type=int, default=0, help="the open loop's arrivals; --prompts random's prompts")
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--prompt-tokens", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument(
        "--prompts",
        default="prose",
        choices=["prose", "random"],
        help="prose: cuts of the lab's text; random: vllm bench's random dataset of --seed",
    )
    p.add_argument("--until-eos", action="store_true", help="stop at EOS (default: exactly N tokens)")
    p.add_argument("--max-duration-s", type=float, default=300.0, help="time limit of the run")
    p.add_argument("--read-timeout-s", type=float, default=60.0, help="longest silence within a response")
    p.add_argument("--connect-timeout-s", type=float, default=10.0, help="longest wait to open a connection")
    p.add_argument(
        "--request-timeout-s", type=float, default=600.0, help="longest one request may take ('inf': no limit)"
    )
    add_goodput_targets(p)
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests first")
    p.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="the machine's price for one hour (any currency): each run's cost per million output tokens at its load",
    )
    p.add_argument(
        "--start-at",
        default=None,
        help="start the (first) run at this time: Unix seconds or an ISO 8601 time with its zone, e.g. "
        "2026-12-05T10:00:00Z; the same on several client machines makes one run of them (lablib merge --one-clock)",
    )
    p.add_argument(
        "--client-processes",
        default="1",
        help="client processes sharing each run's streams, on one clock (a fast server at hundreds of streams "
        "outruns one); 'auto': one per 128 streams, at most the cores less one (default 1)",
    )
    p.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")


def keywords(ns) -> dict:
    """:func:`lablib.measure.load.bench`'s keywords that are not the flags' names, as the flags (its refusals
    said as the command line says them, :func:`lablib.cli.in_flags`)."""
    return {
        "rates": "--rate",
        "model": "--lab-model",
        "server_model": "--model",
        "concurrency": "--concurrency" if ns.rate is None else "--max-concurrency",
        "start_at_unix": "--start-at",
        **GOODPUT_KEYWORDS,
    }


def run(ns) -> int:
    """The run; on SIGINT (Ctrl-C) or SIGTERM the rows of the requests in flight are written (as errors)
    and one message counts the rows of the run on disk: exit code 128 + the signal's number (130, 143). Only the
    first one: a second one broke the writing of those rows (first_interrupt_only)."""
    import signal
    from pathlib import Path

    with first_interrupt_only():
        try:
            return _run(ns)
        except KeyboardInterrupt as e:
            name = e.args[0] if e.args and isinstance(e.args[0], str) else "SIGINT"
            n = getattr(e, "rows_written", 0)  # lablib.measure.load.bench counts them; none before it wrote one
            if n:
                said = (
                    f"{n} rows of this run are in {ns.out}: those of the requests that finished, and of those in "
                    "flight (as errors)"
                )
            elif Path(ns.out).exists():
                said = f"no rows were written to {ns.out} (its earlier rows are as they were)"
            else:
                said = f"no rows were written (the results file would be {ns.out}: it was not created)"
            print(f"lablib bench: interrupted by {name}; {said}: run it again to measure", file=sys.stderr, flush=True)
            return 128 + int(getattr(signal, name, signal.SIGINT))


def _run(ns) -> int:
    from lablib.errors import LabError
    from lablib.measure.load import bench
    from lablib.ui.text import processes_line, server_line, stream_note, summary_line

    if ns.rate is None and ns.max_concurrency is not None:
        raise LabError(
            f"--max-concurrency {ns.max_concurrency} with --concurrency {ns.concurrency}: --max-concurrency caps an "
            "open loop (--rate R); a closed loop's --concurrency is its number of clients: give one of the two"
        )

    def show(s):
        print(summary_line(s["server"], s["mode"], s["rate"], s["concurrency"], s), flush=True)
        if note := stream_note(s):
            print(f"lablib bench: {note}", file=sys.stderr, flush=True)
        if s["requests"] < ns.requests:  # the run's time limit came before the rest were sent: no rows of theirs
            print(
                f"lablib bench: {ns.requests - s['requests']} of {ns.requests} requests were not sent: the run reached "
                f"--max-duration-s {ns.max_duration_s:g} first (raise it, or a higher --rate / --concurrency sends them)",
                file=sys.stderr,
                flush=True,
            )
        if s.get("server_counters"):
            print(server_line(s["server_counters"]), flush=True)
        if s.get("client_processes"):
            print(processes_line(s["client_processes"]), flush=True)

    summaries = bench(
        rates=ns.rate,
        concurrency=ns.concurrency if ns.rate is None else ns.max_concurrency,
        model=ns.lab_model,
        server_model=ns.model,
        **flags(ns, "base_url", "out", "requests", "prompt_tokens", "max_new_tokens", "api", "server", "arrival"),
        **flags(ns, "burstiness", "seed", "until_eos", "max_duration_s", "read_timeout_s", "connect_timeout_s"),
        **flags(ns, "request_timeout_s", "warmup", "prompts"),
        start_at_unix=_unix_time(ns.start_at),
        price_per_hour=ns.price_per_hour,
        client_processes=ns.client_processes if ns.client_processes == "auto" else _whole_arg(ns.client_processes),
        **goodput_targets(ns),
        log=lambda m: print(m, file=sys.stderr),
        on_summary=show,
    )
    written = sum(s["requests"] for s in summaries)
    failed = sum(s["errors"] for s in summaries)
    print(f"{written} rows appended to {ns.out} ({failed} failed)")
    return 0 if failed == 0 else 1


def _whole_arg(text: str):
    """``--client-processes N``: N as a number when it is one (bench says what is wrong with it otherwise)."""
    try:
        return int(text)
    except ValueError:
        return text


def _unix_time(text: str | None) -> float | None:
    """``--start-at``: Unix seconds, or an ISO 8601 time with its zone; LabError naming what was given."""
    import datetime as dt

    from lablib.errors import LabError

    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        t = None
    if t is None or t.tzinfo is None:
        raise LabError(
            f"--start-at {text!r}: expected Unix seconds or an ISO 8601 time with its zone, e.g. 2026-12-05T10:00:00Z "
            "(the same moment on every client machine)"
        )
    return t.timestamp()
