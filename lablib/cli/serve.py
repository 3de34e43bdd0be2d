"""`lablib serve` and `lablib bench`: a real server on the lab's model, and load on any server.

    lablib serve --server NAME [--port P] [--parallel N] [--threads T] [--n-ctx N] [--duration-s S]
    lablib bench --base-url URL [--model ID] [--api completions|chat] [--rate R | --concurrency C]
                 [--max-concurrency C] [--arrival poisson|constant|gamma] [--burstiness B] [--seed S]
                 --requests N --prompt-tokens P --max-new-tokens M --out FILE [--max-duration-s S]
                 [--ttft-target-s X] [--tpot-target-s X] [--e2e-target-s X]

`bench` writes one tidy row per request (the sweeps' columns plus the HTTP ones) as each
finishes, with the server's name and version in every row's engine columns, and prints one
summary line. Prompts are exact-length cuts of the lab's prose at different offsets, so no
request shares a prefix with another.
"""

from __future__ import annotations

import math
import signal
import sys
import time

from lablib.errors import LabError


def add_parsers(sub, cmd_serve, cmd_bench) -> None:
    """Add the `serve` and `bench` subcommands to the lab's argparse subparsers."""
    from lablib.engines.servers import SERVERS

    sv = sub.add_parser("serve", help="start a real OpenAI-compatible server on the lab's model (Ctrl-C stops it)")
    sv.add_argument("--server", required=True, help=", ".join(SERVERS))
    sv.add_argument("--model", default=None, help="the lab's model (default: SmolLM2-135M)")
    sv.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    sv.add_argument("--parallel", type=int, default=1, help="slots decoded together (llama-server, mlx)")
    sv.add_argument("--threads", type=int, default=None, help="CPU threads for the server")
    sv.add_argument("--n-ctx", type=int, default=4096, help="context per slot, tokens")
    sv.add_argument("--duration-s", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    sv.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="measure an OpenAI-compatible server: closed or open loop, rows to --out")
    b.add_argument("--base-url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    b.add_argument("--model", default=None, help="the model id the server knows (default: its first)")
    b.add_argument("--lab-model", default=None, help="the lab's model whose tokenizer makes prompts (default: SmolLM2)")
    b.add_argument("--api", default="completions", choices=["completions", "chat", "native"])
    b.add_argument("--server", default="auto", help="server kind (default: asked from the server)")
    g = b.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", help="open loop: requests per second ('inf': all at once); a sweep as 0.5,1,2")
    g.add_argument("--concurrency", type=int, help="closed loop: clients")
    b.add_argument("--max-concurrency", type=int, default=None, help="open loop: cap on requests in flight")
    b.add_argument("--arrival", default="poisson", help="open loop: constant, poisson or gamma")
    b.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, <1 burstier)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--requests", type=int, required=True)
    b.add_argument("--prompt-tokens", type=int, required=True)
    b.add_argument("--max-new-tokens", type=int, required=True)
    b.add_argument("--until-eos", action="store_true", help="stop at EOS (default: exactly N tokens)")
    b.add_argument("--max-duration-s", type=float, default=300.0, help="time limit of the run")
    b.add_argument("--read-timeout-s", type=float, default=60.0)
    b.add_argument("--ttft-target-s", type=float, default=None)
    b.add_argument("--tpot-target-s", type=float, default=None)
    b.add_argument("--e2e-target-s", type=float, default=None)
    b.add_argument("--warmup", type=int, default=1, help="unrecorded requests first")
    b.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")
    b.set_defaults(func=cmd_bench)


def serve(ns) -> int:
    from lablib.engines.servers import start_server

    if ns.duration_s is not None and not ns.duration_s > 0:
        raise LabError(f"--duration-s {ns.duration_s}: expected a positive number of seconds")
    srv = start_server(ns.server, ns.model, port=ns.port, parallel=ns.parallel, threads=ns.threads, n_ctx=ns.n_ctx)
    print(
        f"{srv.name} {srv.version} ready at {srv.base_url} (pid {srv.pid}, {srv.startup_s:.1f} s; log {srv.log_path})",
        flush=True,
    )
    print(
        f"measure it: lablib bench --base-url {srv.base_url} --concurrency 1 --requests 4 --prompt-tokens 64 "
        "--max-new-tokens 32 --out serving.jsonl",
        flush=True,
    )
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    old = signal.signal(signal.SIGTERM, on_signal)
    deadline = math.inf if ns.duration_s is None else time.monotonic() + ns.duration_s
    try:
        while not stop["now"] and srv.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        died = not srv.alive()
        code = srv.stop()
    if died:
        print(f"{srv.name} exited by itself (code {code}); its log ends:\n{srv.log_tail()}", file=sys.stderr)
        return 1
    print(f"{srv.name} stopped (pid {srv.pid})")
    return 0


def bench(ns) -> int:
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.load import parse_rates, run_load, summarize
    from lablib.model.resolve import prepare
    from lablib.results.store import ResultsWriter, _suffix
    from lablib.measure.workload import prompt_of_length

    _suffix(ns.out)
    if ns.rate is not None:
        parse_rates(ns.rate)  # refuse a bad rate before any work
    for what in ("requests", "prompt_tokens", "max_new_tokens"):
        if getattr(ns, what) < 1:
            raise LabError(f"--{what.replace('_', '-')} {getattr(ns, what)}: expected at least 1")
    if ns.warmup < 0:
        raise LabError(f"--warmup {ns.warmup}: expected 0 or more")
    rm = prepare(ns.lab_model, log=lambda m: print(m, file=sys.stderr))
    cfg = GenerationConfig(max_new_tokens=ns.max_new_tokens, ignore_eos=not ns.until_eos)
    # distinct prompts: no request reuses another's prefix (a server's prefix cache stays cold)
    prompts = [
        prompt_of_length(rm, ns.prompt_tokens, offset=i * (ns.prompt_tokens + 17))
        for i in range(ns.warmup + ns.requests)
    ]
    writer = ResultsWriter(ns.out)  # a bad --out is refused before any request
    engine = load_engine(
        "http",
        rm,
        base_url=ns.base_url,
        api=ns.api,
        server=ns.server,
        server_model=ns.model,
        read_timeout_s=ns.read_timeout_s,
    )
    try:
        for ids in prompts[: ns.warmup]:
            engine.generate(ids, cfg)
        mode = "open" if ns.rate is not None else "closed"
        rates = parse_rates(ns.rate) if mode == "open" else [None]
        failed = 0
        for rate in rates:
            rows = run_load(
                engine,
                prompts[ns.warmup :],
                mode,
                concurrency=ns.concurrency if mode == "closed" else ns.max_concurrency,
                rate=rate,
                arrival=ns.arrival,
                burstiness=ns.burstiness,
                seed=ns.seed,
                max_duration_s=ns.max_duration_s,
                cfg=cfg,
                on_row=writer.append,
            )
            s = summarize(rows, ns.ttft_target_s, ns.tpot_target_s, ns.e2e_target_s)
            failed += s["errors"]
            print(summary_line(engine.kind, mode, rate, ns.concurrency or ns.max_concurrency, s), flush=True)
    finally:
        engine.close()
    print(f"{writer.written} rows appended to {ns.out} ({failed} failed)")
    return 0 if failed == 0 else 1


def summary_line(server: str, mode: str, rate, c, s: dict) -> str:
    """One line: ``server=NAME mode=MODE rate=R c=C output_tps=X ttft_p50_s=Y goodput=Z`` and more."""

    def f(x, nd=3):
        return "-" if x is None else f"{x:.{nd}f}"

    return (
        f"server={server} mode={mode} rate={'-' if rate is None else f'{rate:g}'} c={'-' if c is None else c} "
        f"output_tps={f(s['output_tps'], 2)} ttft_p50_s={f(s['ttft_s_p50'])} goodput={f(s['goodput_rps'], 3)} "
        f"ttft_p99_s={f(s['ttft_s_p99'])} tpot_p50_s={f(s['tpot_s_p50'], 4)} e2e_p99_s={f(s['e2e_s_p99'])} "
        f"errors={s['errors']}/{s['requests']}"
    )
