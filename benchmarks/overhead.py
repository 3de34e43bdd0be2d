"""What the lab costs its user: decode tokens/s as the lab reports it against
each engine's own figure for the same work.

- llama.cpp: the same request, read twice: the lab's 1 / TPOT, and llama.cpp's
  perf context counters (n_eval / t_eval) of that very request.
- mlx: the lab's run (mlx-lm's generate_step, stamped per token) against
  mlx-lm's own ``stream_generate`` and its ``generation_tps``, alternating.
- openvino: the same request, read twice: the lab's 1 / TPOT, and OpenVINO GenAI's own
  perf_metrics of that very request (1000 / TPOT ms).
- transformers: the lab's run (``model.generate`` with a token-id streamer)
  against a bare forward loop with a KV cache and argmax, alternating.
- onnxruntime-genai: it keeps no counters of its own, so the anchor is the same
  ``og.Generator`` loop (append_tokens, then generate_next_token /
  get_next_tokens) timed without the lab's per-token work (no trace, no EOS
  check), alternating with the lab's run.

Medians over repetitions after a warm-up, measured in one process; the machine
is shared and noisy, so compare ratios, not absolute numbers. Prints a table,
then one line per engine: ``engine=NAME lab_tps=X engine_tps=Y ratio=R``.

    python benchmarks/overhead.py [--prompt-tokens 128] [--new-tokens 128] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lablib
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.measure.workload import prompt_of_length


def llama_cpp(engine, ids, cfg, reps):
    lab, own = [], []
    for _ in range(reps):
        tr = engine.generate(ids, cfg)
        c = engine.engine_counters()
        lab.append(tr.decode_tps)
        own.append(c["n_eval"] / (c["t_eval_ms"] / 1e3))
    return lab, own, "llama_perf_context: n_eval / t_eval"


def mlx(engine, ids, cfg, reps):
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    lab, own = [], []
    for _ in range(reps):
        lab.append(engine.generate(ids, cfg).decode_tps)
        last = None
        for last in stream_generate(  # noqa: B007 (the last response carries the run's numbers)
            engine.mlx_model,
            engine.tok,
            mx.array(ids),
            max_tokens=cfg.max_new_tokens,
            sampler=make_sampler(temp=0.0),
            prompt_cache=make_prompt_cache(engine.mlx_model),
        ):
            pass
        own.append(last.generation_tps)
    return lab, own, "mlx-lm stream_generate: generation_tps"


def alternate(engine, ids, cfg, reps, bare_loop) -> tuple[list[float], list[float]]:
    """The lab's decode tok/s and ``bare_loop()``'s (the engine's own loop without the lab's
    per-token work), ``reps`` times each, alternating so the machine's drift hits both."""
    lab, own = [], []
    for _ in range(reps):
        lab.append(engine.generate(ids, cfg).decode_tps)
        own.append(bare_loop())
    return lab, own


def transformers(engine, ids, cfg, reps):
    import torch
    from transformers import DynamicCache

    model = engine.hf

    def bare_loop():
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            out = model(torch.tensor([ids]), cache=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            t_first = time.perf_counter()
            for _ in range(cfg.max_new_tokens - 1):
                out = model(tok, cache=cache, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
                tok.item()
            t_last = time.perf_counter()
        return (cfg.max_new_tokens - 1) / (t_last - t_first)

    return alternate(engine, ids, cfg, reps, bare_loop) + ("bare forward loop with KV cache (argmax)",)


def onnxruntime_genai(engine, ids, cfg, reps):
    import numpy as np

    og = engine._og
    prompt = np.asarray(ids, dtype=np.int32)

    def bare_loop():
        gen = og.Generator(engine.og_model, engine._params(cfg, len(ids) + cfg.max_new_tokens))
        gen.append_tokens(prompt)
        gen.generate_next_token()
        gen.get_next_tokens()
        t_first = time.perf_counter()
        for _ in range(cfg.max_new_tokens - 1):
            gen.generate_next_token()
            gen.get_next_tokens()
        t_last = time.perf_counter()
        return (cfg.max_new_tokens - 1) / (t_last - t_first)

    return alternate(engine, ids, cfg, reps, bare_loop) + (
        "the same og.Generator loop without the lab's per-token work",
    )


def openvino(engine, ids, cfg, reps):
    lab, own = [], []
    for _ in range(reps):
        tr = engine.generate(ids, cfg)
        lab.append(tr.decode_tps)
        own.append(1e3 / engine.engine_counters()["tpot_ms"])
    return lab, own, "openvino_genai perf_metrics: 1000 / TPOT"


RUNNERS = {
    "llama.cpp": llama_cpp,
    "mlx": mlx,
    "transformers": transformers,
    "openvino": openvino,
    "onnxruntime-genai": onnxruntime_genai,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="transformers,llama.cpp,mlx")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ns = ap.parse_args(argv)

    model = lablib.prepare()
    ids = prompt_of_length(model, ns.prompt_tokens)
    cfg = GenerationConfig(max_new_tokens=ns.new_tokens)
    results = []
    for name in ns.engines.split(","):
        engine = load_engine(name, model, n_ctx=ns.prompt_tokens + ns.new_tokens + 16)
        run = RUNNERS[engine.name]
        run(engine, ids, cfg, ns.warmup)  # warm-up, both paths
        lab, own, source = run(engine, ids, cfg, ns.reps)
        engine.close()
        lab_m, own_m = statistics.median(lab), statistics.median(own)
        results.append((engine.name, lab_m, own_m, lab_m / own_m, min(lab), max(lab), source))

    print(
        f"\nprompt {ns.prompt_tokens} tokens, {ns.new_tokens} new tokens, medians of {ns.reps} "
        f"after {ns.warmup} warm-up; decode tokens/s"
    )
    print(f"{'engine':<17} {'lab_tps':>9} {'engine_tps':>11} {'ratio':>7} {'lab min..max':>16}  engine's figure")
    for name, lab_m, own_m, ratio, lo, hi, source in results:
        print(f"{name:<17} {lab_m:>9.2f} {own_m:>11.2f} {ratio:>7.3f} {lo:>7.2f}..{hi:<7.2f}  {source}")
    print()
    for name, lab_m, own_m, ratio, *_ in results:
        print(f"engine={name} lab_tps={lab_m:.2f} engine_tps={own_m:.2f} ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
