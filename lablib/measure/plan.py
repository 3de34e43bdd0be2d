"""A measurement's parameters, checked before anything loads: counts, engines, weights, modes, the plan.

Every guard raises LabError (ContextOverflowError for a request that cannot fit) naming what was
given and what was expected, so a sweep refuses a bad plan before it loads an engine. The sweeps
of :mod:`lablib.measure.sweep` and :mod:`lablib.studies.prefix` call them; the widgets call them to
check a form. Whole numbers and lists of them are :mod:`lablib.checks`' (``positive_ints``).
"""

from __future__ import annotations

from lablib.checks import csv_list, positive_ints
from lablib.config import budget
from lablib.engines import NAMES, canonical, check_supported, engine_class, engines_for
from lablib.engines.memory import check_fits
from lablib.errors import ContextOverflowError, LabError
from lablib.measure.closed_loop import SCHEDULING_MODES
from lablib.measure.workload import lab_tokenizer

__all__ = [
    "budgeted_int",
    "check_plan",
    "check_requests",
    "check_warmup",
    "default_prompt_lengths",
    "engine_names",
    "modes_per_engine",
    "positive_ints",
    "scheduling_modes",
    "weights_load_kwargs",
]


def budgeted_int(value, kind: str, setting: str) -> int:
    """``value`` as one positive int, or the budget's default for ``kind``/``setting`` when it is
    None (:func:`lablib.config.budget`: quick or full). LabError for anything else."""
    return positive_ints([budget(kind, setting) if value is None else value], setting)[0]


def check_warmup(warmup) -> int:
    """``warmup`` (unrecorded requests) when it is 0 or more; LabError otherwise."""
    if warmup < 0:
        raise LabError(f"warmup={warmup}: expected 0 or more")
    return warmup


def engine_names(engines, model=None) -> list[str]:
    """Canonical engine names from a list or "a,b,c"; None: the lab's default set, or with ``model`` the
    engines of it that can read that model (:func:`lablib.engines.engines_for`). LabError for unknown or
    none."""
    if engines is None:
        return engines_for(model) if model is not None else list(NAMES)
    if isinstance(engines, str):
        engines = csv_list(engines, "engines")
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
        pairs = [w.split("=", 1) for w in csv_list(weights, "weights")]
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
    """Refuse a plan before anything runs: an engine that cannot read the model, context overflow or memory
    that will not fit."""
    for name in engines:
        check_supported(name, model)
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


def scheduling_modes(modes) -> list[str]:
    """``modes`` (a list or "serial,batched") as a non-empty list of the scheduling modes of
    :data:`lablib.measure.closed_loop.SCHEDULING_MODES`; LabError otherwise."""
    if isinstance(modes, str):
        modes = csv_list(modes, "modes")
    modes = [m.strip() for m in modes]
    if not modes or any(m not in SCHEDULING_MODES for m in modes):
        raise LabError(f"modes={modes!r}: expected one or more of {', '.join(SCHEDULING_MODES)}")
    return modes


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
