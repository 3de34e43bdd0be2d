"""The launch floor: the roofline's third line, what one decode step costs an engine besides bytes and FLOPs.

The roofline bounds a decode step by its bytes over the memory bandwidth and its FLOPs over the peak
rate (:mod:`lablib.studies.roofline`). An engine also pays a fixed cost per step: a kernel launch per
operation (a few microseconds each on a GPU; a step of a 30-layer model launches hundreds), the
framework's Python between them, a synchronisation to read the token back. On a CPU with a 135M model
that cost is a small share of a step that reads 100-500 MB; on a big GPU the bytes take 0.1 ms and the
fixed cost is the step (issue 37 measured transformers at 18 ms a token on an H200, whose bandwidth
allows 0.1 ms): the engine is **bound by launches**, and a roofline without this line would put it at
a tiny share of a bound it can never approach, or, with a compiled or graph-captured step, above one.

Measured, not modelled: the engine decodes the model's **skeleton** (:mod:`lablib.model.skeleton`: the
same architecture, layers, heads and vocabulary at widths of 8 per head, 17 MB for SmolLM2) on the same
device with the same threads, one warm-up and :data:`REPS` requests of :data:`PROMPT_TOKENS` prompt and
:data:`NEW_TOKENS` output tokens; the floor is the best repetition's TPOT (seconds per decode step), as the
ceilings are each kernel's best (:mod:`lablib.machine.ceilings`): other work on a shared machine only slows a
repetition (a median of 3 measured beside a test run was 9 times the quiet one). A floor above a row's own
measured step was disturbed when it was measured: :func:`lablib.studies.roofline.add_bound_columns` does not
hold that row to it. The skeleton
does every launch, every line of Python and every sync of the real step, so the real step cannot be
faster (noise aside); the skeleton's few bytes are counted in its floor, which keeps it a lower bound.

A floor is a fact of (engine, model, device, threads, the load options that change the step): measured
by :func:`measure_floor` (``lablib roofline`` and lab 07 do it for the engines they show) and cached per
machine in ``<lab home>/hardware/<machine key>-launch-floor.json``; :func:`lablib.studies.roofline.
add_bound_columns` holds each row to ``max(bytes / W, FLOPs / P, floor)`` where a floor is cached for it.
"""

from __future__ import annotations

import json
import statistics
import time

from lablib.config import lab_home
from lablib.errors import LabError

PROMPT_TOKENS = 16
NEW_TOKENS = 32  # 31 decode steps a request
REPS = 5
FLOOR_VERSION = 2  # 2: the best repetition, not the median
# load options that change what a decode step runs (the rest, e.g. the weights' dtype, change its bytes)
STEP_OPTIONS = ("compile",)


def _device_kind(device) -> str:
    from lablib.machine.device_ceilings import device_kind

    return device_kind(str(device)) if device else "cpu"


def floor_key(engine: str, model_sha256: str, device=None, threads=None, options: dict | None = None) -> str:
    """The cache key of a floor: engine, model, device kind, threads (on a CPU; a GPU's step does not
    depend on them) and the :data:`STEP_OPTIONS` given."""
    kind = _device_kind(device)
    parts = [engine, model_sha256[:16], kind]
    if kind == "cpu":
        parts.append(f"t{int(float(threads))}" if threads else "t?")
    parts += [f"{k}={(options or {})[k]}" for k in STEP_OPTIONS if (options or {}).get(k) not in (None, False, "False")]
    return "|".join(parts)


def cache_path():
    from lablib.machine.identity import machine_key

    return lab_home() / "hardware" / f"{machine_key()}-launch-floor.json"


def _cache() -> dict:
    """The cache file's content, or a fresh one where it is missing, of another version or not what this module
    writes (a cache is only ever measured again)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        data = None
    ok = isinstance(data, dict) and data.get("version") == FLOOR_VERSION and isinstance(data.get("floors"), dict)
    return data if ok else {"version": FLOOR_VERSION, "floors": {}}


def cached_floors() -> dict:
    """{key: floor dict} of every floor measured on this machine (:func:`floor_key`)."""
    return {k: f for k, f in _cache()["floors"].items() if isinstance(f, dict) and _seconds(f.get("floor_s"))}


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def floor_for(engine: str, model_sha256: str, device=None, threads=None, options: dict | None = None) -> float | None:
    """The cached floor (seconds per decode step) for a row's engine, model, device and threads, or None."""
    f = cached_floors().get(floor_key(engine, model_sha256, device, threads, options))
    return f["floor_s"] if f else None


def floor_load(engine: str, device=None, threads=None) -> dict:
    """The load options that put ``engine`` on a row's ``device`` and ``threads`` (its columns): threads on a CPU;
    on a GPU ``device=`` where the engine's loader takes one (transformers), else its own default (llama.cpp
    offloads by itself)."""
    import inspect

    from lablib.engines import engine_class

    kind = _device_kind(device)
    if kind == "cpu":
        try:
            return {"threads": int(float(threads))} if threads else {}
        except ValueError:  # "auto" or other words: the engine's own automatic threads
            return {}
    takes = inspect.signature(engine_class(engine).__init__).parameters
    return {"device": kind} if "device" in takes else {}


def measure_floor(model, engine: str, refresh: bool = False, log=print, **load) -> dict:
    """The launch floor of ``engine`` for ``model`` on this machine: {engine, key, floor_s (the skeleton's best
    repetition's TPOT, seconds), median_s, min_s, max_s, reps, device, threads, skeleton (its weight count), step_s (median
    seconds per step of each request), time}. ``load``: the engine's load options (device, threads,
    compile...), as for the real model. Cached (``refresh`` measures again)."""
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.sweep import measure
    from lablib.measure.workload import prompt_of_length
    from lablib.model.resolve import resolve
    from lablib.model.skeleton import skeleton_of

    rm = resolve(model)
    skel = skeleton_of(rm, log=log)
    engine_obj = load_engine(engine, skel, **load)
    try:
        info = engine_obj.info()
        key = floor_key(engine, rm.sha256, info.device, info.threads, load)
        if not refresh and key in cached_floors():
            return cached_floors()[key]
        ids = prompt_of_length(skel, PROMPT_TOKENS)
        rows = measure(engine_obj, ids, GenerationConfig(max_new_tokens=NEW_TOKENS), warmup=1, reps=REPS)
    finally:
        engine_obj.close()
    steps = [r["tpot_s"] for r in rows if r.get("tpot_s")]
    if not steps:
        raise LabError(f"{engine}: the skeleton's requests gave no decode step to time; expected {NEW_TOKENS} tokens")
    floor = {
        "engine": engine,
        "key": key,
        "floor_s": min(steps),
        "median_s": statistics.median(steps),
        "min_s": min(steps),
        "max_s": max(steps),
        "reps": len(steps),
        "step_s": steps,
        "device": info.device,
        "threads": info.threads,
        "options": {k: load[k] for k in STEP_OPTIONS if load.get(k)},
        "skeleton_parameters": skel.parameters,
        "model_sha256": rm.sha256,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    cache = _cache()
    cache["floors"][key] = floor
    from lablib.machine.ceilings import save_measurement

    save_measurement(cache_path(), cache)
    return floor


def measure_floors(model, engines, refresh: bool = False, log=print) -> dict:
    """{engine: :func:`measure_floor`} for each engine with its default load options; an engine that cannot run
    the skeleton here gives {engine, error} instead (its rows then keep the two-line roofline)."""
    out = {}
    for name in engines:
        try:
            out[name] = measure_floor(model, name, refresh=refresh, log=log)
        except Exception as e:  # noqa: BLE001 - an engine that cannot run the skeleton: said, the rest goes on
            out[name] = {"engine": name, "error": _why(name, e)}
    return out


def _why(engine: str, e: Exception) -> str:
    """A floor that could not be measured, in words: a LabError's message, or what the engine raised."""
    from lablib.errors import first_line

    if isinstance(e, LabError):
        return str(e)
    return (
        f"{engine} could not decode the model's skeleton ({type(e).__name__}: {first_line(str(e))[:200]}); its rows keep "
        "the two-line roofline"
    )


def floors_for_rows(df, model, refresh: bool = True, log=print) -> dict:
    """Measure the floor of every (engine, device, threads) that rows ``df`` ran with, so
    :func:`lablib.studies.roofline.add_bound_columns` finds them: {engine: the floor of its first group, or
    {engine, error} where the engine cannot run the skeleton here (its rows keep the two-line roofline)}.

    ``refresh`` (default): measured now, beside the rows, so under the same conditions as they were (a floor
    cached while other work ran was four times the quiet one here, and it would hold every later row to it);
    False: a cached floor where there is one (seconds a floor otherwise: the skeleton decodes fast)."""
    if "engine" not in df.columns:
        raise LabError("floors_for_rows: the rows have no engine column; expected rows the lab measured")
    cols = [c for c in ("engine", "device", "threads", "compile_mode") if c in df.columns]
    out = {}
    for keys, _g in df.groupby(cols, dropna=False, sort=False):
        where = dict(zip(cols, keys if isinstance(keys, tuple) else (keys,)))
        dev, th = (_text(where.get(k)) for k in ("device", "threads"))
        try:
            load = floor_load(where["engine"], dev, th)
            if _text(where.get("compile_mode")):  # transformers' compiled decoding: its own, lower floor
                load["compile"] = True
            f = measure_floor(model, where["engine"], refresh=refresh, log=log, **load)
        except Exception as e:  # noqa: BLE001 - an engine that cannot run the skeleton: said, the rest goes on
            f = {"engine": where["engine"], "error": _why(where["engine"], e)}
        out.setdefault(where["engine"], f)
    return out


def _text(value):
    return None if value is None or value != value or value == "" else str(value)
