"""llama.cpp's own benchmarks as anchors for the lab's numbers.

``llama-bench`` and ``llama-batched-bench`` are built from the same source and CMake flags as
the lab's in-process library (:func:`lablib.build.llama.llama_tool`), and run here with the
lab engine's settings (threads, batch sizes, flash attention), so a lab figure next to its
anchor shows what the lab's own loop costs. Tests:

- ``tg128@d0`` / ``tg128@d512``: 128 decode steps after a context of 0 / 512 tokens
  (llama-bench ``-n 128 -d D``); the lab: a prompt of max(D, 1) tokens, then 128 new tokens,
  decode tok/s = 1 / TPOT.
- ``pp512``: a 512-token prompt (llama-bench ``-p 512``); the lab: prefill tok/s.
- batched, B sequences of ``pp`` prompt and ``tg`` new tokens decoded together:
  llama-batched-bench's ``S_TG`` (generated tokens/s over the batch); the lab: a batched closed
  loop with B clients and B requests, B / median TPOT.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.measure.sweep import measured_traces
from lablib.measure.workload import distinct_prompts, prompt_of_length
from lablib.model.resolve import takes_model

SINGLE = {"tg128@d0": (0, 128), "tg128@d512": (512, 128), "pp512": (512, 0)}  # test: (context, new tokens)


def llama_bench(gguf: str, test: str, threads: int, n_batch: int, flash: str, reps: int = 3) -> float:
    """llama-bench's tok/s for one test of :data:`SINGLE` (its own average over ``reps`` runs)."""
    depth, new = SINGLE[test]
    args = ["-p", "512", "-n", "0"] if new == 0 else ["-p", "0", "-n", str(new), "-d", str(depth)]
    out = _run_tool("llama-bench", gguf, threads, n_batch, flash, "-r", str(reps), "-o", "jsonl", *args).stdout
    return json.loads(out.strip().splitlines()[-1])["avg_ts"]


def lab_single(engine, test: str, reps: int = 3, warmup: int = 0) -> float:
    """The lab's tok/s for one test of :data:`SINGLE` on a loaded llama.cpp engine (median over
    ``reps``, after ``warmup`` unrecorded requests of the same test)."""
    depth, new = SINGLE[test]
    ids = prompt_of_length(engine.model, max(depth, 1))
    cfg = GenerationConfig(max_new_tokens=max(new, 1))  # pp512: one new token, its prefill timed
    # no warm-up by default, on purpose: benchmarks/anchors.py warms up once per test, by a first call
    traces = measured_traces(engine, [ids] * reps, cfg, warmup=[ids] * warmup)
    return statistics.median(t.prefill_tps if new == 0 else t.decode_tps for t in traces)


def batched_bench(
    gguf: str, batches, pp: int, tg: int, threads: int, n_batch: int = 512, flash: str = "off"
) -> dict[int, float]:
    """llama-batched-bench's ``S_TG`` (generated tokens/s across the batch) for each B in ``batches``.

    A B whose row the tool's output lacks is run once more on its own, saying so on stderr with what the
    tool printed: in a full `make test` the notebook of lab 03 once got every row but the last (B = 2 of
    (1, 2), exit status 0), which 40 runs alone and beside two busy cores did not repeat. LabError naming
    the Bs, the command and the output's end when the second run lacks them too."""
    b_max = max(batches)
    speeds, printed = {}, ""
    for attempt in range(2):
        todo = [b for b in batches if b not in speeds]
        if not todo:
            break
        sizes = ["-c", str(b_max * (pp + tg) + 16), "-npp", str(pp), "-ntg", str(tg), "-npl", ",".join(map(str, todo))]
        out = _run_tool("llama-batched-bench", gguf, threads, n_batch, flash, *sizes, "--output-format", "jsonl")
        rows = [json.loads(line) for line in (out.stdout + out.stderr).splitlines() if line.startswith("{")]
        speeds.update({int(r["pl"]): float(r["speed_tg"]) for r in rows if int(r["pl"]) in todo})
        printed = f"{' '.join(out.args)}\nits output ends:\n{out.stdout[-600:]}{out.stderr[-1200:]}"
        missing = [b for b in todo if b not in speeds]
        if missing and attempt == 0:
            print(
                f"llama-batched-bench printed no row for B = {missing}; running it again for them:\n{printed}",
                file=sys.stderr,
                flush=True,
            )
    missing = [b for b in batches if b not in speeds]
    if missing:
        raise LabError(f"llama-batched-bench printed no row for B = {missing}, twice; expected one per B:\n{printed}")
    return {b: speeds[b] for b in batches}


def lab_batched(model, b: int, pp: int, tg: int, threads: int | None = None, n_batch: int = 512) -> float:
    """The lab's batched decode for B = ``b`` sequences (B / median TPOT of a closed loop with B
    clients and B requests on llama.cpp)."""
    from lablib.engines import load_engine
    from lablib.measure.closed_loop import run_closed_loop

    engine = load_engine("llama.cpp", model, n_ctx=b * (pp + tg) + 16, n_seq_max=b, threads=threads, n_batch=n_batch)
    try:
        ids = distinct_prompts(model, pp, b)
        traces = run_closed_loop(engine, ids, b, "batched", GenerationConfig(max_new_tokens=tg)).traces
        return b / statistics.median(t.tpot_s for t in traces)
    finally:
        engine.close()


@takes_model
def batched_rows(
    model, batches=None, pp: int | None = None, tg: int | None = None, threads: int | None = None
) -> list[dict]:
    """Tidy rows for a figure (:func:`lablib.plots.anchor_bars`): ``source`` ("lab" or
    "llama-batched-bench"), ``concurrency`` (B) and ``output_tps`` (generated tokens/s across the
    batch), for each B, the anchor first. Defaults: ``config.BUDGETS["anchors"]`` (quick or full)."""
    from lablib.config import budget
    from lablib.machine.threads import default_threads

    batches = batches or budget("anchors", "batches")
    pp, tg = pp or budget("anchors", "prompt_tokens"), tg or budget("anchors", "max_new_tokens")
    threads = threads or default_threads()
    anchor = batched_bench(model.path_for("gguf", "llama.cpp"), list(batches), pp, tg, threads)
    rows = []
    for b in batches:
        rows.append({"source": "llama-batched-bench", "concurrency": b, "output_tps": anchor[b]})
        rows.append({"source": "lab", "concurrency": b, "output_tps": lab_batched(model, b, pp, tg, threads)})
    return rows


def _run_tool(name: str, gguf: str, threads: int, n_batch: int, flash: str, *args: str):
    """llama.cpp's program ``name`` on ``gguf`` with the lab engine's settings (``-t`` threads, ``-b`` and
    ``-ub`` the batch, ``-fa`` flash attention), then ``args``; its output captured (CalledProcessError
    when it fails)."""
    tool = str(_tool(name))
    argv = [tool, "-m", gguf, "-t", str(threads), "-b", str(n_batch), "-ub", str(n_batch), "-fa", flash, *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def _tool(name: str):
    """llama.cpp's program ``name``, built on first use (install-time code, imported only here)."""
    from lablib.build.llama import llama_tool

    return llama_tool(name)
