"""The first requests after a load: what a warm-up request throws away, engine by engine (lab 01).

Every measurement of the lab starts after an unrecorded warm-up request, as the field's tools do (``vllm bench
latency --num-iters-warmup``, llama-bench's warm-up run): the first request after a load can pay for work done once,
and a TTFT that holds it says nothing of the engine's steady speed. What that work is, and when it comes back,
differs by engine; this study measures it instead of assuming it.

Each engine runs in a Python process of its own, started fresh for it (a new interpreter, as a learner's first
cell, a script or a server's first request after its start), so nothing the
calling process did before (a torch already imported and used) hides the cost. In that process the engine loads the
model ``loads`` times (each load closed before the next) and after each load sends ``requests`` greedy requests of
``prompt_tokens`` prompt tokens and ``max_new_tokens`` output tokens (EOS ignored), each prompt a different stretch
of the lab's prose (:func:`lablib.measure.workload.distinct_prompts`: no prefix a cache could reuse). Rows: one per request, ``load_number`` (1: the process's first
load, whose ``load_s`` also holds the import of the engine's own library; the prompts are made before each load, so
the lab's tokenizer, and with it transformers and torch, are imported before the first) and ``request_number`` (1:
the first request after that load), with the metrics of DESIGN.md and the manifest. :func:`first_request_table` puts each load's first
request beside the median of the later ones.

What it showed on the lab's 2-core machine (SmolLM2, 64 + 16 tokens, ten runs, one beside a test run): OpenVINO's first request after
*every* load took 2.5-4.5 times the TTFT of the later ones (0.1-0.3 s more: the cost belongs to the loaded model,
not the process) and 0.9-1.15 times their TPOT (the cost is in the prefill); transformers' 1.0-2.2 times, after
either load; llama.cpp's 0.9-1.25 times and ONNX Runtime GenAI's 1.0-1.1 (within the noise: llama.cpp allocates its
KV cache and compute buffers when it loads). From the second request on, each engine was steady.
"""

from __future__ import annotations

import statistics
import time
import uuid

from lablib.errors import LabError

PROMPT_TOKENS = 64
NEW_TOKENS = 16
TIMEOUT_S = 900.0  # one engine's process: imports, loads and requests
MAX_LOADS = 10  # loads of one engine in its process
MAX_REQUESTS = 50  # requests after each load


def first_requests(
    model=None,
    engines=None,
    loads: int | None = None,
    requests: int | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    max_new_tokens: int = NEW_TOKENS,
    progress: bool = True,
    timeout_s: float | None = TIMEOUT_S,
    load_kw: dict | None = None,
    log=None,
    out=None,
):
    """The first ``requests`` requests after each of ``loads`` loads of each engine of ``engines`` (default: the
    model's default set; engines that load the model in process only), each engine in a fresh process of its own; a
    pandas DataFrame, one row per request (``load_number``, ``request_number``, ``load_s``, the metrics, the
    manifest; ``sweep`` "first_requests"). Budgets default to ``lablib.config.BUDGETS["first_requests"]``.
    ``load_kw``: keywords of every load (:func:`lablib.engines.load_engine`: ``threads=2``; ``device="cuda"`` for
    transformers), checked against each engine before any process starts; each row's manifest records what the
    engine ran with. ``timeout_s``: seconds one engine's process may take (None: no limit).

    LabError, before any process starts, for a budget that is not a whole number in range (``loads`` 1 to
    :data:`MAX_LOADS`, ``requests`` 2 to :data:`MAX_REQUESTS`: a first request and later ones to hold it against;
    prompts that the lab's prose cannot give distinct), a request longer than the model's context, an engine that
    is not in-process, or a keyword an engine does not take. An engine that cannot read the model (said without
    starting its process) or fails in its process (not installed here, a crash, past ``timeout_s``) is said in one
    line through ``log`` (default: stderr) and left out, and the engines that finished keep their rows (the
    DataFrame's ``attrs["failed"]``: {engine: why}); LabError when every engine failed. A Ctrl-C stops the run
    (the running engine's process is stopped with it). ``out`` (.jsonl or .parquet, checked before any process
    starts): each engine's rows appended as its process returns them, so a Ctrl-C or an error later keeps the
    engines that finished on disk."""
    import sys

    import pandas as pd
    from tqdm.auto import tqdm

    from lablib.checks import whole
    from lablib.config import budget
    from lablib.engines import IN_PROCESS, check_load_args, check_load_keywords, check_supported
    from lablib.measure.plan import engine_names
    from lablib.measure.workload import DISTINCT_GAP, corpus_ids
    from lablib.model.resolve import resolve
    from lablib.results.store import ResultsWriter

    loads = whole(
        budget("first_requests", "loads") if loads is None else loads,
        "loads",
        f"a whole number from 1 to {MAX_LOADS}",
        hi=MAX_LOADS,
    )
    requests = whole(
        budget("first_requests", "requests") if requests is None else requests,
        "requests",
        f"a whole number from 2 to {MAX_REQUESTS} (the first request, and later ones to hold it against)",
        lo=2,
        hi=MAX_REQUESTS,
    )
    prompt_tokens = whole(prompt_tokens, "prompt_tokens", "a whole number of tokens, at least 1")
    max_new_tokens = whole(max_new_tokens, "max_new_tokens", "a whole number of tokens, at least 1")
    if timeout_s is not None and not (
        isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and 0 < timeout_s < float("inf")
    ):
        raise LabError(f"timeout_s={timeout_s!r}: expected a positive number of seconds (None: no limit)")
    if load_kw is not None and not isinstance(load_kw, dict):
        raise LabError(f"load_kw={load_kw!r}: expected a dict of load_engine's keywords, such as {{'threads': 2}}")
    load_kw = check_load_args(dict(load_kw or {}))
    rm = resolve(model)
    trained = rm.max_position_embeddings
    if trained and prompt_tokens + max_new_tokens > int(trained):
        raise LabError(
            f"prompt_tokens={prompt_tokens} + max_new_tokens={max_new_tokens} = {prompt_tokens + max_new_tokens} "
            f"tokens: more than {rm.name} was trained on ({trained}); expected a shorter request"
        )
    prose, span = len(corpus_ids(rm)), loads * requests * (prompt_tokens + DISTINCT_GAP)
    if span > prose:  # distinct_prompts would wrap around the prose: prompts would repeat, and a cache reuse them
        raise LabError(
            f"loads={loads} x requests={requests} x prompt_tokens={prompt_tokens} = "
            f"{loads * requests * prompt_tokens} tokens of distinct prompts, more than the lab's prose holds with "
            f"{DISTINCT_GAP} tokens between two prompts ({span} of its {prose}); expected fewer loads, requests or "
            "prompt tokens"
        )
    names = engine_names(engines, rm)
    for name in names:
        if name not in IN_PROCESS:
            raise LabError(
                f"engine {name}: first_requests loads an engine in a process of its own, expected one of "
                f"{', '.join(IN_PROCESS)}; a server's first request: `lablib bench --warmup 0`"
            )
        check_load_keywords(name, load_kw)
    writer = ResultsWriter(out) if out else None
    say = log or (lambda m: print(m, file=sys.stderr))
    rows, failed, run_id = [], {}, uuid.uuid4().hex[:12]  # one run's rows, told apart from another's in a file
    for name in tqdm(names, desc="engines, each in a fresh process", disable=not progress):
        try:
            check_supported(name, rm)  # an engine that cannot read the model: said without starting its process
            done = _in_fresh_process(name, rm, loads, requests, prompt_tokens, max_new_tokens, timeout_s, load_kw)
        except LabError as e:
            failed[name] = str(e)
            say(f"left out: {e}")
            continue
        for row in done:
            row["run_id"] = run_id
            if writer:
                writer.append(row)
        rows += done
    if not rows:
        raise LabError("every engine failed: " + "; ".join(failed.values()))
    df = pd.DataFrame(rows)
    df.attrs["failed"] = failed
    return df


def _in_fresh_process(name, model, loads, requests, prompt_tokens, max_new_tokens, timeout_s, load_kw) -> list[dict]:
    """:func:`_measure` of one engine in a fresh interpreter (``python -m lablib.studies.first_requests FOLDER``, tied
    to this process: :func:`lablib.children.tied`); its rows, or LabError naming the engine. A child command, not
    multiprocessing's spawn, which runs the caller's script again in the child (a script without an
    ``if __name__ == "__main__":`` guard would start the study again there)."""
    import pickle
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from lablib.children import tied

    with tempfile.TemporaryDirectory(prefix="lablib-first-requests-") as folder:
        job = dict(name=name, model=model, loads=loads, requests=requests)
        job.update(prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, load_kw=load_kw)
        (Path(folder) / "job.pkl").write_bytes(pickle.dumps(job))
        cmd = [sys.executable, "-m", "lablib.studies.first_requests", folder]
        try:  # run() kills the child on any exception: the timeout, a Ctrl-C
            p = subprocess.run(tied(cmd), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise LabError(
                f"{name}: its process gave no rows within {timeout_s:g} s (it imports the engine, loads the model "
                f"{loads} time{'s' * (loads != 1)} and sends {loads * requests} requests); give a larger timeout_s, or "
                "fewer requests"
            ) from None
        out = Path(folder) / "rows.pkl"
        if not out.is_file():
            said = [line for line in (p.stderr or "").splitlines() if line.strip()]
            raise LabError(
                f"{name}: its process ended without its rows (exit code {p.returncode}: a crash, or killed for "
                f"memory; its last line: {said[-1] if said else 'none'}); run the engine alone "
                f"(lablib.load_engine({name!r}, model, ...) in a cell) to see why"
            )
        kind, payload = pickle.loads(out.read_bytes())
    if kind == "error":
        raise LabError(f"{name}: {payload}")
    return payload


def main(argv: list[str]) -> int:
    """The fresh process: the job in ``argv[0]``/job.pkl measured (:func:`_measure`), its rows or why not (a
    LabError's message, or another exception's type and message: a LabError subclass or a library's exception
    need not survive pickling) written to rows.pkl beside it."""
    import pickle
    from pathlib import Path

    folder = Path(argv[0])
    job = pickle.loads((folder / "job.pkl").read_bytes())
    try:
        out = ("rows", _measure(**job))
    except LabError as e:
        out = ("error", str(e))
    except Exception as e:  # the engine's library failed: its exception in one line, not a traceback
        out = ("error", f"failed in its process: {type(e).__name__}: {e}")
    (folder / "rows.pkl").write_bytes(pickle.dumps(out))
    return 0


def _measure(name, model, loads, requests, prompt_tokens, max_new_tokens, load_kw=None) -> list[dict]:
    """In this process: ``loads`` loads of engine ``name``, each followed by ``requests`` requests of distinct
    prompts (:func:`lablib.measure.workload.distinct_prompts`, every one of the process its own); one row each."""
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import distinct_prompts
    from lablib.results.store import engine_manifest, flatten_manifest, trace_row

    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    workload = {"prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens, "warmup": 0, "reps": requests}
    # made before the first load, so that nothing but a load comes between it and its first request
    every = distinct_prompts(model, prompt_tokens, loads * requests)
    rows = []
    for load in range(1, loads + 1):
        prompts = every[(load - 1) * requests : load * requests]
        t0 = time.perf_counter()
        engine = load_engine(name, model, **(load_kw or {}))
        load_s = time.perf_counter() - t0
        try:
            engine.check_context(prompt_tokens, max_new_tokens)
            # nothing between the load and the first request: the manifest (which may measure the machine) after
            traces = [engine.generate(ids, cfg) for ids in prompts]
            manifest = engine_manifest(engine, workload)
        finally:
            engine.close()
        columns = flatten_manifest(manifest)
        for r, trace in enumerate(traces, 1):
            labels = dict(sweep="first_requests", load_number=load, request_number=r, load_s=load_s)
            rows.append(trace_row(trace, manifest, manifest_columns=columns, **labels))
    return rows


SOURCE = "lablib.studies.first_requests.first_requests"


def first_request_table(rows):
    """Per engine and load: the load's seconds, the first request's TTFT and TPOT, the median TTFT and TPOT of the
    later requests (``steady_*``), and how many times the steady value the first one is (``first_over_steady_*``).
    Needs the rows of one :func:`first_requests` run (engine, load_number, request_number, load_s, ttft_s,
    tpot_s; of a file holding other studies' rows too, those of ``sweep`` "first_requests"); LabError for rows
    that repeat an (engine, load, request) (two runs' rows: the message names their ``run_id``), or a load without
    its first request or without one after it."""
    import pandas as pd

    from lablib.results.tables import need, one_row_each

    keys = ["engine", "load_number", "request_number"]
    df = pd.DataFrame(rows)
    if "sweep" in df.columns and (df["sweep"] == "first_requests").any():  # a file of other studies' rows too
        df = df[df["sweep"] == "first_requests"]
    df = one_row_each(df, keys, "first_request_table", SOURCE)
    need(df, ["load_s", "ttft_s", "tpot_s"], "first_request_table", SOURCE)
    for k in ("load_number", "request_number"):
        if not pd.api.types.is_integer_dtype(df[k]):
            raise LabError(f"first_request_table: {k} holds {df[k].iloc[0]!r}, expected whole numbers (1: the first)")
    out, lacking = [], []
    for (engine, load), part in df.groupby(["engine", "load_number"], sort=False):
        first = part[part["request_number"] == 1]
        later = part[part["request_number"] > 1]
        if first.empty or later.empty:
            lacking.append(f"{engine} load {load} has {'no first request' if first.empty else 'no later request'}")
            continue
        row = {"engine": engine, "load_number": int(load), "load_s": float(first["load_s"].iloc[0])}
        for m in ("ttft_s", "tpot_s"):
            f = first[m].iloc[0]
            steady = [v for v in later[m] if v is not None and v == v]
            row[f"first_{m}"] = f
            row[f"steady_{m}"] = statistics.median(steady) if steady else None
            ok = f is not None and f == f and row[f"steady_{m}"]
            row[f"first_over_steady_{m.removesuffix('_s')}"] = f / row[f"steady_{m}"] if ok else None
        out.append(row)
    if lacking or not out:
        raise LabError(
            f"first_request_table: {'; '.join(lacking) or 'no rows'}; expected each load's first request and at "
            f"least one after it (the rows of {SOURCE}, requests >= 2)"
        )
    return pd.DataFrame(out)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
