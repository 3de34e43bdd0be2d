"""The lab's GPU paths in one go (issue 37's GPU check): a table of what ran, what it measured, and the rows.

    python benchmarks/gpu_check.py [--device cuda] [--out DIR] [--budget-s 480] [--no-llama | --llama-build DIR]

Made for a machine with one NVIDIA GPU, 16 cores and no network (the default model and the packages already
there; ``benchmarks/gpu_kit.py`` carries them where they are not), in at most 8 minutes. First, in the
background, llama.cpp's CUDA build (``python -m lablib.build.llama --install``: the wheel and its tools, for the
GPU's compute capability; minutes). Meanwhile, in this process:

1. ``doctor``: ``lablib doctor`` (exit code, its device line, its GPU warnings);
2. ``facts``: NVML's GPU, driver and CUDA version (:func:`lablib.machine.telemetry.gpu_facts`), torch's CUDA;
3. ``greedy``: 64 greedy ids of transformers on the device in float32 against the CPU's (equal, or the first
   position where they differ);
4. ``ceilings``: the device's bandwidth and matrix FLOP/s through torch
   (:func:`lablib.machine.device_ceilings.measure_device`);
5. ``overhead``: the lab's decode tok/s against a bare forward loop (``benchmarks/overhead.py``), alternating;
5b. ``compiled``: transformers with ``compile=True`` (CUDA graphs): eager against compiled TPOT, the compile's
   seconds, and the lab's TPOT against a bare timing of the same compiled ``generate``
   (``benchmarks/compiled_decode.py``; issue 37 wants the ratio >= 0.97);
6. ``context``: a context sweep of transformers on the device (128 to 8,000 tokens) under
   :class:`lablib.machine.telemetry.GpuTelemetry`;
7. ``concurrency``: serial against batched at 1 to 32 clients, under the same telemetry;
7b. ``floors``: transformers' launch floor on the device, eager and compiled (:mod:`lablib.studies.launch_floor`:
   the model's skeleton decoded; what a step costs besides its bytes);
7c. ``steps``: what one eager transformers decode step does on the device, the model and its skeleton: torch
   operations and kernel launches a step, the step's time, the host's time per operation
   (``benchmarks/step_profile.py``);
8. ``roofline``: every row of 6 and 7 against the device's own ceilings and its engine's launch floor (which of
   the three lines binds); the largest share of a bound;
8b. ``first``: transformers' first requests after a load on the device, each load in a fresh process
   (:mod:`lablib.studies.first_requests`: what a warm-up throws away on a GPU; rows to
   ``DIR/first-requests.jsonl``);
9. ``llama.cpp``: once its build is done, llama-bench's tg128 and pp512 against the lab's llama.cpp on the GPU
   (:mod:`lablib.studies.anchors`).

Rows go to ``DIR/context-<gpu>.jsonl``, ``DIR/concurrency-<gpu>.jsonl`` and ``DIR/roofline-<gpu>.jsonl`` (the
context rows with their bound columns; all with their manifests; ``<gpu>`` the device's name, ``nvidia-h200``;
a rerun replaces them), the table to ``DIR/gpu-check.txt``. Those three files
are reference files as they stand (:mod:`lablib.results.reference`): copied into ``data/reference/`` after reading
them, labs 02, 03 and 07 draw them beside a learner's own run. ``--device cpu`` runs every step but 9 on this CPU (a dry run of
the script here: its numbers are the CPU's). ``LABLIB_QUICK=1``: smaller sweeps. Each step is timed and
guarded: a failed step is a row of the table with its error, and the next step runs.

``--llama-build DIR``: llama.cpp's build was started before this script (``benchmarks/gpu_kit.py start``, in the
device call before, so that it builds while this one measures); step 9 waits for ``DIR/llama-build.rc`` (its
exit code, written when it ends) instead of starting one, and names ``DIR/llama-build.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

QUICK = os.environ.get("LABLIB_QUICK") == "1"
T0 = time.monotonic()


class StartedBuild:
    """llama.cpp's build started before this script: its log, and its exit code in ``llama-build.rc`` once it
    ends. ``wait`` as :meth:`subprocess.Popen.wait` (polling the file every 2 s)."""

    def __init__(self, folder: Path):
        self.log, self.rc_file, self.returncode = folder / "llama-build.log", folder / "llama-build.rc", None

    def wait(self, timeout: float) -> int:
        if not self.log.is_file():  # never started, not "still running"
            raise RuntimeError(f"no llama.cpp build was started here: {self.log} is missing (gpu_kit.py start)")
        deadline = time.monotonic() + timeout
        while not self.rc_file.is_file():
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"llama.cpp's build ({self.log})", timeout)
            time.sleep(2)
        text = self.rc_file.read_text().strip()
        self.returncode = int(text) if text.lstrip("-").isdigit() else 1
        return self.returncode

    def kill(self) -> None:  # not ours to stop: it may still finish for the next call
        pass


class Table:
    def __init__(self, path: Path):
        self.path, self.rows = path, []
        path.write_text("")  # this run's table: a rerun's rows not under an earlier run's

    def add(self, step: str, ok: bool, seconds: float, what: str) -> None:
        self.rows.append((step, "ok" if ok else "FAILED", f"{seconds:.0f}", what))
        line = f"{step:<12} {'ok' if ok else 'FAILED':<7} {seconds:>5.0f} s  {what}"
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def script_line(name: str, args: list[str], prefix: str, timeout_s: float = 300) -> str:
    """Run the benchmark script ``name`` (beside this one) with ``args``; the first line of its output starting
    with ``prefix`` (its summary line). RuntimeError with its exit code and the end of its stderr without one."""
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith(prefix)), None)
    if line is None:  # a failed step of the table, not an "ok" with the script's error in it
        raise RuntimeError(f"{name} exited {r.returncode} without its summary line: {r.stderr.strip()[-300:]}")
    return line


def gpu_name() -> str:
    """The first NVIDIA GPU's name, as NVML or nvidia-smi gives it (:func:`lablib.machine.devices.nvidia_facts`);
    "cuda" where neither sees one (the steps then fail one by one, each saying why)."""
    from lablib.machine.devices import nvidia_facts

    gpus = nvidia_facts()["gpus"]
    return gpus[0]["name"] if gpus else "cuda"


def step(table: Table, name: str, fn, budget_end: float):
    if time.monotonic() > budget_end:
        table.add(name, False, 0, "skipped: the time budget was spent")
        return None
    t = time.monotonic()
    try:
        out = fn()
        table.add(name, True, time.monotonic() - t, out if isinstance(out, str) else json.dumps(out, default=str)[:300])
        return out
    except Exception as e:  # noqa: BLE001 - every step is a row, the next one runs
        table.add(name, False, time.monotonic() - t, f"{type(e).__name__}: {e}"[:300])
        traceback.print_exc()
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default="results/gpu-check")
    ap.add_argument("--table", default=None, help="the table's file (default: OUT/gpu-check.txt), row by row")
    ap.add_argument("--budget-s", type=float, default=480.0)
    llama_opts = ap.add_mutually_exclusive_group()
    llama_opts.add_argument("--no-llama", action="store_true", help="skip llama.cpp's CUDA build and its check")
    llama_opts.add_argument(
        "--llama-build",
        metavar="DIR",
        help="wait for the llama.cpp build started before (DIR/llama-build.rc once it ends; gpu_kit.py start)",
    )
    ns = ap.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    end = T0 + ns.budget_s
    table = Table(Path(ns.table) if ns.table else out / "gpu-check.txt")
    build, build_log = None, out / "llama-build.log"
    if ns.llama_build:  # started before this script, on any device
        build = StartedBuild(Path(ns.llama_build))
        build_log = build.log
    elif ns.device == "cuda" and not ns.no_llama:  # minutes: started first, waited for last
        log = open(build_log, "w")  # noqa: SIM115 - the child writes it until the end
        build = subprocess.Popen(
            [sys.executable, "-m", "lablib.build.llama", "--install"], stdout=log, stderr=subprocess.STDOUT
        )

    import lablib
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.machine.telemetry import GpuTelemetry, gpu_facts
    from lablib.measure.workload import prompt_of_length
    from lablib.results.reference import file_name
    from lablib.results.store import runs_path

    model = lablib.prepare(log=lambda *_: None)
    dev = ns.device
    machine = "cpu dry run" if dev == "cpu" else gpu_name()  # the reference files' <gpu>: NVIDIA H200
    (out / "first-requests.jsonl").unlink(missing_ok=True)
    for kind in ("context", "concurrency", "roofline"):  # a rerun's files are its own rows, not two runs' mixed
        for p in (out / file_name(kind, machine), runs_path(out / file_name(kind, machine))):
            p.unlink(missing_ok=True)

    def doctor():
        r = subprocess.run([sys.executable, "-m", "lablib.cli", "doctor"], capture_output=True, text=True, timeout=300)
        lines = [
            ln for ln in r.stdout.splitlines() if "cuda" in ln.lower() or "gpu" in ln.lower() or "warn" in ln.lower()
        ]
        return f"rc {r.returncode}; " + " | ".join(lines[:4])

    def facts():
        import torch

        return {"nvml": gpu_facts(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}

    def greedy():
        ids = prompt_of_length(model, 64)
        cfg = GenerationConfig(max_new_tokens=64)
        got = {}
        for d in ("cpu", dev):
            e = load_engine("transformers", model, device=d, dtype="float32")
            got[d] = e.generate(ids, cfg).token_ids
            e.close()
        a, b = got["cpu"], got[dev]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        return f"{len(a)} ids; equal: {a == b}; first difference at {first}"

    def ceilings():
        from lablib.machine.device_ceilings import measure_device

        m = measure_device(dev, refresh=True, quick=QUICK)
        flops = {k: round(v / 1e12, 2) for k, v in m["flop_per_s"].items()}
        return f"{m['name']}: read {m['bytes_per_s'] / 1e9:.0f} GB/s, copy {m['bandwidth']['copy']['bytes_per_s'] / 1e9:.0f} GB/s; TFLOP/s {flops}"

    def overhead():
        return script_line("overhead.py", ["--engines", "transformers", "--new-tokens", "64", "--reps", "3"], "engine=")

    def compiled():
        return script_line(
            "compiled_decode.py", ["--device", dev, "--new-tokens", "64", "--reps", "3"], "compiled device="
        )

    frames = []

    def context():
        from lablib.measure.sweep import context_sweep

        lengths = [128, 1024] if QUICK else [128, 512, 1024, 4000, 8000]
        with GpuTelemetry() as t:
            df = context_sweep(
                model,
                engines=["transformers"],
                prompt_tokens=lengths,
                max_new_tokens=32,
                reps=2 if QUICK else 3,
                out=out / file_name("context", machine),
                progress=False,
            )
        frames.append(df)
        s = t.summary(int(df["output_tokens"].sum()))
        med = df.groupby("prompt_tokens")[["prefill_tps", "decode_tps", "ttft_s"]].median().round(3)
        return f"{med.to_dict('index')}; device {set(df['device'])}; gpu {s.get('gpu_telemetry')!s:.200}"

    def concurrency():
        from lablib.measure.sweep import concurrency_sweep
        from lablib.results.tables import run_table

        levels = [1, 8] if QUICK else [1, 4, 16, 32]
        with GpuTelemetry() as t:
            df = concurrency_sweep(
                model,
                engines=["transformers"],
                concurrency=levels,
                prompt_tokens=64,
                max_new_tokens=32,
                out=out / file_name("concurrency", machine),
                progress=False,
            )
        frames.append(df)
        r = run_table(df).set_index(["mode", "concurrency"])["output_tps"].round(1).to_dict()
        s = t.summary(int(df["output_tokens"].sum()))
        return (
            f"output tok/s {r}; J/token {s.get('gpu_j_per_output_token')}; peak memory "
            f"{s.get('gpu_memory_used_peak_bytes')} B; SM clock p50 {s.get('gpu_sm_clock_mhz_p50')} MHz; "
            f"power p50 {s.get('gpu_power_w_p50')} W; runs recorded {len(df.attrs.get('runs') or [])}"
        )

    def steps():
        return " | ".join(
            script_line("step_profile.py", ["--device", dev, *extra], "step ") for extra in ([], ["--skeleton"])
        )

    def floors():
        from lablib.studies.launch_floor import measure_floor

        got = {}
        for name, load in (
            ("transformers", {"device": dev}),
            ("transformers compiled", {"device": dev, "compile": True}),
        ):
            f = measure_floor(model, "transformers", refresh=True, log=lambda *_: None, **load)
            got[name] = round(1e3 * f["floor_s"], 3)
        return f"launch floor, ms a decode step of the model's skeleton on {dev}: {got}"

    def roofline():
        import pandas as pd

        from lablib.studies.launch_floor import floors_for_rows
        from lablib.studies.roofline import add_bound_columns

        rows = pd.concat(frames, ignore_index=True)
        floors_for_rows(rows, model, log=lambda *_: None)  # the third line, per engine, device and threads
        df = add_bound_columns(rows, model)
        # lab 07's reference: the single-stream rows, as a learner's own roofline rows are (a context sweep)
        df[df["sweep"] == "context"].to_json(out / file_name("roofline", machine), orient="records", lines=True)
        worst = df["decode_pct_of_bound"].max()
        by = df["decode_bound_by"].value_counts().to_dict()
        floor = df["launch_floor_s"].median()
        return (
            f"decode % of its device's bound: max {worst:.1f}, median {df['decode_pct_of_bound'].median():.1f}; "
            f"bound by {by}; floor {1e3 * floor:.2f} ms a step; bound {df['bound_bytes_per_s'].iloc[0] / 1e9:.0f} GB/s"
        )

    def first():
        from lablib.studies.first_requests import first_request_table, first_requests

        rows = first_requests(
            model,
            engines=["transformers"],
            loads=2,
            requests=4,
            progress=False,
            load_kw={"device": dev},
            timeout_s=max(30.0, end - time.monotonic()),
        )
        rows.to_json(out / "first-requests.jsonl", orient="records", lines=True)  # read, not a reference kind
        said = [
            f"load {r.load_number} {r.load_s:.1f} s: first TTFT {1e3 * r.first_ttft_s:.1f} ms, later "
            f"{1e3 * r.steady_ttft_s:.1f} ms ({r.first_over_steady_ttft:.2f}x; TPOT {r.first_over_steady_tpot:.2f}x)"
            for r in first_request_table(rows).itertuples()
        ]
        return f"transformers on {rows['device'].iloc[0]}, loaded twice in a fresh process: " + "; ".join(said)

    def llama():
        left = max(1.0, end - time.monotonic())
        try:
            build.wait(timeout=left)
        except subprocess.TimeoutExpired:
            build.kill()
            raise TimeoutError(f"llama.cpp's build was not done within the budget (log {build_log})") from None
        if build.returncode != 0:
            raise RuntimeError(f"llama.cpp's build failed (exit {build.returncode}; log {build_log})")
        from lablib.build.llama import build_report

        built = build_report() or {}
        log = out / "anchors.log"  # every line as it comes: a stop at the budget keeps what ran
        with open(log, "w") as f:
            r = subprocess.run(
                [sys.executable, str(Path(__file__).resolve().parent / "anchors.py"), "--rounds", "2",
                 "--only", "tg128@d0,pp512,B4"],
                stdout=f, stderr=subprocess.STDOUT, text=True, timeout=max(60.0, end + 60 - time.monotonic()),
            )  # fmt: skip
        said = [ln for ln in log.read_text().splitlines() if ln.startswith("anchor=")]
        if r.returncode != 0 or not said:
            raise RuntimeError(f"anchors.py exited {r.returncode} with {len(said)} results (log {log})")
        beside = "; built beside the steps above" if isinstance(build, StartedBuild) else ""
        return f"{' | '.join(said)} (CUDA: {built.get('cuda', 'unknown')}{beside})"

    step(table, "doctor", doctor, end)
    step(table, "facts", facts, end)
    step(table, "greedy", greedy, end)
    step(table, "ceilings", ceilings, end)
    step(table, "overhead", overhead, end)
    step(table, "compiled", compiled, end)
    step(table, "context", context, end)
    step(table, "concurrency", concurrency, end)
    step(table, "floors", floors, end)
    step(table, "steps", steps, end)
    if frames:
        step(table, "roofline", roofline, end)
    step(table, "first", first, end)  # while llama.cpp's build runs on, if it still does
    if build is not None:
        step(table, "llama.cpp", llama, end + 60)
    print(f"# {time.monotonic() - T0:.0f} s in all; table in {table.path}", flush=True)
    made = [out / file_name(k, machine) for k in ("context", "concurrency", "roofline")]
    if dev == "cuda" and all(p.is_file() for p in made):  # lab 02, 03 and 07's GPU reference, once read
        print(f"# the reference rows, after reading them: cp {' '.join(map(str, made))} data/reference/", flush=True)
    return 0 if all(r[1] == "ok" for r in table.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
