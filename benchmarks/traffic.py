"""Lab 09's real-traffic experiments on llama-server and on vLLM, side by side: a slice of Mooncake's trace
replayed on its own send times (send lag, TTFT, the perfect-cache bound), the same slice with prefix caching
on and off (the server's own hits beside the bounds), and multi-turn chats on and off (TTFT and cached
tokens by turn). Prints one table per experiment, one column (or block of rows) per server.

    python benchmarks/traffic.py [--servers llama-server,vllm] [--full]

Sizes: lab 09's budgets (``BUDGETS["scheduler"]``: quick unless ``--full``). llama-server: 2 slots, 1024
tokens each; vLLM: 2 sequences of 512 tokens, prefix caching on (its "off" arm salts every request,
:func:`lablib.studies.scheduler._arm_engine`), 1 thread each; a fresh server for each experiment. A vLLM start
takes 1-2 minutes (a first start compiles for a few more); needs vLLM's environment (``make vllm``).
"""

import argparse
import contextlib

import pandas as pd

import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

REPLAY_VIEW = ("requests", "errors", "schedule_lag_p99_s", "kept_up", "drain_s", "ttft_p50_s", "ttft_p99_s")
REPLAY_VIEW += ("perfect_reuse_fraction", "length_scale", "block_tokens")


@contextlib.contextmanager
def fresh(name: str, model):
    """A server started for one experiment and stopped after it."""
    if name == "vllm":
        srv = start_server("vllm", model, parallel=2, n_ctx=512, threads=1, prefix_caching=True, log=print)
    else:
        srv = start_server(name, model, parallel=2, n_ctx=1024, threads=1)
    try:
        yield srv
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="llama-server,vllm", help="comma-separated: llama-server, vllm")
    ap.add_argument("--full", action="store_true", help="lab 09's full budgets instead of its quick ones")
    args = ap.parse_args()
    model = lablib.prepare()
    d = scheduler.quick_defaults(quick=not args.full)
    replays, reuses, chats = {}, [], []
    for name in [s.strip() for s in args.servers.split(",") if s.strip()]:
        # a fresh server for each experiment: what one left in a server's cache (llama-server keeps prompts in
        # host memory even for requests sent with cache_prompt false) would be reused by the next one's "on" arm
        with fresh(name, model) as srv:
            _rows, _samples, summary = scheduler.trace_replay(
                srv, model, start=d["replay_start"], count=d["replay_count"], length_scale=d["replay_length_scale"]
            )
        replays[name] = {k: summary.get(k) for k in REPLAY_VIEW}
        with fresh(name, model) as srv:
            _rows, reuse = scheduler.prefix_reuse(
                srv, model, start=d["replay_start"], count=d["reuse_count"], length_scale=d["replay_length_scale"]
            )
        reuses.append(reuse[list(scheduler.REUSE_VIEW)])
        with fresh(name, model) as srv:
            _rows, turns = scheduler.multi_turn(
                srv,
                model,
                n_sessions=d["chat_sessions"],
                turns=d["chat_turns"],
                system_tokens=d["chat_system_tokens"],
                question_tokens=d["chat_question_tokens"],
                answer_tokens=d["chat_answer_tokens"],
                think_time_s=d["chat_think_s"],
            )
        chats.append(turns.assign(server=name))
    pd.set_option("display.width", 200)
    print("\n== the Mooncake slice replayed on its send times\n" + pd.DataFrame(replays).to_string())
    print("\n== prefix caching on and off, the server's hits beside the bounds\n")
    print(pd.concat(reuses, ignore_index=True).T.to_string())
    print("\n== multi-turn chats, by turn\n" + pd.concat(chats, ignore_index=True).to_string(index=False))


if __name__ == "__main__":
    main()
