"""Measuring requests: warm-up, repetitions, one tidy row per measured request.

Warm-up requests run first and are not recorded (first-call costs: allocator,
kernel selection, MLX graph compilation). Each measured request starts from an
empty KV cache (the engines guarantee it), so prefill is always the whole prompt.
"""

from __future__ import annotations

import uuid

from lablib.config import budget
from lablib.engines import NAMES, canonical, engine_class, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.memory import check_fits
from lablib.errors import ContextOverflowError, LabError
from lablib.measure.closed_loop import MODES, run_closed_loop
from lablib.measure.workload import DEFAULT_MESSAGES, chat_ids, distinct_prompts, lab_tokenizer, prompt_of_length
from lablib.model.resolve import resolve
from lablib.results.store import ResultsWriter, run_manifest, trace_row


def engine_manifest(engine, workload: dict | None = None) -> dict:
    """The run manifest (:func:`lablib.results.store.run_manifest`) of a run on a loaded ``engine``."""
    return run_manifest(engine.info().to_dict(), engine.model.manifest(), workload)


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
    for _ in range(warmup):
        if cancel is not None and cancel.is_set():
            return
        engine.generate(ids, cfg)
    for rep in range(reps):
        if cancel is not None and cancel.is_set():
            return
        trace = engine.generate(ids, cfg)
        row = trace_row(trace, manifest, repetition=rep, **labels)
        if token_ids:
            row["token_ids"] = list(trace.token_ids)
        yield row


def side_by_side(
    model=None,
    *,
    engines=NAMES,
    messages=None,
    ids=None,
    max_new_tokens: int | None = None,
    warmup: int = 1,
    reps: int | None = None,
    progress: bool = True,
):
    """The same prompt ids through each engine: one row per measured request.

    ``messages`` (chat, rendered by the lab's tokenizer) or ``ids`` give the
    prompt (default: :data:`lablib.measure.workload.DEFAULT_MESSAGES`, "What is the capital
    of France?"). Budgets default to ``lablib.config.BUDGETS["side_by_side"]`` (64 tokens
    x 5 repetitions, 16 x 2 in quick mode). Each engine is loaded, measured and closed in
    turn (one in memory at a time). Returns a pandas DataFrame with the metrics, ``text``
    and the manifest fields.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    rm = resolve(model)
    if ids is None:
        ids = chat_ids(rm, messages or DEFAULT_MESSAGES)
    max_new_tokens = max_new_tokens or budget("side_by_side", "max_new_tokens")
    reps = reps or budget("side_by_side", "reps")
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    rows = []
    for name in tqdm(list(engines), desc="engines", disable=not progress):
        engine = load_engine(name, rm)
        try:
            for row in measure(engine, ids, cfg, warmup=warmup, reps=reps):
                row["text"] = engine.detokenize(row["token_ids"])
                rows.append(row)
        finally:
            engine.close()
    return pd.DataFrame(rows)


# --- parameters and guards ------------------------------------------------------------------
def budgeted_int(value, kind: str, setting: str) -> int:
    """``value`` as one positive int, or the budget's default for ``kind``/``setting`` when it is
    None (:func:`lablib.config.budget`: quick or full). LabError for anything else."""
    return positive_ints([budget(kind, setting) if value is None else value], setting)[0]


def positive_ints(values, what: str) -> list[int]:
    """``values`` (a list or "64,256") as a non-empty list of positive ints; LabError otherwise."""
    if isinstance(values, str):
        values = [v for v in values.replace(" ", "").split(",") if v]
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError):
        raise LabError(f"{what}={values!r}: expected whole numbers such as 64,256") from None
    if not out:
        raise LabError(f"{what} is empty: expected at least one value")
    bad = [v for v in out if v < 1]
    if bad:
        raise LabError(f"{what}={out}: every value must be at least 1 (got {bad})")
    return out


def engine_names(engines) -> list[str]:
    """Canonical engine names from a list or "a,b,c"; LabError for unknown or none."""
    if isinstance(engines, str):
        engines = [e for e in engines.split(",") if e.strip()]
    names = [canonical(e) for e in engines]
    if not names:
        raise LabError(f"no engine given: expected one or more of {', '.join(NAMES)}")
    return list(dict.fromkeys(names))


def weights_load_kwargs(names, weights) -> dict[str, dict]:
    """{engine: load keywords} loading each engine of ``names`` with its weight choice in
    ``weights``: {engine: choice} or "engine=choice,..." (e.g. "openvino=source,ort=int4"; None: every
    engine's default), as the engine's weights option (``Engine.weights_option``: openvino
    ``weights=``, onnxruntime-genai ``precision=``, transformers ``dtype=``). Raises LabError, before any
    work, for an engine the sweep does not run or a choice it does not have."""
    if isinstance(weights, str):
        pairs = [w.split("=", 1) for w in weights.split(",") if w.strip()]
        bad = [w for w in pairs if len(w) != 2 or not w[0].strip() or not w[1].strip()]
        if bad:
            raise LabError(f"weights {weights!r}: expected engine=choice pairs, such as openvino=source,ort=int4")
        weights = {e.strip(): c.strip() for e, c in pairs}
    out: dict[str, dict] = {canonical(name): {} for name in names}
    for given, choice in (weights or {}).items():
        name = canonical(given)
        if name not in out:
            raise LabError(
                f"weights for {given!r}: {name} is not among this sweep's engines ({', '.join(out)}); "
                "expected weight choices for the engines it runs"
            )
        cls = engine_class(name)
        cls.check_weights(choice)
        out[name] = {cls.weights_option: choice}
    return out


def default_prompt_lengths(model, max_new_tokens: int) -> list[int]:
    """Log-spaced prompt lengths 64, 128, ... up to what the trained context holds
    with ``max_new_tokens`` of output (quick mode: ``BUDGETS["context"]["prompt_tokens"]``)."""
    lengths = budget("context", "prompt_tokens")
    if lengths is not None:
        return list(lengths)
    limit = (model.max_position_embeddings or 2048) - max_new_tokens
    out, n = [], 64
    while n <= limit:
        out.append(n)
        n *= 2
    return out or [max(1, limit)]


def check_plan(model, engines, prompt_tokens, max_new_tokens, concurrency=(1,)) -> None:
    """Refuse a plan before anything runs: context overflow or memory that will not fit."""
    longest = max(prompt_tokens) + max_new_tokens
    trained = model.max_position_embeddings
    if trained and longest > trained:
        raise ContextOverflowError(
            f"context overflow: prompt {max(prompt_tokens)} + output {max_new_tokens} = {longest} tokens, but "
            f"{model.name} was trained to {trained}. Use prompt lengths up to {trained - max_new_tokens}."
        )
    # the sweep's prompts come from the lab's tokenizer (transformers, which imports torch: about
    # 300 MiB once loaded): load it first, so the memory check counts it as in use, not as free
    lab_tokenizer(model)
    check_fits(model, [engine_class(n) for n in engines], longest, max(concurrency))


def modes_per_engine(engines, modes) -> dict[str, list[str]]:
    """{engine: the modes of ``modes`` it runs} for canonical engine names ``engines`` (an engine runs
    only the scheduling modes it has, ``Engine.modes``). Raises LabError naming an engine that has
    none of ``modes`` (a sweep would load it and run nothing)."""
    plan = {name: [m for m in modes if m in engine_class(name).modes] for name in engines}
    for name, kept in plan.items():
        if not kept:
            has = engine_class(name).modes
            raise LabError(
                f"engine {name} has no {' or '.join(modes)} mode (it runs {', '.join(has)}): "
                f"add {has[0]} to the modes, or leave {name} out"
            )
    return plan


def check_requests(requests, levels) -> int | None:
    """``requests`` per concurrency run, checked: None (2 x C per level) or a whole number at least
    the largest level C (C clients need C requests to ever have C in flight). Raises LabError."""
    if requests is None:
        return None
    requests = positive_ints([requests], "requests")[0]
    if requests < max(levels):
        raise LabError(
            f"requests={requests} with concurrency up to {max(levels)}: C clients need at least "
            f"C requests to ever have C in flight; give requests >= {max(levels)}, or leave it "
            "out for 2 x C per level"
        )
    return requests


def _emit(row: dict, rows: list, writer, on_row, bar) -> None:
    """A finished request's row: kept, on disk at once, to the caller, counted."""
    rows.append(row)
    if writer:
        writer.append(row)
    if on_row:
        on_row(row)
    bar.update(1)


# --- context sweep ----------------------------------------------------------------------------
def context_sweep(
    model=None,
    *,
    engines=NAMES,
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
    "ort=int4": :func:`weights_load_kwargs`; each row records it, ``weights``). Returns a DataFrame of
    the rows of this call. Raises LabError/ContextOverflowError for bad parameters before any work.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    if max_new_tokens is None:
        max_new_tokens = budget("context", "max_new_tokens")
    max_new_tokens = positive_ints([max_new_tokens], "max_new_tokens")[0]
    reps = budgeted_int(reps, "context", "reps")
    if warmup < 0:
        raise LabError(f"warmup={warmup}: expected 0 or more")
    names = engine_names(engines)
    load = weights_load_kwargs(names, weights)
    rm = resolve(model)
    lengths = positive_ints(
        default_prompt_lengths(rm, max_new_tokens) if prompt_tokens is None else prompt_tokens, "prompt_tokens"
    )
    check_plan(rm, names, lengths, max_new_tokens)
    writer = ResultsWriter(out) if out else None
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    n_ctx = max(lengths) + max_new_tokens
    rows = []
    bar = tqdm(total=len(names) * len(lengths) * reps, desc="context sweep", unit="req", disable=not progress)
    try:
        for name in names:
            engine = load_engine(name, rm, n_ctx=n_ctx, **load[name])
            try:
                for n in lengths:
                    ids = prompt_of_length(rm, n, corpus=corpus)
                    workload = {
                        "sweep": "context",
                        "prompt_tokens": n,
                        "max_new_tokens": max_new_tokens,
                        "warmup": warmup,
                        "reps": reps,
                        "corpus": corpus,
                    }
                    for row in iter_measure(
                        engine,
                        ids,
                        cfg,
                        warmup,
                        reps,
                        workload,
                        cancel=cancel,
                        token_ids=False,
                        sweep="context",
                        mode="single",
                        concurrency=1,
                    ):
                        row["request_index"] = row["repetition"]
                        _emit(row, rows, writer, on_row, bar)
                    if cancel is not None and cancel.is_set():
                        return pd.DataFrame(rows)
            finally:
                engine.close()
    finally:
        bar.close()
    return pd.DataFrame(rows)


# --- concurrency sweep --------------------------------------------------------------------------
class _Cancelled(Exception):
    pass


def concurrency_sweep(
    model=None,
    *,
    engines=NAMES,
    concurrency=None,
    modes=MODES,
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
    modes it has (``Engine.modes``: ONNX Runtime GenAI is serial only).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    levels = positive_ints(budget("concurrency", "concurrency") if concurrency is None else concurrency, "concurrency")
    if prompt_tokens is None:
        prompt_tokens = budget("concurrency", "prompt_tokens")
    n_prompt = positive_ints([prompt_tokens], "prompt_tokens")[0]
    if max_new_tokens is None:
        max_new_tokens = budget("concurrency", "max_new_tokens")
    n_out = positive_ints([max_new_tokens], "max_new_tokens")[0]
    per_client = budget("concurrency", "requests_per_client")
    if isinstance(modes, str):
        modes = [m for m in modes.split(",") if m.strip()]
    modes = [m.strip() for m in modes]
    if not modes or any(m not in MODES for m in modes):
        raise LabError(f"modes={modes!r}: expected one or more of {', '.join(MODES)}")
    requests = check_requests(requests, levels)
    if warmup < 0:
        raise LabError(f"warmup={warmup}: expected 0 or more")
    names = engine_names(engines)
    load = weights_load_kwargs(names, weights)
    engine_modes = modes_per_engine(names, modes)
    rm = resolve(model)
    check_plan(rm, names, [n_prompt], n_out, levels)
    cmax = max(levels)
    writer = ResultsWriter(out) if out else None
    cfg = GenerationConfig(max_new_tokens=n_out)
    plan = [(c, requests or per_client * c) for c in levels]
    rows = []
    bar = tqdm(
        total=sum(len(m) for m in engine_modes.values()) * sum(r for _, r in plan),
        desc="concurrency sweep",
        unit="req",
        disable=not progress,
    )

    def keep(trace, manifest, labels):
        _emit(trace_row(trace, manifest, **labels), rows, writer, on_row, bar)
        if cancel is not None and cancel.is_set():
            raise _Cancelled

    try:
        for name in names:
            # the engine's own load defaults for cmax sequences (llama.cpp: one KV sequence each)
            kw = {
                **engine_class(name).default_load_kwargs(rm, cmax),
                "n_ctx": cmax * (n_prompt + n_out) + 16,
                **load[name],
            }
            engine = load_engine(name, rm, **kw)
            try:
                for mode in engine_modes[name]:
                    if warmup:
                        run_closed_loop(
                            engine,
                            [prompt_of_length(rm, n_prompt, corpus=corpus)] * warmup,
                            min(warmup, cmax),
                            mode,
                            cfg,
                        )
                    for c, r in plan:
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
                        run_closed_loop(
                            engine, prompts, c, mode, cfg, on_trace=lambda t, m=manifest, lb=labels: keep(t, m, lb)
                        )
            finally:
                engine.close()
    except _Cancelled:
        pass
    finally:
        bar.close()
    return pd.DataFrame(rows)
