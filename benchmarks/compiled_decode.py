"""transformers' compiled decoding (``compile=True``, issue 37 item 4): what it costs, what it gains, and whether
the lab's per-token clock stays faithful on it.

- ``eager``: the lab's TPOT of the plain engine (``model.generate`` on a DynamicCache);
- ``compile``: the compiled engine's first request, which compiles the decode step for its static cache length
  before its clock starts: the compile's seconds (``engine_counters()["compile_s_request"]``) and that request's
  TTFT beside eager's;
- ``lab`` against ``bare``, alternating: the lab's TPOT of the compiled engine (its token-id streamer stamps each
  token) against a bare timing of the same compiled ``generate`` with no streamer at all, on the same
  ``StaticCache`` and compile config: ``(T(N) - T(1)) / (N - 1)``, where T(n) is the wall time of a ``generate``
  of n new tokens (T(1) is the prefill and its token alone; the difference is the N - 1 decode steps). On CUDA
  each T ends with ``torch.cuda.synchronize()``. ``ratio`` = bare TPOT / lab TPOT (1.0: the lab's clock costs
  nothing; issue 37 asks >= 0.97). torch's graph count is read before and after: the bare runs must compile
  nothing (they reuse the lab's graph).

Medians over ``--reps``; the machine is shared and noisy, so read the ratio, not the absolute numbers. The last
line: ``compiled device=... eager_tpot_ms=... compiled_tpot_ms=... bare_tpot_ms=... ratio=... compile_s=...``.

    python benchmarks/compiled_decode.py [--prompt-tokens 128] [--new-tokens 64] [--reps 5] [--device auto]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lablib
from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.measure.workload import prompt_of_length


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def bare_generate(engine, ids, n_new: int, length: int) -> float:
    """Seconds of transformers' ``generate`` of ``n_new`` greedy tokens on the compiled engine's own StaticCache
    of ``length`` and its compile config, without a streamer (the cache emptied after, outside the time)."""
    import inspect

    import torch
    import transformers

    cache = engine.static_cache(length)
    # the forward's KV-cache keyword: "cache" from transformers 5.24 on, "past_key_values" before
    key = "cache" if "cache" in inspect.signature(engine.hf.forward).parameters else "past_key_values"
    x = torch.tensor([ids], dtype=torch.long, device=engine.device)
    gen = transformers.GenerationConfig(
        max_new_tokens=n_new,
        do_sample=False,
        eos_token_id=[],
        pad_token_id=engine.tok.pad_token_id or 0,
        compile_config=engine.compile_config,
    )
    cuda = engine.device == "cuda"
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.hf.generate(x, attention_mask=torch.ones_like(x), generation_config=gen, **{key: cache})
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        cache.reset()
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    ap.add_argument("--dtype", default=None, help="the weights' dtype (default: the engine's for the device)")
    ns = ap.parse_args(argv)

    model = lablib.prepare(log=lambda *_: None)
    ids = prompt_of_length(model, ns.prompt_tokens)
    cfg = GenerationConfig(max_new_tokens=ns.new_tokens)
    load = {"device": ns.device, "dtype": ns.dtype, "n_ctx": max(2048, ns.prompt_tokens + ns.new_tokens)}

    eager = load_engine("transformers", model, **load)
    eager.generate(ids, cfg)  # warm-up
    eager_runs = [eager.generate(ids, cfg) for _ in range(ns.reps)]
    eager.close()
    eager_tpot = statistics.median(t.tpot_s for t in eager_runs)
    eager_ttft = statistics.median(t.ttft_s for t in eager_runs)

    e = load_engine("transformers", model, compile=True, **load)
    first = e.generate(ids, cfg)  # compiles its length before its clock
    c = e.engine_counters()
    length, compile_s = c["static_cache_len"], c["compile_s_request"]
    assert first.token_ids == eager_runs[0].token_ids, "compiled greedy ids differ from eager's"
    bare_generate(e, ids, ns.new_tokens, length)  # the bare path's own first run (no compile: the same graph)
    made = graphs()
    lab, bare, ttft, inside = [], [], [], 0
    for _ in range(ns.reps):  # alternating, so the machine's drift hits both
        tr = e.generate(ids, cfg)
        lab.append(tr.tpot_s)
        ttft.append(tr.ttft_s)
        inside += e.engine_counters()["graphs_in_request"]
        t_n = bare_generate(e, ids, ns.new_tokens, length)
        t_1 = bare_generate(e, ids, 1, length)
        bare.append((t_n - t_1) / (ns.new_tokens - 1))
    recompiled = graphs() - made
    info = e.info()
    e.close()

    lab_m, bare_m = statistics.median(lab), statistics.median(bare)
    ratio = bare_m / lab_m
    print(
        f"\n{info.backend}, {info.dtype}; prompt {ns.prompt_tokens} tokens, {ns.new_tokens} new tokens, static "
        f"cache {length} tokens, mode {e.compile_config.mode!r}; medians of {ns.reps}"
    )
    print(f"{'':<30} {'TPOT ms':>9} {'min..max':>17}")
    print(f"{'eager (lab)':<30} {eager_tpot * 1e3:>9.2f} {_span(t.tpot_s for t in eager_runs):>17}")
    print(f"{'compiled (lab)':<30} {lab_m * 1e3:>9.2f} {_span(lab):>17}")
    print(f"{'compiled (bare generate)':<30} {bare_m * 1e3:>9.2f} {_span(bare):>17}")
    print(
        f"compile of the {length}-token length: {compile_s:.1f} s, before the first request's clock "
        f"(its TTFT {first.ttft_s * 1e3:.1f} ms, then a median {statistics.median(ttft) * 1e3:.1f} ms; eager's "
        f"{eager_ttft * 1e3:.1f} ms); graphs compiled during the timed runs: {recompiled} ({inside} inside the lab's "
        "requests)"
    )
    print(f"decode speedup eager -> compiled: x{eager_tpot / lab_m:.2f}; lab vs bare ratio {ratio:.3f}\n")
    print(
        f"compiled device={info.device} eager_tpot_ms={eager_tpot * 1e3:.2f} compiled_tpot_ms={lab_m * 1e3:.2f} "
        f"bare_tpot_ms={bare_m * 1e3:.2f} ratio={ratio:.3f} compile_s={compile_s:.1f} recompiled={recompiled}"
    )
    return 0


def _span(values) -> str:
    v = list(values)
    return f"{min(v) * 1e3:.2f}..{max(v) * 1e3:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
