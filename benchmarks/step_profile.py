"""Where a transformers decode step's time goes: operations and kernel launches per step, and the time of each.

    python benchmarks/step_profile.py [--device cpu|cuda] [--steps 16] [--skeleton]

Issue 37 measured transformers decoding SmolLM2-135M at 18 ms a token on an H200, the speed of the same
machine's 16 CPU threads, while its bytes allow about 0.1 ms there. This script counts what one eager decode
step does: transformers' forward of one token with a KV cache (the step ``generate`` runs), ``--steps`` of them
after a 16-token prefill, under ``torch.profiler``:

- ``aten ops``: the operators torch dispatched (top-level ``aten::`` events, each a kernel or a view);
- ``kernel launches``: on CUDA, the runtime's launch calls (``cudaLaunchKernel`` and kin), one per GPU kernel;
- the step's wall time, timed apart from the profiled steps (the profiler slows each op), synchronised where the
  engine syncs (the token's ``.item()``), and that time divided by the ops: the host's cost per operation.

On a GPU a step whose time is near ops x a few microseconds is bound by launches and Python, not by memory
(the lab's launch floor, :mod:`lablib.studies.launch_floor`, measures the same from outside). ``--skeleton``
profiles the model's skeleton instead (the same ops, almost no bytes). Prints one table and one line
``step device=... ops=... launches=... step_ms=... us_per_op=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--skeleton", action="store_true", help="the model's skeleton (lablib.model.skeleton)")
    ns = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import lablib
    from lablib.engines import load_engine
    from lablib.measure.workload import prompt_of_length

    model = lablib.prepare(log=lambda *_: None)
    if ns.skeleton:
        from lablib.model.skeleton import skeleton_of

        model = skeleton_of(model, log=lambda *_: None)
    e = load_engine("transformers", model, device=ns.device)
    hf, dev = e.hf, e.device
    ids = torch.tensor([prompt_of_length(model, 16)], device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def steps(n: int, profiler=None):
        """Prefill, then n single-token forwards, each reading its token back (as generate's streamer does);
        ``profiler`` (a torch.profiler.profile) records the n decode steps only."""
        import contextlib

        from transformers import DynamicCache

        cache = DynamicCache(config=hf.config)
        out = hf(input_ids=ids, **{e._cache_kw: cache}, use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        tok.item()
        with profiler if profiler is not None else contextlib.nullcontext():
            times = decode(n, cache, tok)
        return times

    def decode(n: int, cache, tok):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            out = hf(input_ids=tok, **{e._cache_kw: cache}, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            tok.item()  # the host sync of every step
            times.append(time.perf_counter() - t0)
        return times

    with torch.inference_mode():
        steps(4)  # warm-up
        wall = steps(ns.steps)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        prof = profile(activities=acts)
        steps(ns.steps, prof)
    sync()
    events = prof.events()
    aten = [ev for ev in events if ev.name.startswith("aten::") and ev.cpu_parent is None]
    launches = [ev for ev in events if ev.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")]
    n = ns.steps  # decode steps only: the prefill ran outside the profile
    ops, kl = len(aten) / n, len(launches) / n
    step_ms = 1e3 * statistics.median(wall)
    us_per_op = 1e3 * step_ms / ops if ops else float("nan")
    top = {}
    for ev in aten:
        top[ev.name] = top.get(ev.name, 0) + 1
    print(f"{model.name} on {dev} ({e.info().dtype}), {ns.steps} decode steps, torch {torch.__version__}")
    print(f"  aten ops a step          {ops:8.0f}")
    print(f"  kernel launches a step   {kl:8.0f}" + ("" if dev == "cuda" else "   (CPU: none, ops run in place)"))
    print(f"  step (median, no profiler) {step_ms:6.2f} ms   min {1e3 * min(wall):.2f}, max {1e3 * max(wall):.2f}")
    print(f"  host time per op         {us_per_op:8.1f} us")
    print(
        "  most frequent ops a step: "
        + ", ".join(f"{k} {v / n:.0f}" for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:8])
    )
    print(
        f"step device={dev} skeleton={ns.skeleton} ops={ops:.0f} launches={kl:.0f} step_ms={step_ms:.2f} "
        f"us_per_op={us_per_op:.1f}"
    )
    e.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
