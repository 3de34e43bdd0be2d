"""`lablib bench --base-url URL ...`: load on any OpenAI-compatible server, closed or open loop.

    lablib bench --base-url URL [--model ID] [--api completions|chat] [--rate R | --concurrency C]
                 [--max-concurrency C] [--arrival poisson|constant|gamma] [--burstiness B] [--seed S]
                 --requests N --prompt-tokens P --max-new-tokens M --out FILE [--max-duration-s S]
                 [--ttft-target-s X] [--tpot-target-s X] [--e2e-target-s X]

One tidy row per request (the sweeps' columns plus the HTTP ones) is written as each finishes, with
the server's name and version in every row's engine columns, and one summary line is printed per
rate (:func:`lablib.ui.text.summary_line`). Prompts are exact-length cuts of the lab's prose at
different offsets, so no request shares a prefix with another.
"""

from __future__ import annotations

import sys

from lablib.errors import LabError

HELP = "measure an OpenAI-compatible server: closed or open loop, rows to --out"


def add_arguments(p) -> None:
    p.add_argument("--base-url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--model", default=None, help="the model id the server knows (default: its first)")
    p.add_argument("--lab-model", default=None, help="the lab's model whose tokenizer makes prompts (default: SmolLM2)")
    p.add_argument("--api", default="completions", choices=["completions", "chat", "native"])
    p.add_argument("--server", default="auto", help="server kind (default: asked from the server)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", help="open loop: requests per second ('inf': all at once); a sweep as 0.5,1,2")
    g.add_argument("--concurrency", type=int, help="closed loop: clients")
    p.add_argument("--max-concurrency", type=int, default=None, help="open loop: cap on requests in flight")
    p.add_argument("--arrival", default="poisson", help="open loop: constant, poisson or gamma")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, <1 burstier)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--prompt-tokens", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--until-eos", action="store_true", help="stop at EOS (default: exactly N tokens)")
    p.add_argument("--max-duration-s", type=float, default=300.0, help="time limit of the run")
    p.add_argument("--read-timeout-s", type=float, default=60.0)
    p.add_argument("--ttft-target-s", type=float, default=None)
    p.add_argument("--tpot-target-s", type=float, default=None)
    p.add_argument("--e2e-target-s", type=float, default=None)
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests first")
    p.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")


def run(ns) -> int:
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.load import parse_rates, run_load, summarize
    from lablib.measure.workload import distinct_prompts
    from lablib.model.resolve import prepare
    from lablib.results.store import ResultsWriter, _suffix
    from lablib.ui.text import summary_line

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
    prompts = distinct_prompts(rm, ns.prompt_tokens, ns.warmup + ns.requests)
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
