"""Measuring requests: warm-up, repetitions, one tidy row per measured request; the one loop of a sweep.

Warm-up requests run first and are not recorded (first-call costs: allocator,
kernel selection, MLX graph compilation). Each measured request starts from an
empty KV cache (the engines guarantee it), so prefill is always the whole prompt.

A sweep is a plan run by one loop (llama-bench's ``get_cmd_params_instances`` and main loop):
:func:`run_plan` loads each engine of a list of :class:`Step` once, runs what the step measures,
writes each row as it finishes and closes the engine. :func:`context_sweep`,
:func:`concurrency_sweep` and :mod:`lablib.studies.prefix`'s two sweeps only build plans. Their
parameters are checked first, by the guards of :mod:`lablib.measure.plan`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

from lablib.checks import keywords_checked
from lablib.config import budget
from lablib.engines import engine_class, load_engine
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.machine.telemetry import RunTelemetry, cost_per_million_tokens
from lablib.measure import plan
from lablib.measure.closed_loop import SCHEDULING_MODES, run_closed_loop
from lablib.measure.headroom import frozen_heap
from lablib.measure.plan import (
    budgeted_int,
    check_plan,
    check_requests,
    check_warmup,
    default_prompt_lengths,
    engine_names,
    modes_per_engine,
    positive_ints,
    scheduling_modes,
    weights_load_kwargs,
)
from lablib.measure.workload import DEFAULT_MESSAGES, chat_ids, distinct_prompts, prompt_of_length, question_ids
from lablib.model.resolve import resolve
from lablib.results.store import ResultsWriter, append_run, engine_manifest, trace_row

__all__ = [
    "RunRecords",
    "Step",
    "concurrency_sweep",
    "context_sweep",
    "engine_manifest",
    "iter_measure",
    "measure",
    "measured_traces",
    "run_plan",
    "side_by_side",
    # the guards, reached as sweep.X by the widgets, the CLI, studies and tests (their home: lablib.measure.plan)
    *plan.__all__,
]


def _cancelled(cancel) -> bool:
    return cancel is not None and cancel.is_set()


class RunRecords:
    """The machine's own counters per measured point of a sweep (one context length of one engine, one
    concurrency level of one engine and mode, one engine of :func:`side_by_side`), warm-up left out: each point is
    sampled by ``telemetry()`` (:class:`lablib.machine.telemetry.RunTelemetry` by default: a factory, the seam a
    test gives recorded samples through) and ends as one record, kept in ``records`` and appended to
    ``<out>.runs.jsonl`` (:func:`lablib.results.store.append_run`) when ``out`` is given: the point's labels and
    ``run_id`` (its rows' too), :func:`lablib.results.tables.run_summary`'s ``requests``, ``output_tokens``,
    ``makespan_s`` and ``output_tps``, then :data:`lablib.results.schema.TELEMETRY`: GPU memory peak, SM clock,
    power and energy where NVML answers (energy only over a point of at least
    :data:`lablib.machine.telemetry.MIN_ENERGY_WINDOW_S`, else ``gpu_energy_note`` says why), the CPU packages'
    energy where RAPL is readable, else why not, and ``cost_per_mtok`` given ``price_per_hour``. A point a
    cancel or an error cut short gets no record. The rows themselves are written as each request finishes, as
    before: the record is the point's, written when it ends. ``on_point(record)``: called when a point has ended
    (its record written), before the next one begins: no request of the sweep is in flight then (a panel draws
    its live figure there: :class:`lablib.ui.background.Redrawer`)."""

    def __init__(
        self,
        out=None,
        telemetry: Callable | None = None,
        price_per_hour: float | None = None,
        on_point: Callable | None = None,
    ):
        cost_per_million_tokens(price_per_hour, 1.0, 1)  # a bad price is refused before any work
        self.out, self.price_per_hour, self.on_point = out, price_per_hour, on_point
        self.telemetry = telemetry or RunTelemetry
        self.records: list[dict] = []

    @contextmanager
    def point(self, **labels):
        """``with records.point(sweep=..., ...) as rows:`` the point's measured requests run inside; each of its
        rows is appended to ``rows`` (it gets ``run_id``, labels' or a new one)."""
        from lablib.results.tables import run_summary

        labels.setdefault("run_id", uuid.uuid4().hex[:12])
        rows = _PointRows(labels["run_id"])
        # the heap frozen before the counters' window opens (a load run inside then collects only what it made:
        # lablib.measure.headroom.frozen_heap), so the full collection is no part of the point's energy or cost
        with frozen_heap(), self.telemetry() as t:
            yield rows
        s = run_summary(rows)
        rec = {
            "engine": rows[0].get("engine") if rows else None,
            **labels,
            **{k: s[k] for k in ("requests", "output_tokens", "makespan_s", "output_tps")},
            **t.summary(s["output_tokens"]),
        }
        if self.price_per_hour is not None:
            rec["price_per_hour"] = self.price_per_hour
            rec["cost_per_mtok"] = cost_per_million_tokens(self.price_per_hour, s["makespan_s"], s["output_tokens"])
        self.records.append(rec)
        if self.out:
            append_run(self.out, rec)
        if self.on_point is not None:
            self.on_point(rec)

    def attach(self, df):
        """``df`` with the records as ``df.attrs["runs"]`` (a list of dicts), returned."""
        df.attrs["runs"] = list(self.records)
        return df


class _PointRows(list):
    """A point's rows: each appended row gets the point's ``run_id``."""

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id

    def append(self, row: dict) -> dict:
        row.setdefault("run_id", self.run_id)
        super().append(row)
        return row


def measured_traces(engine, prompts, cfg: GenerationConfig, warmup=(), warmup_cfg=None, cancel=None):
    """Warm-up, then the measured requests: each prompt of ``warmup`` is run unrecorded (with
    ``warmup_cfg``, default ``cfg``), then each prompt of ``prompts``; yields the measured requests'
    traces in order.

    The one loop of "warm-up unrecorded, then N recorded" (:func:`iter_measure`, the ladder's speed,
    the anchors, in-process against a server): a caller whose warm-up or prompts differ says so in
    these arguments. ``cancel`` (a threading.Event): checked before every request, warm-up
    included; once set, no more requests start and the generator ends.
    """
    for ids in warmup:
        if _cancelled(cancel):
            return
        engine.generate(ids, warmup_cfg or cfg)
    for ids in prompts:
        if _cancelled(cancel):
            return
        yield engine.generate(ids, cfg)


def measure(
    engine,
    ids: list[int],
    cfg: GenerationConfig | None = None,
    warmup: int = 1,
    reps: int = 3,
    workload: dict | None = None,
    **labels,
) -> list[dict]:
    """Run ``ids`` on ``engine`` ``warmup`` times unrecorded, then ``reps`` times.

    Returns ``reps`` rows (dicts: labels, metrics of DESIGN.md, manifest fields,
    ``token_ids``). Raises LabError for reps < 1 or warmup < 0, and
    ContextOverflowError before any work when the request cannot fit.
    """
    return list(iter_measure(engine, ids, cfg, warmup, reps, workload, **labels))


def iter_measure(
    engine,
    ids: list[int],
    cfg: GenerationConfig | None = None,
    warmup: int = 1,
    reps: int = 3,
    workload: dict | None = None,
    cancel=None,
    token_ids: bool = True,
    **labels,
):
    """:func:`measure`, one row at a time: each row is yielded as its request finishes.

    ``cancel`` (a threading.Event): checked before every request, warm-up included; once set,
    no more requests start and the generator ends. ``token_ids``: keep each row's output ids.
    """
    cfg = cfg or GenerationConfig()
    if reps < 1 or warmup < 0:
        raise LabError(f"reps={reps}, warmup={warmup}: expected reps >= 1 and warmup >= 0")
    engine.check_context(len(ids), cfg.max_new_tokens)
    manifest = engine_manifest(
        engine,
        workload or {"prompt_tokens": len(ids), "max_new_tokens": cfg.max_new_tokens, "warmup": warmup, "reps": reps},
    )
    for rep, trace in enumerate(measured_traces(engine, [ids] * reps, cfg, [ids] * warmup, cancel=cancel)):
        row = trace_row(trace, manifest, repetition=rep, **labels)
        if token_ids:
            row["token_ids"] = list(trace.token_ids)
        yield row


@keywords_checked
def side_by_side(
    model=None,
    *,
    engines=None,
    messages=None,
    ids=None,
    max_new_tokens: int | None = None,
    warmup: int = 1,
    reps: int | None = None,
    progress: bool = True,
    price_per_hour: float | None = None,
    telemetry: Callable | None = None,
    out=None,
):
    """The same prompt ids through each engine: one row per measured request.

    ``messages`` (chat, rendered by the lab's tokenizer) or ``ids`` give the
    prompt (default: :data:`lablib.measure.workload.DEFAULT_MESSAGES`, "What is the capital
    of France?", as raw text for a base model with no chat template: ``prompt_format`` "text", said once
    on stderr). Budgets default to ``lablib.config.BUDGETS["side_by_side"]`` (64 tokens
    x 5 repetitions, 16 x 2 in quick mode). Each engine is loaded, measured and closed in
    turn (one in memory at a time). Returns a pandas DataFrame with the metrics, ``text``
    and the manifest fields; each engine's measured requests (warm-up left out) are one point of
    :class:`RunRecords` (``price_per_hour``, ``telemetry``): its record in ``df.attrs["runs"]``. ``out``
    (.jsonl or .parquet, checked before any engine loads): each row appended as its request finishes (an error or
    a Ctrl-C later keeps the engines and requests before it on disk), each engine's record to
    ``<out>.runs.jsonl``, as a sweep's.
    """
    import sys

    import pandas as pd
    from tqdm.auto import tqdm

    rm = resolve(model)
    prompt_format = "tokens"
    if ids is None and messages is not None:
        ids, prompt_format = chat_ids(rm, messages), "chat"
    elif ids is None:
        ids, prompt_format = question_ids(rm, DEFAULT_MESSAGES, log=lambda m: print(m, file=sys.stderr))
    max_new_tokens = max_new_tokens or budget("side_by_side", "max_new_tokens")
    reps = reps or budget("side_by_side", "reps")
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    records = RunRecords(out, telemetry, price_per_hour)
    writer = ResultsWriter(out) if out else None
    rows = []
    for name in tqdm(engine_names(engines, rm), desc="engines", disable=not progress):
        engine = load_engine(name, rm)
        try:
            workload = {"prompt_tokens": len(ids), "max_new_tokens": cfg.max_new_tokens, "warmup": warmup, "reps": reps}
            engine.check_context(len(ids), cfg.max_new_tokens)
            for _ in measured_traces(engine, [], cfg, [ids] * warmup):  # warm-up: outside the point's counters
                pass
            with records.point(sweep="side_by_side", mode="single", concurrency=1) as point:
                for row in iter_measure(engine, ids, cfg, warmup=0, reps=reps, workload=workload):  # as each ends
                    row["text"] = engine.detokenize(row["token_ids"])
                    row["prompt_format"] = prompt_format
                    rows.append(point.append(row))
                    if writer:
                        writer.append(row)
        finally:
            engine.close()
    return records.attach(pd.DataFrame(rows))


# --- the one loop of a sweep ---------------------------------------------------------------------
class Step(NamedTuple):
    """One entry of a plan: the engine to load (a canonical name), its load keywords
    (:func:`lablib.engines.load_engine`), and ``run(engine, emit)``, which measures on the loaded
    engine (its own warm-up included) and calls ``emit(row)`` as each request finishes."""

    engine: str
    load: dict
    run: Callable


class _Cancelled(Exception):
    """Raised by :func:`run_plan`'s ``emit`` once ``cancel`` is set: it unwinds the step in flight
    (a closed loop's batch session included) and ends the plan."""


def run_plan(
    model,
    plan,
    *,
    out=None,
    on_row=None,
    cancel=None,
    progress: bool = True,
    total: int | None = None,
    desc: str = "sweep",
    unit: str = "req",
):
    """Run ``plan`` (a list of :class:`Step`) on ``model``, in order: the one loop of every sweep.

    Consecutive steps with the same engine and load keywords share one load (as llama-bench reuses
    a model for equal model parameters); an engine is closed before the next one loads, and when
    the plan ends, is cancelled or raises. Each row a step emits is kept, appended at once to
    ``out`` (.jsonl or .parquet; the file is checked before any engine loads), passed to
    ``on_row`` and counted on a progress bar of ``total`` (``desc``, ``unit``; none with
    ``progress=False``). ``cancel`` (a threading.Event) is checked before each step and after each
    row: once set, the plan stops with every finished row kept (a step also hands it to its own
    requests, e.g. :func:`iter_measure`'s). An exception (a step's, ``on_row``'s) closes the engine
    and propagates, the rows before it already on disk. Returns a DataFrame of this call's rows in
    the order they finished.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    writer = ResultsWriter(out) if out else None
    rows = []
    bar = tqdm(total=total, desc=desc, unit=unit, disable=not progress)

    def emit(row: dict) -> None:
        """A finished request's row: kept, on disk at once, to the caller, counted."""
        rows.append(row)
        if writer:
            writer.append(row)
        if on_row:
            on_row(row)
        bar.update(1)
        if _cancelled(cancel):
            raise _Cancelled

    engine, loaded = None, None
    try:
        for step in plan:
            if _cancelled(cancel):
                break
            if engine is None or loaded != (step.engine, step.load):
                if engine is not None:
                    engine, previous = None, engine
                    previous.close()
                engine = load_engine(step.engine, model, **step.load)
                loaded = (step.engine, step.load)
            step.run(engine, emit)
    except _Cancelled:
        pass
    finally:
        try:
            if engine is not None:
                engine.close()
        finally:
            bar.close()
    return pd.DataFrame(rows)


# --- context sweep ----------------------------------------------------------------------------
@keywords_checked
def context_sweep(
    model=None,
    *,
    engines=None,
    prompt_tokens=None,
    max_new_tokens: int | None = None,
    reps: int | None = None,
    warmup: int = 1,
    out=None,
    cancel=None,
    on_row=None,
    progress: bool = True,
    corpus: str = "prose",
    weights=None,
    price_per_hour: float | None = None,
    telemetry: Callable | None = None,
    on_point: Callable | None = None,
):
    """Prompt length against prefill and decode, per engine.

    For each engine (loaded once) and each prompt length in ``prompt_tokens``
    (default :func:`default_prompt_lengths`): ``warmup`` unrecorded requests,
    then ``reps`` measured ones, each from an empty KV cache, ``max_new_tokens``
    output tokens (defaults: ``lablib.config.BUDGETS["context"]``, 32 tokens x 3
    repetitions; quick mode 8 x 1). Every row is
    appended to ``out`` (.jsonl or .parquet) as it finishes and passed to
    ``on_row``; ``cancel`` (a threading.Event) stops between requests with
    every finished row kept. ``weights``: a weight choice per engine ({"openvino": "source"} or
    "ort=int4": :func:`weights_load_kwargs`; each row records it, ``weights``). Each (engine, length) is one
    point of :class:`RunRecords` (its measured requests, warm-up left out; ``price_per_hour``, ``telemetry``):
    its record is appended to ``<out>.runs.jsonl`` and kept in the DataFrame's ``attrs["runs"]``, its rows
    carry its ``run_id``; ``on_point(record)`` is called as each point ends, with no request in flight. Returns a
    DataFrame of the rows of this call. Raises LabError/ContextOverflowError for bad parameters before any work.
    """
    if max_new_tokens is None:
        max_new_tokens = budget("context", "max_new_tokens")
    max_new_tokens = positive_ints([max_new_tokens], "max_new_tokens")[0]
    reps = budgeted_int(reps, "context", "reps")
    check_warmup(warmup)
    records = RunRecords(out, telemetry, price_per_hour, on_point)
    rm = resolve(model)
    names = engine_names(engines, rm)
    load = weights_load_kwargs(names, weights)
    lengths = positive_ints(
        default_prompt_lengths(rm, max_new_tokens) if prompt_tokens is None else prompt_tokens, "prompt_tokens"
    )
    check_plan(rm, names, lengths, max_new_tokens)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    n_ctx = max(lengths) + max_new_tokens

    def one_length(n: int):
        def run(engine, emit):
            workload = {
                "sweep": "context",
                "prompt_tokens": n,
                "max_new_tokens": max_new_tokens,
                "warmup": warmup,
                "reps": reps,
                "corpus": corpus,
            }
            ids = prompt_of_length(rm, n, corpus=corpus)
            labels = dict(sweep="context", mode="single", concurrency=1)
            engine.check_context(n, max_new_tokens)
            for _ in measured_traces(engine, [], cfg, [ids] * warmup, cancel=cancel):  # outside the point
                pass
            with records.point(**labels, prompt_tokens=n) as point:
                for row in iter_measure(engine, ids, cfg, 0, reps, workload, cancel, token_ids=False, **labels):
                    row["request_index"] = row["repetition"]
                    emit(point.append(row))

        return run

    # one step per (engine, length), the same load keywords per engine: each engine is loaded once
    plan = [Step(name, {"n_ctx": n_ctx, **load[name]}, one_length(n)) for name in names for n in lengths]
    df = run_plan(
        rm,
        plan,
        out=out,
        on_row=on_row,
        cancel=cancel,
        progress=progress,
        total=len(plan) * reps,
        desc="context sweep",
    )
    return records.attach(df)


# --- concurrency sweep --------------------------------------------------------------------------
@keywords_checked
def concurrency_sweep(
    model=None,
    *,
    engines=None,
    concurrency=None,
    modes=SCHEDULING_MODES,
    requests: int | None = None,
    prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
    warmup: int = 1,
    out=None,
    cancel=None,
    on_row=None,
    progress: bool = True,
    corpus: str = "prose",
    weights=None,
    price_per_hour: float | None = None,
    telemetry: Callable | None = None,
    on_point: Callable | None = None,
):
    """Closed-loop clients against each engine, serial queue versus continuous batching.

    For each engine (loaded once, sized for the largest concurrency), each mode
    in ``modes`` and each level C in ``concurrency`` (default 1, 2, 4, 8; quick mode
    1, 2): C clients, ``requests`` requests in all (default 2 x C), each client
    sending its next request when its previous one finished
    (:func:`lablib.measure.closed_loop.run_closed_loop`). Prompts are ``prompt_tokens``
    long (default 64; quick mode 32), all different text, ``max_new_tokens``
    output each (default 32; quick 8); defaults: ``lablib.config.BUDGETS["concurrency"]``.
    ``warmup`` unrecorded requests per engine and mode first. One row per
    request, appended to ``out`` as it finishes and passed to ``on_row``;
    ``cancel`` (threading.Event) stops after the request that finishes next,
    keeping every finished row. ``weights``: a weight choice per engine (:func:`weights_load_kwargs`).
    Returns a DataFrame of this call's rows. An engine runs only the
    modes it has (``Engine.modes``: ONNX Runtime GenAI is serial only). Each run (engine, mode, C) is one
    point of :class:`RunRecords` (``price_per_hour``, ``telemetry``): its record, with its ``run_id``, is
    appended to ``<out>.runs.jsonl`` and kept in the DataFrame's ``attrs["runs"]``; ``on_point(record)`` is
    called as each run ends, with no request in flight.
    """
    levels = positive_ints(budget("concurrency", "concurrency") if concurrency is None else concurrency, "concurrency")
    if prompt_tokens is None:
        prompt_tokens = budget("concurrency", "prompt_tokens")
    n_prompt = positive_ints([prompt_tokens], "prompt_tokens")[0]
    if max_new_tokens is None:
        max_new_tokens = budget("concurrency", "max_new_tokens")
    n_out = positive_ints([max_new_tokens], "max_new_tokens")[0]
    per_client = budget("concurrency", "requests_per_client")
    modes = scheduling_modes(modes)
    requests = check_requests(requests, levels)
    check_warmup(warmup)
    records = RunRecords(out, telemetry, price_per_hour, on_point)
    rm = resolve(model)
    names = engine_names(engines, rm)
    load = weights_load_kwargs(names, weights)
    engine_modes = modes_per_engine(names, modes)
    check_plan(rm, names, [n_prompt], n_out, levels)
    cmax = max(levels)
    cfg = GenerationConfig(max_new_tokens=n_out)
    runs = [(c, requests or per_client * c) for c in levels]

    def one_mode(mode: str):
        def run(engine, emit):
            if warmup:
                warm = [prompt_of_length(rm, n_prompt, corpus=corpus)] * warmup
                run_closed_loop(engine, warm, min(warmup, cmax), mode, cfg)
            for c, r in runs:
                prompts = distinct_prompts(rm, n_prompt, r, corpus=corpus)
                workload = {
                    "sweep": "concurrency",
                    "mode": mode,
                    "concurrency": c,
                    "requests": r,
                    "prompt_tokens": n_prompt,
                    "max_new_tokens": n_out,
                    "warmup": warmup,
                    "corpus": corpus,
                }
                manifest = engine_manifest(engine, workload)
                labels = {
                    "sweep": "concurrency",
                    "mode": mode,
                    "concurrency": c,
                    "repetition": 0,
                    "run_id": uuid.uuid4().hex[:12],
                }
                with records.point(sweep="concurrency", mode=mode, concurrency=c, run_id=labels["run_id"]) as point:
                    run_closed_loop(
                        engine,
                        prompts,
                        c,
                        mode,
                        cfg,
                        on_trace=lambda t, m=manifest, lb=labels, p=point: emit(p.append(trace_row(t, m, **lb))),
                    )

        return run

    def load_kwargs(name: str) -> dict:
        # the engine's own load defaults for cmax sequences (llama.cpp: one KV sequence each)
        return {
            **engine_class(name).default_load_kwargs(rm, cmax),
            "n_ctx": cmax * (n_prompt + n_out) + 16,
            **load[name],
        }

    # one step per (engine, mode), the same load keywords per engine: each engine is loaded once
    plan = [Step(name, load_kwargs(name), one_mode(mode)) for name in names for mode in engine_modes[name]]
    df = run_plan(
        rm,
        plan,
        out=out,
        on_row=on_row,
        cancel=cancel,
        progress=progress,
        total=len(plan) * sum(r for _, r in runs),
        desc="concurrency sweep",
    )
    return records.attach(df)
