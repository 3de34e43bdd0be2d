"""The KV cache each engine holds at one context, beside what the lab predicts for it: the check of
``Engine.kv_cache_bytes`` on a model whose layers differ (default: Gemma 3 270M, 15 of its 18 layers
attending a sliding window of 512 tokens).

- llama.cpp in process: its KV buffers as its load log reports them (``LlamaCppEngine.kv_report``), with
  llama-cpp-python's full-size SWA cache (``swa_full`` true, its default) and without (llama-server's default);
- llama-server: the same lines from its own log (``llama_kv_cache: size = ...``), started by the lab;
- transformers: the key and value tensors of the cache ``generate`` returns (``last_kv_bytes``), after a
  prompt of ``context - new`` tokens and ``new`` generated ones;
- mlx: the arrays of mlx-lm's prompt cache after the same request;
- vLLM (``--vllm``): its KV cache usage (``vllm:kv_cache_usage_perc``, sampled every 0.25 s from /metrics) times
  its blocks, while one request of ``context`` tokens decodes, against :func:`lablib.engines.servers.vllm_request_blocks`
  (its KV cache groups, a sliding group keeping only its window's blocks).

Prints one row per engine: predicted and held bytes, their ratio, what the model needs (every full layer the
whole context, every sliding layer its window), and why the engine differs. One line per engine at the end:
``engine=NAME predicted=B held=B ratio=R``.

    python benchmarks/kv_cache.py [--model gemma-3-270m] [--context 8192] [--new 2] [--no-server] [--no-in-process]
                                  [--vllm]
"""

from __future__ import annotations

import argparse
import time

from lablib.engines import ENGINES, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.llamacpp import read_load_log
from lablib.measure.workload import prompt_of_length
from lablib.model.resolve import prepare
from lablib.model.shape import kv_cache_bytes, model_dims


def in_process(rm, context: int, new: int) -> list[dict]:
    rows = []
    for swa_full in (True, False):
        e = load_engine("llama.cpp", rm, n_ctx=context, swa_full=swa_full)
        try:
            r = e.kv_report()
            rows.append(
                {
                    "engine": f"llama.cpp (swa_full={str(swa_full).lower()})",
                    "predicted": r["predicted_bytes"],
                    "held": r["bytes"],
                    "note": r["note"],
                }
            )
        finally:
            e.close()
    ids = prompt_of_length(rm, context - new)
    cfg = GenerationConfig(max_new_tokens=new)
    for name in ("transformers", "mlx"):
        e = load_engine(name, rm, n_ctx=context)
        try:
            t0 = time.perf_counter()
            e.generate(ids, cfg)
            held = e.last_kv_bytes
            # transformers' cache holds the prompt and every generated token but the last; mlx-lm computes one
            # step ahead, so it holds the last one too
            at = context - 1 if name == "transformers" else context
            rows.append(
                {
                    "engine": name,
                    "predicted": ENGINES[name].kv_cache_bytes(rm, at, prompt_tokens=len(ids)),
                    "held": held,
                    "note": ENGINES[name].kv_cache_note(rm) + f" ({time.perf_counter() - t0:.0f} s)",
                }
            )
        finally:
            e.close()
    return rows


def server(rm, context: int) -> dict:
    """llama-server started on the model with one slot of ``context`` tokens: its KV caches as it logs them."""
    from lablib.engines.llamacpp import llama_kv_cells
    from lablib.engines.servers import start_server

    srv = start_server("llama-server", rm, parallel=1, n_ctx=context, log=lambda *_: None)
    try:
        text = open(srv.log_path, encoding="utf-8", errors="replace").read()
    finally:
        srv.stop()
    built = read_load_log(text)
    ubatch = srv.settings.get("ubatch", 512) if hasattr(srv, "settings") else 512
    predicted = llama_kv_cells(rm, context, 1, ubatch, swa_full=False)["bytes"]
    return {
        "engine": "llama-server",
        "predicted": predicted,
        "held": built["kv_bytes"],
        "note": ENGINES["llama.cpp"].kv_cache_note(rm, swa_full=False),
    }


def vllm(rm, context: int, new: int = 48) -> dict:
    """vLLM started on the model (one sequence, a context of ``context + new`` tokens), one request of ``context``
    prompt tokens and ``new`` output tokens: the blocks it holds while decoding, its KV cache usage (the last
    samples before the request ended, when only decode steps ran) times the blocks of its KV cache, beside the
    prediction at the context reached then."""
    from lablib.engines.http.metrics import MetricsSampler
    from lablib.engines.servers import start_server, vllm_block_bytes, vllm_request_blocks
    from lablib.measure.load import run_load
    from lablib.studies.scheduler.kv import server_kv_blocks

    srv = start_server("vllm", rm, parallel=1, n_ctx=context + new + 16, log=print)
    try:
        blocks = server_kv_blocks(srv, rm)
        e = srv.engine(rm)
        ids = prompt_of_length(rm, context)
        e.generate(ids[:8], GenerationConfig(max_new_tokens=2))
        sampler = MetricsSampler(e.root_url, 0.25, concurrency=1)
        rows = run_load(
            e, [ids], "closed", concurrency=1, cfg=GenerationConfig(max_new_tokens=new), server_metrics=sampler
        )
        t_first, t_last = rows[0]["t_first_token"], rows[0]["t_last_token"]
        decoding = [
            r for r in sampler.rows() if r["metric"] == "kv_usage" and t_first < r["t_s"] <= t_last and r["value"]
        ]
    finally:
        srv.stop()
    usage = decoding[-1]["value"] if decoding else float("nan")
    bpe = 4 if srv.settings.get("dtype") == "float32" else 2
    held_blocks = round(usage * blocks)
    predicted = vllm_request_blocks(rm, context + new - 1)["blocks"]
    return {
        "engine": f"vLLM ({srv.settings.get('dtype')}, {blocks} blocks)",
        "predicted": predicted * vllm_block_bytes(rm, bpe),
        "held": held_blocks * vllm_block_bytes(rm, bpe),
        "note": f"{held_blocks} blocks held (usage {usage:.4f}) against {predicted} predicted: one block per 128 "
        "positions per KV cache group, a sliding group keeping only its window's blocks",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--new", type=int, default=2)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--no-in-process", action="store_true")
    ap.add_argument("--vllm", action="store_true")
    ns = ap.parse_args()
    rm = prepare(ns.model, log=lambda *_: None)
    d = model_dims(rm)
    rows = [] if ns.no_in_process else in_process(rm, ns.context, ns.new)
    if not ns.no_server:
        rows.append(server(rm, ns.context))
    if ns.vllm:
        rows.append(vllm(rm, ns.context))
    need = {b: kv_cache_bytes(d, b, ns.context) for b in (2, 4)}
    print(
        f"{rm.name}: {d['layer_types'].count('sliding')} of {d['layers']} layers slide over {d['sliding_window']} "
        f"tokens; at {ns.context} tokens the model needs {need[2] / 2**20:.1f} MiB in f16, {need[4] / 2**20:.1f} MiB "
        f"in f32 (all layers full: {kv_cache_bytes({**d, 'layer_types': ('full',) * d['layers']}, 2, ns.context) / 2**20:.1f} MiB f16)"
    )
    print(f"{'engine':<28} {'predicted MiB':>14} {'held MiB':>10} {'held/predicted':>15}  why")
    for r in rows:
        ratio = r["held"] / r["predicted"] if r["predicted"] else float("nan")
        print(
            f"{r['engine']:<28} {r['predicted'] / 2**20:>14.2f} {r['held'] / 2**20:>10.2f} {ratio:>15.4f}  {r['note']}"
        )
    for r in rows:
        print(
            f"engine={r['engine'].replace(' ', '')} predicted={r['predicted']} held={r['held']} "
            f"ratio={r['held'] / r['predicted']:.4f}"
        )


if __name__ == "__main__":
    main()
