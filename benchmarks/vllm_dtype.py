"""Which dtype vLLM's CPU build should run the lab's model in: bfloat16 or float32, on this CPU.

Two real vLLM servers on the lab's model, one per dtype (``LABLIB_VLLM_DTYPE``, the same
settings otherwise), started side by side, then the same closed-loop load on each, interleaved
(A B B A ...), with the lab's client (:func:`lablib.measure.load.bench`: distinct prompts, fixed
output length). Prints one line per dtype (medians over rounds, min-max in brackets) and the
ratios bfloat16 / float32; the greedy ids of one prompt on each server are compared too (how far
bfloat16 drifts from float32).

On a CPU without native bf16 instructions (no AVX-512 BF16, no AMX: /proc/cpuinfo) bf16 matrix
products are emulated by converting to float32, so bf16 buys a halved KV cache and weight memory
at a compute cost; :func:`lablib.engines.servers.vllm_dtype` chooses from the measured result.

    python benchmarks/vllm_dtype.py [--rounds 3] [--requests 8] [--prompt-tokens 128] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import start_server
from lablib.machine.identity import cpu_flags, load_average
from lablib.measure.load import bench
from lablib.measure.workload import distinct_prompts
from lablib.model.resolve import prepare

DTYPES = ("float32", "bfloat16")
METRICS = ("ttft_p50_s", "tpot_p50_s", "output_tps")


def start(dtype: str, model, parallel: int, n_ctx: int):
    os.environ["LABLIB_VLLM_DTYPE"] = dtype
    try:
        return start_server("vllm", model, parallel=parallel, n_ctx=n_ctx, log=print)
    finally:
        del os.environ["LABLIB_VLLM_DTYPE"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    model = prepare()
    native = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    print(f"CPU bf16 instructions: {', '.join(native) or 'none'}; load average {load_average()}")
    servers = {}
    try:
        for dtype in DTYPES:
            servers[dtype] = start(dtype, model, parallel=2, n_ctx=512)
            print(f"{dtype}: ready in {servers[dtype].startup_s:.0f} s ({servers[dtype].settings})")
        got = {d: {m: [] for m in METRICS} for d in DTYPES}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.rounds):
                order = DTYPES if r % 2 == 0 else DTYPES[::-1]
                for dtype in order:
                    (s,) = bench(
                        base_url=servers[dtype].base_url,
                        out=Path(tmp) / f"{dtype}-{r}.jsonl",
                        requests=a.requests,
                        prompt_tokens=a.prompt_tokens,
                        max_new_tokens=a.new_tokens,
                        concurrency=a.concurrency,
                        model=model,
                        log=lambda *_: None,
                    )
                    for m in METRICS:
                        got[dtype][m].append(s[m])
                    print(f"round {r} {dtype}: " + " ".join(f"{m}={s[m]:.4g}" for m in METRICS), flush=True)
        for dtype in DTYPES:
            print(
                f"vllm dtype={dtype} "
                + " ".join(f"{m}={statistics.median(v):.4g} [{min(v):.4g}-{max(v):.4g}]" for m, v in got[dtype].items())
            )
        for m in METRICS:
            ratio = statistics.median(got["bfloat16"][m]) / statistics.median(got["float32"][m])
            print(f"ratio bfloat16/float32 {m}={ratio:.3f}")
        ids = distinct_prompts(model, a.prompt_tokens, 1)[0]
        outs = {}
        for dtype, srv in servers.items():
            eng = srv.engine(model)
            try:
                outs[dtype] = eng.generate(ids, GenerationConfig(max_new_tokens=a.new_tokens)).token_ids
            finally:
                eng.close()
        same = next((i for i, (x, y) in enumerate(zip(*outs.values())) if x != y), len(outs["float32"]))
        print(f"greedy ids: bfloat16 follows float32 for {same} of {a.new_tokens} tokens")
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
