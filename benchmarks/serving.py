"""Serving: what the HTTP client costs, what HTTP and a server add, and load shapes per server.

1. Client overhead: the http engine streams ``--overhead-tokens`` one-token chunks from a
   scripted aiohttp server in this process, as fast as it can send them; prints
   ``client_overhead_us_per_token=X`` (client and scripted server together: an upper bound).
2. For each server in ``--servers`` (started here on the lab's model, one thread each):
   the in-process twin against the same server (llama.cpp vs llama-cpp-python's server,
   mlx vs mlx_lm.server): TTFT and TPOT of one request each way; then a closed loop at
   C = 1 and 2, and an open loop with Poisson arrivals at ``--rate``; one line per run,
   ``server=NAME mode=MODE rate=R c=C output_tps=X ttft_p50_s=Y goodput=Z``
   (goodput: requests/s meeting ``--ttft-target-s`` and ``--tpot-target-s``).
3. For llama-server (when ``lablib.build.llama.llama_tool`` can build it):
   ``server=llama-server client_vs_server_decode_ratio=R``, the lab's decode tok/s over the
   server's own ``timings.predicted_per_second`` (1.0: the client sees what the server did).

Figures on a shared 2-core machine are noisy: read them as orders of magnitude.

    python benchmarks/serving.py [--servers llama-cpp-python,mlx,llama-server] [--requests 6] [--rate 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time

import lablib
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.servers import SERVERS, start_server
from lablib.errors import LabError
from lablib.measure.load import run_load, summarize
from lablib.measure.workload import prompt_of_length
from lablib.ui.text import summary_line


def client_overhead(model, n_tokens: int) -> float:
    """Microseconds per token for the http engine reading a scripted stream of one-token chunks."""
    from aiohttp import web

    chunk = (
        "data: "
        + json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "text": "x",
                        "finish_reason": None,
                        "logprobs": {"content": [{"id": 87, "logprob": 0.0}]},
                    }
                ]
            }
        )
        + "\n\n"
    ).encode()
    last = (
        "data: "
        + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        + "\n\ndata: [DONE]\n\n"
    ).encode()

    async def models(request):
        return web.json_response({"data": [{"id": "scripted"}]})

    async def completions(request):
        await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(n_tokens):
            await resp.write(chunk)
        await resp.write(last)
        await resp.write_eof()
        return resp

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, runner.addresses[0][1]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result()
    e = load_engine("http", model, base_url=f"http://127.0.0.1:{port}/v1", server="vllm")
    try:
        cfg = GenerationConfig(max_new_tokens=n_tokens)
        e.generate([1, 2, 3], cfg)  # warm-up
        t0 = time.perf_counter()
        t = e.generate([1, 2, 3], cfg)
        dt = time.perf_counter() - t0
        assert t.output_tokens == n_tokens, t.output_tokens
    finally:
        e.close()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    return dt / n_tokens * 1e6


def in_process_vs_http(srv, model, ids, warm, cfg) -> str:
    """One request in-process and one over HTTP on the same model: TTFT and TPOT each way.

    The warm-up prompt ``warm`` differs from ``ids``: llama-cpp-python's server reuses the KV cache of
    a matching prefix (no switch), so warming up on the same prompt would hide its prefill."""
    twin = load_engine(SERVERS[srv.name].twin, model, n_ctx=2048, threads=1)
    try:
        twin.generate(warm, cfg)
        a = twin.generate(ids, cfg)
    finally:
        twin.close()
    e = srv.engine(model)
    try:
        e.generate(warm, cfg)
        b = e.generate(ids, cfg)
    finally:
        e.close()
    return (
        f"server={srv.name} inprocess={SERVERS[srv.name].twin} ttft_inprocess_s={a.ttft_s:.4f} ttft_http_s={b.ttft_s:.4f} "
        f"tpot_inprocess_s={a.tpot_s:.4f} tpot_http_s={b.tpot_s:.4f} "
        f"http_adds_ttft_s={b.ttft_s - a.ttft_s:.4f} http_adds_tpot_s={b.tpot_s - a.tpot_s:.4f}"
    )


def load_runs(srv, model, ns) -> list[str]:
    cfg = GenerationConfig(max_new_tokens=ns.max_new_tokens)
    lines = []
    prompts = [
        prompt_of_length(model, ns.prompt_tokens, offset=i * (ns.prompt_tokens + 17)) for i in range(ns.requests + 1)
    ]  # distinct: no request reuses another's prefix
    e = srv.engine(model)
    try:
        e.generate(prompts.pop(), cfg)  # warm-up, on a prompt no measured request uses
        runs = [("closed", None, c) for c in (1, 2)] + [("open", ns.rate, None)]
        for mode, rate, c in runs:
            rows = run_load(
                e, prompts, mode, concurrency=c, rate=rate, seed=0, cfg=cfg, max_duration_s=ns.max_duration_s
            )
            s = summarize(rows, ttft_s=ns.ttft_target_s, tpot_s=ns.tpot_target_s)
            lines.append(summary_line(srv.name, mode, rate, c, s))
            print(lines[-1], flush=True)
    finally:
        e.close()
    return lines


def decode_ratio(srv, model, ns) -> str:
    """The lab's decode tok/s over llama-server's own timings, mean over a few requests."""
    e = srv.engine(model, api="native")
    ratios = []
    try:
        ids = prompt_of_length(model, ns.prompt_tokens)
        cfg = GenerationConfig(max_new_tokens=max(32, ns.max_new_tokens))
        e.generate(ids, cfg)
        for _ in range(3):
            t = e.generate(ids, cfg)
            if t.server_decode_tps and t.decode_tps:
                ratios.append(t.decode_tps / t.server_decode_tps)
    finally:
        e.close()
    r = statistics.median(ratios) if ratios else float("nan")
    return f"server=llama-server client_vs_server_decode_ratio={r:.3f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="llama-cpp-python,mlx")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=1.0, help="open loop, requests/s (Poisson)")
    ap.add_argument("--ttft-target-s", type=float, default=1.0)
    ap.add_argument("--tpot-target-s", type=float, default=0.1)
    ap.add_argument("--max-duration-s", type=float, default=120.0)
    ap.add_argument("--overhead-tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1, help="server threads (the client shares the cores)")
    ns = ap.parse_args(argv)

    model = lablib.prepare()
    print(
        f"client_overhead_us_per_token={client_overhead(model, ns.overhead_tokens):.1f} "
        "(client + scripted server in one process: an upper bound)",
        flush=True,
    )
    for name in [s for s in ns.servers.split(",") if s]:
        try:
            srv = start_server(name, model, threads=ns.threads, n_ctx=2048)
        except LabError as e:
            print(f"server={name} not started: {str(e).splitlines()[0]}", flush=True)
            continue
        with srv:
            print(f"# {srv.name} {srv.version} at {srv.base_url}, ready in {srv.startup_s:.1f} s", flush=True)
            if srv.name in SERVERS:
                print(
                    in_process_vs_http(
                        srv,
                        model,
                        prompt_of_length(model, ns.prompt_tokens, offset=5000),
                        prompt_of_length(model, ns.prompt_tokens, offset=7000),
                        GenerationConfig(max_new_tokens=ns.max_new_tokens),
                    ),
                    flush=True,
                )
            load_runs(srv, model, ns)
            if srv.name == "llama-server":
                print(decode_ratio(srv, model, ns), flush=True)


if __name__ == "__main__":
    main()
