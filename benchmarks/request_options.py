"""What each request option the lab adds costs the server: a plain request against the lab's own.

To count tokens per chunk exactly the lab asks servers for more than a plain OpenAI request: llama-server
for ``verbose`` (each chunk's native form with its token id; the lab's choice) rather than per-token ``logprobs``
(the lab's choice before) or per-chunk ``timings_per_token`` (a cumulative ``predicted_n``), vLLM for ``return_token_ids`` and ``stream_options.continuous_usage_stats``. Each may
cost the server time per token (llama-server's logprobs build a probability list per token). This
benchmark starts the servers the lab starts (llama-server with one slot, vLLM with the test suite's
configuration), and sends the same distinct prompts serially (concurrency 1, fixed output length) with
each variant of the request, interleaved (A B C A B C ...), so a busy machine slows all alike. Every
variant's count is exact (the server's final usage at least), so TPOT is over the same tokens.

Prints one line per (server, variant): medians over rounds of TTFT and TPOT, and the median of the
per-round ratios variant / plain (1.00: no cost). The lab's own variant per server is marked.

    python benchmarks/request_options.py [--servers llama-server,vllm] [--rounds 5] [--requests 6]
        [--prompt-tokens 128] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.http.protocol import PROFILES
from lablib.engines.servers import start_server
from lablib.machine.identity import load_average
from lablib.measure.load import run_load
from lablib.measure.workload import distinct_prompts
from lablib.model.resolve import prepare


def variants(server: str) -> dict:
    """variant name -> the profile its requests are made with ("plain" first: no counting option)."""
    lab = PROFILES[server]
    if server == "llama-server":
        plain = replace(lab, logprobs=False, extra={"cache_prompt": False})
        return {
            "plain": plain,
            "+logprobs": replace(plain, logprobs=True),
            "+timings_per_token": replace(plain, extra={**plain.extra, "timings_per_token": True}),
            "+verbose": replace(plain, extra={**plain.extra, "verbose": True}),
        }
    if server == "vllm":
        plain = replace(lab, extra={}, chunk_usage=False)
        return {
            "plain": plain,
            "+return_token_ids": replace(plain, extra={"return_token_ids": True}),
            "+continuous_usage_stats": replace(plain, chunk_usage=True),
        }
    raise SystemExit(f"--servers: {server!r} has no variants here; expected llama-server or vllm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="llama-server,vllm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    model = prepare()
    cfg = GenerationConfig(max_new_tokens=a.new_tokens)
    print(f"load average at start: {load_average()}")
    for name in a.servers.split(","):
        kinds = variants(name)
        srv = start_server(name, model, parallel=1 if name == "llama-server" else 2, n_ctx=512, log=print)
        try:
            e = load_engine("http", model, base_url=srv.base_url)
            prompts = distinct_prompts(model, a.prompt_tokens, 1 + a.rounds * len(kinds) * a.requests)
            e.generate(prompts.pop(), cfg)  # warm-up
            got = {k: {"ttft": [], "tpot": [], "method": set()} for k in kinds}
            for _ in range(a.rounds):
                for k, profile in kinds.items():
                    e.profile = profile
                    batch = [prompts.pop() for _ in range(a.requests)]
                    rows = run_load(e, batch, "closed", concurrency=1, cfg=cfg, max_duration_s=600)
                    ok = [x for x in rows if not x.get("error")]
                    if len(ok) != len(rows) or any(x["output_tokens"] != a.new_tokens for x in ok):
                        raise SystemExit(f"{name} {k}: {len(rows) - len(ok)} errors or a wrong count: {rows[:1]}")
                    got[k]["ttft"].append(statistics.median(x["ttft_s"] for x in ok))
                    got[k]["tpot"].append(statistics.median(x["tpot_s"] for x in ok))
                    got[k]["method"] |= {x["count_method"] for x in ok}
            e.close()
        finally:
            srv.stop()
        lab = _lab_variant(name, kinds)
        base = got["plain"]
        for k, g in got.items():
            ttft_r = statistics.median(v / b for v, b in zip(g["ttft"], base["ttft"]))
            tpot_r = statistics.median(v / b for v, b in zip(g["tpot"], base["tpot"]))
            print(
                f"{name:13s} {k:25s} TTFT {statistics.median(g['ttft']) * 1e3:7.2f} ms  "
                f"TPOT {statistics.median(g['tpot']) * 1e3:7.3f} ms  ratio TTFT {ttft_r:.3f} TPOT {tpot_r:.3f}  "
                f"count {','.join(sorted(g['method']))}{'   <- the lab' if k == lab else ''}"
            )
    print(f"load average at end: {load_average()}")


def _lab_variant(server: str, kinds: dict) -> str | None:
    """The variant whose profile is the lab's own for ``server`` (None if none is)."""
    return next((k for k, p in kinds.items() if p == PROFILES[server]), None)


if __name__ == "__main__":
    main()
