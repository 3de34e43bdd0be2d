"""A busy neighbour: decode tokens/s of each engine on a quiet machine and with one core busy.

Workshop laptops share their cores with the JupyterLab server, a browser and whatever else
runs. An engine whose threads spin-wait for each other at every step (OpenMP's default) can
slow down by 100x when one of its cores is taken; a fair engine loses about that core's share.

Each engine is measured in its own child process (OpenMP reads its settings when the library
loads): warm-up, then ``--reps`` requests quiet, then the same with a second process spinning
on one core (``while True: pass``), medians of decode tok/s. Prints one line per engine and
variant::

    engine=NAME quiet_tps=X busy_tps=Y ratio=R            (the lab's defaults)
    engine=NAME variant=V quiet_tps=X busy_tps=Y ratio=R  (--variant V:ENV=VALUE,...)

    python benchmarks/contention.py [--engines llama.cpp,transformers,mlx] [--new-tokens 64]
        [--reps 3] [--variant omp-active:OMP_WAIT_POLICY=ACTIVE] [--variant threads1:LABLIB_THREADS=1]

The machine is shared and noisy: compare ratios measured in one run, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BUSY = "while True: pass"


def child(engine_name: str, prompt_tokens: int, new_tokens: int, reps: int) -> dict:
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import prompt_of_length

    engine = load_engine(engine_name, n_ctx=prompt_tokens + new_tokens + 16)
    ids = prompt_of_length(engine.model, prompt_tokens)
    cfg = GenerationConfig(max_new_tokens=new_tokens)

    def decode_tps() -> float:
        return statistics.median(engine.generate(ids, cfg).decode_tps for _ in range(reps))

    engine.generate(ids, cfg)  # warm-up
    quiet = decode_tps()
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.5)
        loaded = decode_tps()
    finally:
        busy.kill()
        busy.wait()
    info = engine.info()
    engine.close()
    return {
        "quiet_tps": quiet,
        "busy_tps": loaded,
        "threads": info.threads,
        "wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def run(engine: str, env: dict, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        engine,
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--new-tokens",
        str(args.new_tokens),
        "--reps",
        str(args.reps),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"{engine}: the measuring process failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="llama.cpp,transformers,mlx")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:ENV=VALUE[,ENV=VALUE]: also measure with these environment settings",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.prompt_tokens, args.new_tokens, args.reps)))
        return 0
    variants = [("", {})]
    for v in args.variant:
        name, _, settings = v.partition(":")
        variants.append((name, dict(kv.split("=", 1) for kv in settings.split(",") if kv)))
    for engine in args.engines.split(","):
        for name, extra in variants:
            r = run(engine, {**os.environ, **extra}, args)
            label = f" variant={name}" if name else ""
            print(
                f"engine={engine}{label} quiet_tps={r['quiet_tps']:.2f} busy_tps={r['busy_tps']:.2f} "
                f"ratio={r['busy_tps'] / r['quiet_tps']:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
