"""`lablib replay`: a request trace replayed on an OpenAI-compatible server, on its own times and lengths.

    lablib replay (--base-url URL | --server NAME [--parallel N] [--threads T] [--n-ctx N])
                  [--trace FILE] [--format auto|mooncake|plain] [--start I] [--count N]
                  [--time-scale X] [--length-scale X] [--output-scale X] [--block-tokens B]
                  [--max-concurrency C] [--max-duration-s S] [--max-lag-s S]
                  [--client-processes N|auto] --out FILE

The trace (default: the first 1,000 requests of Mooncake's conversation trace, ``data/traces/``) is
scaled to the model and machine: times x ``--time-scale`` (0.1: ten times faster), prompt and output
lengths x ``--length-scale`` (outputs x ``--output-scale`` when given), prompts cut to the server's
context less the output, KV blocks of 512 x length-scale tokens unless ``--block-tokens``. Prompts are
the lab's prose, built so that requests sharing k leading block ids share exactly k blocks of tokens.
One tidy row per request (the bench's columns, the scheduled send time and its lag, the trace index and
block ids, the scale factors) is appended to ``--out`` as it finishes; one summary line is printed (as
``lablib bench``'s), then one replay line: lag p50/p99, kept up or not, requests not sent, the drain
after the last send, what a perfect prefix cache could reuse. A lag p99 above ``--max-lag-s`` (50 ms)
prints a warning: the lab did not send on the trace's times. ``--client-processes N`` spreads the requests over
N client processes on one start, as ``lablib bench`` does (request i from process i % N, on the trace's one
schedule; the rows merged into ``--out`` with their ``client_process``; one more line: each process's share and
headroom). The run is
:func:`lablib.measure.replay.run_replay`; this module parses the flags and prints.
"""

from __future__ import annotations

import sys

from lablib.children import first_interrupt_only
from lablib.cli.common import GOODPUT_KEYWORDS, add_goodput_targets, flags, goodput_targets

HELP = "replay a request trace (default: Mooncake's, scaled) on an OpenAI-compatible server, rows to --out"


def add_arguments(p) -> None:
    from lablib.measure.replay import MAX_LAG_S

    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--base-url", help="a running server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    g.add_argument("--server", help="start this server on the lab's model for the run (e.g. llama-server)")
    # None: not given (refused with --base-url: a running server keeps its own); run_replay's defaults apply
    p.add_argument("--parallel", type=int, default=None, help="--server: slots decoded together (default 1)")
    p.add_argument("--threads", type=int, default=None, help="--server: CPU threads")
    p.add_argument("--n-ctx", type=int, default=None, help="--server: context per slot, tokens (default 1024)")
    p.add_argument(
        "--model",
        default=None,
        help="--base-url: the model id requests name, one the server lists at GET /v1/models (default: its first; "
        "rows record it as server_model)",
    )
    p.add_argument("--lab-model", default=None, help="the lab's model whose tokenizer makes prompts (default: SmolLM2)")
    p.add_argument("--api", default="completions", choices=["completions", "chat", "native"])
    p.add_argument("--trace", default=None, help="trace file (default: the shipped Mooncake slice)")
    p.add_argument("--format", default="auto", choices=["auto", "mooncake", "plain"], help="the trace's format")
    p.add_argument("--start", type=int, default=0, help="the first request of the slice (file order, 0-based)")
    p.add_argument("--count", type=int, default=100, help="requests in the slice (default 100)")
    p.add_argument("--time-scale", type=float, default=1.0, help="replay seconds per trace second (0.1: 10x faster)")
    p.add_argument("--length-scale", type=float, default=1 / 32, help="prompt tokens per trace token (default 1/32)")
    p.add_argument("--output-scale", type=float, default=None, help="output tokens per trace token (default: length)")
    p.add_argument("--block-tokens", type=int, default=None, help="tokens per block id (default: 512 x length scale)")
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight (the lab queues)")
    p.add_argument("--max-duration-s", type=float, default=300.0, help="time limit of the run")
    p.add_argument("--max-lag-s", type=float, default=MAX_LAG_S, help="schedule lag p99 above this: not kept up")
    p.add_argument("--read-timeout-s", type=float, default=60.0)
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests first")
    p.add_argument(
        "--client-processes",
        default="1",
        help="client processes sharing the replay's requests, on one clock (request i from process i %% N); 'auto': "
        "one per 128 of --max-concurrency, at most the cores less one (default 1)",
    )
    add_goodput_targets(p)
    p.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")


def keywords(ns) -> dict:
    """:func:`lablib.measure.replay.run_replay`'s keywords that are not the flags' names, as the flags."""
    return {
        "fmt": "--format",
        "model": "--lab-model",
        "server_model": "--model",
        "concurrency": "--max-concurrency",
        **GOODPUT_KEYWORDS,
    }


def replay_line(s: dict) -> str:
    """The replay's own numbers of a summary (:func:`lablib.measure.replay.replay_summary`), key=value."""

    def ms(x):
        return "-" if x is None else f"{x * 1e3:.1f}"

    def sec(x):
        return "-" if x is None else f"{x:.2f}"

    return (
        f"replay requests={s['requests']}/{s['scheduled']} not_sent={s['not_sent']} "
        f"lag_p50_ms={ms(s['schedule_lag_p50_s'])} lag_p99_ms={ms(s['schedule_lag_p99_s'])} "
        f"kept_up={'yes' if s['kept_up'] else 'no'} span_s={sec(s['schedule_span_s'])} drain_s={sec(s['drain_s'])} "
        f"output_count_ok={s['output_count_ok']} capped={s['capped']} block_tokens={s['block_tokens']} "
        f"perfect_reuse={s['perfect_reuse_fraction']:.3f} time_scale={s['time_scale']:g} "
        f"length_scale={s['length_scale']:g} output_scale={s['output_scale']:g} "
        f"client_lag_p99_ms={ms((s.get('client_headroom') or {}).get('loop_lag_p99_s'))}"
    )


def run(ns) -> int:
    # SIGTERM the same way out as Ctrl-C (lablib.cli.main says which came and what is on disk), and only the first
    # one: before, a SIGTERM killed the lab outright, its server (--server) left to its death signal (vLLM's workers
    # to themselves), and a second signal broke the writing of the rows in flight and the server's stop
    with first_interrupt_only():
        return _run(ns)


def _run(ns) -> int:
    from lablib.cli.bench import _whole_arg
    from lablib.errors import LabError
    from lablib.measure.replay import run_replay
    from lablib.ui.text import processes_line, stream_note, summary_line

    given = [
        f"--{k.replace('_', '-')} {v}" for k in ("parallel", "threads", "n_ctx") if (v := getattr(ns, k)) is not None
    ]
    if ns.base_url is not None and given:  # dropped without a word otherwise (as bench refuses --max-concurrency)
        raise LabError(
            f"{', '.join(given)} with --base-url: these set up the server `lablib replay --server NAME` starts; "
            "a running server keeps its own slots, threads and context: leave them out, or let the lab start "
            "the server (--server NAME instead of --base-url)"
        )

    s = run_replay(
        fmt=ns.format,
        model=ns.lab_model,
        server_model=ns.model,
        concurrency=ns.max_concurrency,
        **flags(ns, "out", "trace", "start", "count", "time_scale", "length_scale", "output_scale", "block_tokens"),
        **flags(ns, "base_url", "server", "parallel", "threads", "n_ctx", "api", "max_duration_s", "read_timeout_s"),
        **flags(ns, "warmup", "max_lag_s"),
        **goodput_targets(ns),
        client_processes=ns.client_processes if ns.client_processes == "auto" else _whole_arg(ns.client_processes),
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(summary_line(s["server"], "open", None, ns.max_concurrency, s), flush=True)
    if note := stream_note(s):
        print(f"lablib replay: {note}", file=sys.stderr, flush=True)
    print(replay_line(s), flush=True)
    if s.get("client_processes"):
        print(processes_line(s["client_processes"]), flush=True)
    print(f"{s['requests']} rows appended to {ns.out} ({s['errors']} failed)")
    return 0 if s["errors"] == 0 else 1
