"""The roofline: the least time a machine allows each phase of a request, from its FLOPs and bytes.

A phase of a request (prefill, decode) does F floating-point operations and moves at least B bytes
between memory and the cores; on a machine with peak rate P (FLOP/s) and memory bandwidth W
(bytes/s) it cannot take less than max(F / P, B / W) seconds. F / B (FLOP per byte) is the phase's
*arithmetic intensity*; P / W is the machine's *balance*: below it a phase is bandwidth-bound, above
it compute-bound (Williams, Waterman & Patterson, "Roofline: an insightful visual performance model
for multicore architectures", CACM 52(4), 2009).

F comes from the model's shape (:mod:`lablib.model.shape`, which writes the counting out: 2 FLOP per
matrix weight, 4 x layers x heads x head_dim per attended position). B, per step:
- the weights as the engine holds them (GGUF tensor types, safetensors dtypes, ONNX initializers)
  read once per step, an untied input embedding and rotary tables excepted (a step reads one row of
  each); the KV cache of the L positions read, and the new token's K and V written
  (:func:`lablib.model.shape.kv_bytes_per_token`). Activations stay in cache and are not counted:
  these are the compulsory bytes, so the bound is a ceiling.
- prefill of P prompt tokens: one pass over the weights for all P tokens; P tokens of KV cache written.
- decode with B sequences in a batch, each at depth L: one pass over the weights serves all B tokens,
  each reads its own L positions of KV cache.

Which weights and which compute type: what the run loaded, not the engine's defaults. A run's manifest
and rows record ``weights`` (the engine's weight choice: onnxruntime-genai "int4", openvino "source",
transformers "bfloat16"...) and ``compute_dtype`` (the type its matrix products ran at, as the engine
reported it: openvino's inference precision, bf16 on a CPU with AVX-512 BF16); :func:`engine_profile` takes
both, and the engine class says which tensors that choice holds and what it computes at
(:meth:`lablib.engines.base.Engine.weight_tensors`, :meth:`~lablib.engines.base.Engine.compute_dtype`).

Machines are dicts {name, bytes_per_s, flop_per_s: {float32, bfloat16, int8}, source}:
:func:`lablib.machine.ceilings.machine` (this machine's measurement or an entry of
:mod:`lablib.machine.accelerators`). The bound beside measured rows: :func:`add_bound_columns` (their
medians: :func:`lablib.results.tables.bound_table`); for models and machines you do not have:
:func:`predict`, :func:`what_if_table`, :func:`batch_sweep`; ``lablib roofline``: :func:`report`.
"""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.machine.ceilings import machine, peak_flops
from lablib.machine.device_ceilings import ceilings_for, device_kind, published_peaks_for
from lablib.model.resolve import takes_model
from lablib.model.shape import (
    PRESETS,
    flops_per_token,
    kv_bytes_per_token,
    kv_cache_bytes,
    matmul_weights,
    model_dims,
    prefill_flops,
)
from lablib.results.schema import (  # noqa: F401  (BOUND_COLUMNS: the columns add_bound_columns adds)
    BOUND_COLUMNS,
    MEASURED_BANDWIDTH,
    MEASURED_PEAKS,
)
from lablib.studies.launch_floor import floor_for

# what-if (predict with fmt=): the math each stored format runs at: 16-bit weights on 16-bit tensor math
# (the bfloat16 figure; float32's where a machine has none), quantized ones on int8 dot products
FORMAT_COMPUTE = {"F32": "float32", "F64": "float32", "F16": "bfloat16", "BF16": "bfloat16"}


# --- weights as stored ----------------------------------------------------------------------------------
def format_bits(fmt: str) -> float:
    """Bits per weight of a GGUF type name ('Q4_1' -> 5.0: blocks of 32 weights in 20 bytes, two float16
    scales and 16 bytes of nibbles) or 'F32'/'F16'/'BF16', from gguf-py's GGML_QUANT_SIZES (block size,
    bytes per block), the sizes of ggml's block structs. Raises LabError for an unknown name."""
    import gguf

    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.upper()]]
    except (KeyError, AttributeError):
        known = ", ".join(t.name for t in gguf.GGML_QUANT_SIZES)
        raise LabError(f"format {fmt!r}: not a GGUF tensor type; expected one of {known}") from None
    return 8 * size / block


def _tensors(model, engine: str, weights: str | None = None) -> tuple:
    """The tensors ``engine`` holds for ``model`` loaded with the weight choice ``weights`` (None: its
    default): the engine class says which (:meth:`lablib.engines.base.Engine.weight_tensors`)."""
    from lablib.engines import engine_class

    return engine_class(engine).weight_tensors(model, weights)


# tensors of which a step reads one row, not the whole: an input embedding (when the model has a separate
# LM head; tied, it is the LM head and read whole) and ONNX Runtime's rotary tables (a row per position)
INPUT_EMBEDDINGS = ("token_embd.weight", "model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight")
LM_HEADS = ("output.weight", "lm_head.weight", "lm_head.MatMul.weight")
ROTARY_TABLES = ("cos_cache", "sin_cache")


def _is_input_embedding(name: str) -> bool:
    return name in INPUT_EMBEDDINGS


def _has_separate_head(names) -> bool:
    return any(n in LM_HEADS for n in names)


@takes_model
def weight_table(model, engine: str, weights: str | None = None):
    """Weights ``engine`` loads with the weight choice ``weights`` (None: its default), per stored type:
    DataFrame of type, tensors, elements, bytes, bits_per_weight (from the GGUF header for llama.cpp and
    openvino, safetensors headers for transformers/MLX, the ONNX graph's initializers for
    onnxruntime-genai: INT4 there is a matrix in 4-bit blocks with its scales)."""
    import pandas as pd

    df = pd.DataFrame(_tensors(model, engine, weights), columns=["name", "type", "elements", "bytes"])
    g = df.groupby("type").agg(tensors=("name", "size"), elements=("elements", "sum"), bytes=("bytes", "sum"))
    g["bits_per_weight"] = 8 * g["bytes"] / g["elements"]
    return g.reset_index().sort_values("bytes", ascending=False, ignore_index=True)


@takes_model
def weight_bytes_read(model, engine: str, weights: str | None = None) -> int:
    """Bytes of weights one forward step reads, as stored for ``engine`` loaded with the weight choice
    ``weights`` (None: its default): every tensor, except those of which a step reads one row: an untied
    input embedding (tied, it is the LM head and read whole) and rotary tables (:data:`ROTARY_TABLES`)."""
    tensors = _tensors(model, engine, weights)
    separate = _has_separate_head(t[0] for t in tensors)
    return sum(t[3] for t in tensors if not ((separate and _is_input_embedding(t[0])) or t[0] in ROTARY_TABLES))


@takes_model
def compute_dtype(model, engine: str, weights: str | None = None) -> str:
    """The matrix-multiply type that bounds ``engine``'s arithmetic with the weight choice ``weights``, as
    the engine class expects it before loading (:meth:`lablib.engines.base.Engine.compute_dtype`: llama.cpp
    int8 for a quantized GGUF; openvino the plugin's inference precision; onnxruntime-genai int8 for its
    int4 build). A run's own, as its engine reported it, is its rows' ``compute_dtype``."""
    from lablib.engines import engine_class

    return engine_class(engine).compute_dtype(model, weights)


def _number(value) -> bool:
    """Whether a row's value is a number (not None, not NaN)."""
    return value is not None and value == value


def _given(value) -> str | None:
    """A row's text field, None when absent (None, NaN, "")."""
    return None if value is None or value != value or value == "" else str(value)


@takes_model
def engine_profile(model, engine, weights: str | None = None, dtype: str | None = None) -> dict:
    """{engine, weights, dims, weight_bytes, kv_bytes_per_element, compute_dtype} of ``model`` as ``engine``
    runs it loaded with the weight choice ``weights`` (what its EngineInfo, manifest and rows record as
    ``weights``: "int4", "source"...; None: its default) computing in ``dtype`` (what they record as
    ``compute_dtype``; None: what the engine class expects, :func:`compute_dtype`). ``engine``: a name,
    or a loaded Engine, whose ``info()`` gives both. Raises LabError for a choice the engine does not have."""
    from lablib.engines import canonical, engine_class

    if not isinstance(engine, str):  # a loaded engine: what it loaded, as it reports it
        info = engine.info()
        engine, weights, dtype = info.name, info.weights, info.compute_dtype
    engine = canonical(engine)
    cls = engine_class(engine)
    weights = cls.check_weights(_given(weights))
    return {
        "engine": engine,
        "weights": weights,
        "dims": model_dims(model),
        "weight_bytes": weight_bytes_read(model, engine, weights),
        "kv_bytes_per_element": cls.kv_bytes_per_value,
        "compute_dtype": _given(dtype) or compute_dtype(model, engine, weights),
    }


# --- phases: FLOPs, bytes, intensity, bound ------------------------------------------------------------
def _check_counts(**kw) -> None:
    bad = {k: v for k, v in kw.items() if not isinstance(v, (int, float)) or v != v or v < (1 if k != "context" else 0)}
    if bad:
        given = ", ".join(f"{k}={v!r}" for k, v in bad.items())
        raise LabError(f"{given}: expected numbers of tokens or sequences, at least 1 (a context may be 0)")


def decode_cost(profile: dict, context: int, batch: int = 1) -> dict:
    """One decode step of ``batch`` sequences, each attending ``context`` positions (a sliding-window layer at
    most its window, and reading only those keys and values): {flops, bytes, intensity (FLOP/byte)} of the
    whole step."""
    _check_counts(context=context, batch=batch)
    d = profile["dims"]
    kv = kv_cache_bytes(d, profile["kv_bytes_per_element"], context)  # the KV read: what attention attends
    flops = batch * flops_per_token(d, context)["total"]
    nbytes = profile["weight_bytes"] + batch * kv  # the new K, V are among the `context` positions
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes}


def prefill_cost(profile: dict, prompt_tokens: int) -> dict:
    """A prefill of ``prompt_tokens`` tokens: {flops, bytes (weights once + KV cache written), intensity}."""
    _check_counts(prompt_tokens=prompt_tokens)
    d = profile["dims"]
    flops = prefill_flops(d, prompt_tokens)["total"]
    nbytes = profile["weight_bytes"] + kv_bytes_per_token(d, profile["kv_bytes_per_element"]) * prompt_tokens
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes}


def bound_seconds(cost: dict, mach: dict, dtype: str) -> dict:
    """{seconds, compute_s, memory_s, bound ('compute' or 'bandwidth')}: the roofline's least time."""
    c = cost["flops"] / peak_flops(mach, dtype)
    m = cost["bytes"] / mach["bytes_per_s"]
    return {"seconds": max(c, m), "compute_s": c, "memory_s": m, "bound": "compute" if c > m else "bandwidth"}


def predict(
    model="SmolLM2-135M",
    engine: str | None = None,
    fmt: str | None = None,
    prompt_tokens: int = 256,
    context: int | None = None,
    batch: int = 1,
    machine_name=None,
    kv_bytes: float = 2,
    dtype: str | None = None,
) -> dict:
    """Predicted best prefill and decode speed (tokens/s) of a model on a machine.

    ``model``: a prepared model (with ``engine``: its real stored weights) or a preset name / shape dict
    (with ``fmt``: a GGUF type such as 'Q4_1', 'Q8_0', 'F16', 'F32' for every weight). ``prompt_tokens``:
    the prefill's length; ``context``: decode's depth (default prompt_tokens); ``batch``: sequences
    decoded together; ``machine_name``: see :func:`machine`; ``kv_bytes``: KV cache bytes per element
    (presets); ``dtype``: the compute type (default: the engine's, or :data:`FORMAT_COMPUTE`'s).

    Returns {machine, weight_bytes, prefill_tps, prefill_bound, prefill_intensity, decode_tps (per
    sequence), decode_tps_total (all sequences), decode_bound, decode_intensity, machine_balance
    (FLOP/byte), compute_dtype}.
    """
    if engine is not None:
        if isinstance(model, dict) or (isinstance(model, str) and model in PRESETS):
            name = model if isinstance(model, str) else "a shape dict"
            raise LabError(
                f"predict(model={name!r}, engine={engine!r}): a preset or a shape has no stored weights for an engine "
                f"to read; give fmt= instead (a GGUF type such as 'Q4_1'), or a prepared model with engine="
            )
        prof = engine_profile(model, engine)
    else:
        if fmt is None:
            raise LabError(
                "predict: give engine= (a prepared model's real weights) or fmt= (e.g. 'Q4_1') for a preset or a shape"
            )
        d = model_dims(model)
        bits = format_bits(fmt)
        norms = (2 * d["layers"] + 1) * d["hidden"] * 4  # norms stay float32 in GGUF files
        prof = {
            "engine": None,
            "dims": d,
            "weight_bytes": matmul_weights(d)["total"] * bits / 8 + norms,
            "kv_bytes_per_element": kv_bytes,
            "compute_dtype": FORMAT_COMPUTE.get(fmt.upper(), "int8"),
        }
    dtype = dtype or prof["compute_dtype"]
    mach = machine(machine_name)
    context = prompt_tokens if context is None else context
    pre = prefill_cost(prof, prompt_tokens)
    dec = decode_cost(prof, context, batch)
    pb, db = bound_seconds(pre, mach, dtype), bound_seconds(dec, mach, dtype)
    return {
        "machine": mach["name"],
        "weight_bytes": prof["weight_bytes"],
        "compute_dtype": dtype,
        "prefill_tps": prompt_tokens / pb["seconds"],
        "prefill_bound": pb["bound"],
        "prefill_intensity": pre["intensity"],
        "decode_tps": 1 / db["seconds"],
        "decode_tps_total": batch / db["seconds"],
        "decode_bound": db["bound"],
        "decode_intensity": dec["intensity"],
        "machine_balance": peak_flops(mach, dtype) / mach["bytes_per_s"],
    }


def crossover_batch(profile: dict, mach: dict, context: int = 0, dtype: str | None = None) -> float:
    """The batch size B at which decode turns from bandwidth- to compute-bound:
    B x F / P = (W + B x KV(L)) / BW, so B = (W / BW) / (F / P - KV(L) / BW) (F: FLOPs per token at
    depth L, W: weight bytes, KV(L): the KV bytes one sequence reads at depth L). inf when the KV reads alone keep it
    bandwidth-bound at any batch (the denominator is not positive)."""
    dtype = dtype or profile["compute_dtype"]
    d = profile["dims"]
    f = flops_per_token(d, context)["total"] / peak_flops(mach, dtype)
    kv = kv_cache_bytes(d, profile["kv_bytes_per_element"], context) / mach["bytes_per_s"]
    return float("inf") if f <= kv else (profile["weight_bytes"] / mach["bytes_per_s"]) / (f - kv)


def batch_sweep(
    profile: dict, mach: dict, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), context: int = 256, dtype: str | None = None
):
    """Predicted decode for each batch size: DataFrame of batch, step_s, decode_tps_total, decode_tps
    (per sequence), intensity (FLOP/byte), flop_per_s (attained), bound; its ``attrs`` hold the
    crossover batch size and the machine's ceilings."""
    import pandas as pd

    dtype = dtype or profile["compute_dtype"]
    rows = []
    for b in batches:
        cost = decode_cost(profile, context, int(b))
        t = bound_seconds(cost, mach, dtype)
        rows.append(
            {
                "batch": int(b),
                "step_s": t["seconds"],
                "decode_tps_total": b / t["seconds"],
                "decode_tps": 1 / t["seconds"],
                "intensity": cost["intensity"],
                "flop_per_s": cost["flops"] / t["seconds"],
                "bound": t["bound"],
            }
        )
    df = pd.DataFrame(rows)
    df.attrs.update(
        crossover=crossover_batch(profile, mach, context, dtype),
        machine=mach["name"],
        bytes_per_s=mach["bytes_per_s"],
        peak_flop_per_s=peak_flops(mach, dtype),
        dtype=dtype,
        engine=profile.get("engine"),
        context=context,
    )
    return df


# --- measured rows against the bound -----------------------------------------------------------------------


def add_bound_columns(df, model, machine_name=None, log=None):
    """Measured rows (tidy, one per request) with the roofline beside each: a new DataFrame with
    :data:`lablib.results.schema.BOUND_COLUMNS` added.

    Per row: the weights and compute type its engine ran with (its ``weights`` and ``compute_dtype``
    columns, from the run's manifest; the engine's defaults where a row has none, as rows written
    before these columns existed: :func:`engine_profile`); prefill of ``prompt_tokens``; decode at the
    mean depth prompt_tokens + output_tokens / 2,
    batch = concurrency for ``mode == 'batched'`` rows, else 1. ``*_bound_tps``: the roofline's tokens/s
    (decode: per sequence) on the machine; ``*_pct_of_bound``: 100 x measured / bound; ``*_flop_per_s``:
    the FLOP/s attained (decode: all sequences of the batch). The machine: the row's own
    ``measured_bandwidth_gbps`` / ``measured_<dtype>_g(fl)ops`` columns when ``machine_name`` is None and
    they are present (rows written on a measured machine: the manifest's figures are those of the device the
    engine computed on), else ``machine_name`` (:func:`machine`), else the ceilings of the row's own ``device``
    (:func:`lablib.machine.device_ceilings.ceilings_for`: this machine's CPU, measured now if never before, for a row
    computed on this machine (:func:`of_this_machine`; another machine's CPU row without its own ceilings gets no bound,
    and ``attrs["unbounded"]`` says so); a
    GPU's measured through torch where it is here, else the published peaks of the GPU its ``accelerator``
    names; a device nothing bounds, as a server's ``unknown``: its bound columns stay empty, never the CPU's; so
    do they for a row that names no engine, a server's summary merged beside the requests). Needs: engine, prompt_tokens, output_tokens, prefill_s, prefill_tps, decode_tps.

    A bound is a measurement too, and a row can beat it: ``attrs["above_bound"]`` holds :func:`above_bound`'s lines
    (none when every row is within its bound), and ``log`` (e.g. ``print``) is given each.
    """
    import math

    from lablib.results.tables import need

    need(
        df,
        ["engine", "prompt_tokens", "output_tokens", "prefill_s", "prefill_tps", "decode_tps"],
        "add_bound_columns",
        "a context or concurrency sweep (lablib.measure.sweep)",
    )
    mach = None  # resolved at the first row without its own measured columns (it may measure this machine)
    elsewhere = set()  # hostnames of rows computed on another machine's CPU without its ceilings: no bound
    ours = {}  # (machine_key, machine_id, hostname, cpu_model) a row states -> whether it is this machine
    devices = {}  # (device, accelerator) -> that device's ceilings, or None
    profiles = {}
    floors = {}  # (engine, device, threads, compile) -> the cached launch floor (seconds a step) or None
    sha = getattr(model, "sha256", None)  # a prepared model's floors (a preset shape has none)
    out = []
    for row in df.to_dict("records"):
        if not isinstance(row["engine"], str):  # a summary of a server's run (lab 05's rate sweep): no engine's bound
            out.append({**row, **dict.fromkeys(BOUND_COLUMNS)})
            continue
        key = (row["engine"], _given(row.get("weights")), _given(row.get("compute_dtype")))
        if key not in profiles:
            profiles[key] = engine_profile(model, *key)
        prof = profiles[key]
        dtype = prof["compute_dtype"]
        bw = row.get(MEASURED_BANDWIDTH) if machine_name is None else None
        # its own peak for the type, or float32's, which peak_flops falls back to (a machine whose torch ran no int8
        # or bfloat16 product records none for them)
        f = next(
            (v for d in (dtype, "float32") if d in MEASURED_PEAKS for v in [row.get(MEASURED_PEAKS[d])] if _number(v)),
            None,
        )
        if _number(bw) and f is not None:
            # every peak the row measured: peak_flops holds int8 to at least float32's
            peaks = {k: row.get(c) for k, c in MEASURED_PEAKS.items()}
            m = {
                "bytes_per_s": bw * 1e9,
                "flop_per_s": {k: v * 1e9 for k, v in peaks.items() if v is not None and v == v},
            }
        elif machine_name is not None:
            mach = mach or machine(machine_name)
            m = mach
        else:  # the ceilings of the device the row computed on: a GPU row is never held to the CPU's
            where = (_given(row.get("device")), _given(row.get("accelerator")))
            said = tuple(_given(row.get(c)) for c in ("machine_key", "machine_id", "hostname", "cpu_model"))
            if said not in ours:
                ours[said] = of_this_machine(row)
            if not ours[said] and device_kind(where[0]) == "cpu":
                # another machine's CPU, which recorded no ceilings: this machine's would be a bound of nothing
                elsewhere.add(_given(row.get("hostname")) or "a machine the row does not name")
                m = None
            elif not ours[said]:  # another machine's GPU: the published peaks of the one it names, never this one's
                m = published_peaks_for(where[1])
            else:
                if where not in devices:
                    devices[where] = ceilings_for(*where)
                m = devices[where]
        if m is None:  # nothing bounds it here (a server's unknown device, a GPU neither measured nor published)
            out.append({**row, **dict.fromkeys(BOUND_COLUMNS), "compute_dtype": dtype})
            continue
        p = int(row["prompt_tokens"])
        n = int(row["output_tokens"] or 1)
        batch = int(row.get("concurrency") or 1) if row.get("mode") == "batched" else 1
        depth = p + n / 2
        pre = prefill_cost(prof, p)
        dec = decode_cost(prof, depth, batch)
        pre_t, dec_b = bound_seconds(pre, m, dtype)["seconds"], bound_seconds(dec, m, dtype)
        key = (row["engine"], _given(row.get("device")), _given(row.get("threads")), _given(row.get("compile_mode")))
        if key not in floors:
            floors[key] = floor_for(key[0], sha, key[1], key[2], {"compile": bool(key[3])}) if sha else None
        floor = floors[key]
        dec_t, bound_by = dec_b["seconds"], dec_b["bound"]
        dtps = row["decode_tps"]
        dtps = float(dtps) if dtps is not None and dtps == dtps else math.nan
        if floor is not None and dtps == dtps and floor * dtps > 1.0:
            floor = None  # above the row's own measured step: disturbed when it was measured, not a floor of it
        if floor is not None and floor > dec_t:
            dec_t, bound_by = floor, "launches"
        f_tok = dec["flops"] / batch
        row.update(
            compute_dtype=dtype,
            bound_bytes_per_s=m["bytes_per_s"],
            bound_flop_per_s=peak_flops(m, dtype),
            prefill_flops=pre["flops"],
            prefill_bytes=pre["bytes"],
            prefill_intensity=pre["intensity"],
            prefill_flop_per_s=pre["flops"] / row["prefill_s"],
            prefill_bound_tps=p / pre_t,
            prefill_pct_of_bound=100 * row["prefill_tps"] / (p / pre_t),
            decode_depth=depth,
            decode_batch=batch,
            decode_flops_per_token=f_tok,
            decode_intensity=dec["intensity"],
            decode_flop_per_s=f_tok * dtps * batch,
            decode_bound_tps=1 / dec_t,
            decode_pct_of_bound=100 * dtps * dec_t,
            launch_floor_s=floor,
            decode_roof_s=dec_b["seconds"],
            decode_bound_by=bound_by,
        )
        out.append(row)
    import pandas as pd

    res = pd.DataFrame(out, index=df.index)
    res.attrs["above_bound"] = above_bound(res)
    res.attrs["unbounded"] = (
        [
            f"rows computed on another machine's CPU ({', '.join(sorted(elsewhere))}) carry no ceilings of it "
            "(measured_* columns), and this machine's are not its: their bound columns stay empty; run `lablib "
            "roofline` on that machine, and the rows it writes after carry its ceilings"
        ]
        if elsewhere
        else []
    )
    for line in res.attrs["above_bound"] + res.attrs["unbounded"] if log else ():
        log(line)
    return res


def of_this_machine(row) -> bool:
    """Whether ``row`` was computed on this machine, as far as it says: by its ``machine_id`` where it and this
    machine have one (the operating system's id: a Mac renamed by its network, a kernel update that changes the CPU
    flags or another CPU quota leave it as it is); else by its ``machine_key``
    (:func:`lablib.machine.identity.machine_key`: hostname, CPU, the CPUs the process could use); a row written
    before the lab recorded the key, by its hostname and CPU model (``data/reference``'s EPYC rows say "vm", as
    this lab's Xeon VMs do); a row that names none of them, yes."""
    from lablib.machine.identity import hardware_info, machine_id, machine_key

    key, mid = _given(row.get("machine_key")), _given(row.get("machine_id"))
    if mid is not None and machine_id() is not None:  # the OS's own id: it stays when the hostname or CPUs change
        return mid == machine_id()
    if key is not None:
        return key == machine_key()
    hw = hardware_info()
    return all(_given(row.get(c)) in (None, hw[c]) for c in ("hostname", "cpu_model"))


def above_bound(df) -> list[str]:
    """Lines naming each engine, phase and prompt length whose median is above 100 % of its bound in ``df``
    (:func:`add_bound_columns`' rows), and what to do; [] when none is. A bound is the ceilings measured on that
    machine at one time (the best repetition): a row above it ran faster than the machine did when measured.
    On a shared machine that is a quiet moment after a busy one; with a stale cache, another machine's figures."""
    cols = ["engine", "prompt_tokens", "prefill_pct_of_bound", "decode_pct_of_bound"]
    if not len(df) or any(c not in df.columns for c in cols):
        return []
    keys = [k for k in ("machine", "engine", "weights", "prompt_tokens") if k in df.columns]
    over = []
    for key, g in df.groupby(keys, sort=False, dropna=False):
        where = dict(zip(keys, key))
        for phase in ("prefill", "decode"):
            pct, n = g[f"{phase}_pct_of_bound"].median(), int(g[f"{phase}_pct_of_bound"].notna().sum())
            if pct == pct and pct > 100:
                weights = f" ({where['weights']})" if isinstance(where.get("weights"), str) and where["weights"] else ""
                on = f" on {where['machine']}" if "machine" in where else ""
                over.append(
                    f"{where['engine']}{weights} {phase} at {where['prompt_tokens']} prompt tokens{on}: "
                    f"{pct:.0f} % of its bound ({f'median of {n} rows' if n > 1 else 'one row'})"
                )
    if not over:
        return []
    return [
        "Above the bound: " + "; ".join(over) + ".",
        "A bound is the machine's ceilings as measured once and cached (the best repetition); a row above it ran "
        "faster than the machine did then: the machine was busier when its ceilings were measured. Measure them "
        "again on a quiet machine (the CPU's: lablib.machine.measure_machine(refresh=True), or lablib roofline "
        '--refresh; a GPU\'s: lablib.machine.device_ceilings.measure_device("cuda", refresh=True)), then run again, '
        'or hold these rows to the CPU\'s new measurement: add_bound_columns(df, model, machine_name="this").',
    ]


def what_if_table(
    models=("SmolLM2-135M", "SmolLM2-1.7B", "Llama-3.1-8B", "Llama-3.1-70B"),
    formats=("Q4_1", "F16"),
    machines=("this", "RTX 4090", "Apple M2 Max (38-core GPU)", "H100 SXM"),
    prompt_tokens: int = 1024,
    batch: int = 1,
):
    """:func:`predict` for every model (presets), format and machine: DataFrame of model, format, machine,
    weight_gb, fits (the weights in the machine's memory: RAM here, the table's memory elsewhere),
    prefill_tps, prefill_bound, decode_tps (per sequence, at depth ``prompt_tokens``), decode_bound."""
    import pandas as pd

    from lablib.machine.accelerators import ACCELERATORS
    from lablib.machine.identity import hardware_info

    rows = []
    for mach_name in machines:
        mach = machine(mach_name)
        memory = (
            hardware_info()["ram_bytes"] if mach_name in (None, "this") else ACCELERATORS[mach_name]["memory_bytes"]
        )
        for name in models:
            for fmt in formats:
                p = predict(name, fmt=fmt, prompt_tokens=prompt_tokens, batch=batch, machine_name=mach)
                rows.append(
                    {
                        "model": name,
                        "format": fmt,
                        "machine": mach_name,
                        "weight_gb": p["weight_bytes"] / 1e9,
                        "fits": bool(p["weight_bytes"] < memory),
                        "prefill_tps": p["prefill_tps"],
                        "prefill_bound": p["prefill_bound"],
                        "decode_tps": p["decode_tps"],
                        "decode_bound": p["decode_bound"],
                    }
                )
    return pd.DataFrame(rows)


# --- `lablib roofline`: this machine's ceilings, each engine's last decode against its bound ------------
RESULTS_DIRS = ("results", "labs/results")  # where report() looks for earlier measurements


def results_files(folders=RESULTS_DIRS) -> list[Path]:
    """Results files (.jsonl, .parquet) the lab wrote under ``folders`` (relative to the current folder)."""
    out = []
    for d in folders:
        for suffix in ("*.jsonl", "*.parquet"):
            out += sorted(Path(d).glob(suffix))
    return out


# the sweeps whose rows decode plainly, one request at a time (their mode single or serial): what the roofline holds
# against its bound. Not a speculative, constrained, adapter or prefix study's rows (a helper's audit: lablib
# speculate's llama.cpp rows, 24.6 tok/s, were read as its decode rate beside 45 plain)
PLAIN_DECODE_SWEEPS = ("side_by_side", "context", "concurrency")


def _last_rows(files, model, engines):
    """Each engine's rows from its most recent measurement in ``files`` on this machine (its hostname, and its
    :func:`~lablib.machine.identity.machine_key` and ``machine_id`` where rows record them) and model (single-stream
    rows with a decode rate, of :data:`PLAIN_DECODE_SWEEPS`), or an empty DataFrame (files of no engine's rows:
    an empty file, another program's JSON)."""
    import pandas as pd

    from lablib.machine.identity import hardware_info, machine_id, machine_key
    from lablib.results.store import load_results

    if not files:
        return pd.DataFrame()
    df = load_results(*files)
    if "engine" not in df:
        return pd.DataFrame()
    keep = df["engine"].isin(engines) & df["decode_tps"].notna() if "decode_tps" in df else df["engine"].isna()
    if "error" in df:
        keep &= df["error"].isna()
    if "sweep" in df:
        keep &= df["sweep"].isin(PLAIN_DECODE_SWEEPS) | df["sweep"].isna()
    if "spec_method" in df:  # lablib speculate's rows (no sweep): its plain ones decode plainly
        from lablib.studies.decoding.acceptance import NONE

        keep &= df["spec_method"].isna() | (df["spec_method"] == NONE)
    if "adapter" in df:  # lablib lora's rows (no sweep): with a LoRA adapter, loaded or merged
        keep &= df["adapter"].isna()
    if "hostname" in df:
        keep &= df["hostname"] == hardware_info()["hostname"]
    if "machine_key" in df:  # rows that name their machine's key: this one's (another CPU of the same hostname: not)
        keep &= df["machine_key"].isna() | (df["machine_key"] == machine_key())
    if "machine_id" in df:  # and its own id (a twin machine's rows merged into one file: not this one's)
        keep &= df["machine_id"].isna() | (df["machine_id"] == machine_id())
    if "model_sha256" in df:
        keep &= df["model_sha256"] == model.sha256
    if "mode" in df:
        keep &= df["mode"].isin(["single", "serial"]) | df["mode"].isna()
    d = df[keep]
    if not len(d):
        return d
    last = d.groupby("engine")["time"].transform("max") if "time" in d else None
    return d[d["time"] == last] if last is not None else d


def report(results=None, engines=None, model=None, refresh: bool = False, out=None) -> dict:
    """{machine: {cpu_model, threads, bandwidth_gbps (the read kernel's best repetition: the roofline's),
    bandwidth_spread_gbps [min, max], copy_gbps, triad_gbps (STREAM's kernels, medians),
    gflops {dtype: best GFLOP/s (int8: GOP/s), the roofline's}, measured}, engines: {engine: {decode_tps,
    decode_bound_tps, fraction_of_bound, prefill_tps, prefill_bound_tps, prompt_tokens, rows, source,
    bound_by ("bandwidth", "compute" or "launches": which line binds its decode), launch_floor_ms (its measured
    launch floor, :mod:`lablib.studies.launch_floor`, measured now if never here), launch_floor_error}},
    above_bound: :func:`above_bound`'s lines, [] when every row is within its bound}.

    ``results``: results files (None: those under results/ and labs/results/; [] : none); an engine
    without rows from this machine and model is measured now (one warm-up, then the requests of
    :data:`lablib.config.BUDGETS` ``"roofline"``: 3 of 64 prompt and 32 output tokens). ``out`` (.jsonl or
    .parquet, checked before the machine or any engine is measured; only where an engine is to be measured now):
    those rows appended as each request finishes, as :func:`lablib.measure.sweep.side_by_side` writes them; a
    file under results/ is read back by the next report, which then measures them no more."""
    from lablib.config import budget
    from lablib.machine.ceilings import measure_machine
    from lablib.measure.sweep import engine_names, side_by_side
    from lablib.measure.workload import prompt_of_length
    from lablib.model.resolve import prepare
    from lablib.results.store import ResultsWriter
    from lablib.studies.launch_floor import floors_for_rows

    rm = prepare(model, log=lambda *_: None)
    names = engine_names(engines, rm)
    files = results_files() if results is None else [Path(f) for f in results]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise LabError(f"--results {', '.join(map(str, missing))}: not found; expected results files the lab wrote")
    rows = _last_rows(files, rm, names)
    import pandas as pd

    frames = [rows.assign(source="results: " + rows["source_file"].astype(str))] if len(rows) else []
    todo = [e for e in names if not len(rows) or e not in set(rows["engine"])]
    if todo and out:
        ResultsWriter(out)  # refused now, before minutes of measuring whose rows could not be kept
    m = measure_machine(refresh=refresh)
    if todo:
        n, new, reps = (budget("roofline", k) for k in ("prompt_tokens", "max_new_tokens", "reps"))
        fresh = side_by_side(
            rm, engines=todo, ids=prompt_of_length(rm, n), max_new_tokens=new, reps=reps, progress=False, out=out
        )
        kept = f", written to {out}" if out else ""
        frames.append(fresh.assign(source=f"measured now ({n} prompt + {new} output tokens, {reps} requests{kept})"))
    rows_all = pd.concat(frames, ignore_index=True)
    # the third line: each engine's launch floor at the threads and device its rows ran with, measured now (beside
    # rows measured now; rows read from files were measured at their own time)
    floors = floors_for_rows(rows_all, rm, log=lambda *_: None)
    df = add_bound_columns(rows_all, rm, machine_name=None)
    engines_out = {}
    for e, g in df.groupby("engine", sort=False):
        dec, bound = float(g["decode_tps"].median()), float(g["decode_bound_tps"].median())
        engines_out[e] = {
            "decode_tps": dec,
            "decode_bound_tps": bound,
            "fraction_of_bound": dec / bound,
            "prefill_tps": float(g["prefill_tps"].median()),
            "prefill_bound_tps": float(g["prefill_bound_tps"].median()),
            "prompt_tokens": int(g["prompt_tokens"].median()),
            "rows": len(g),
            "compute_dtype": g["compute_dtype"].iloc[0],
            "bound_by": str(g["decode_bound_by"].mode().iloc[0]),
            "launch_floor_ms": 1e3 * floors[e]["floor_s"] if "floor_s" in floors.get(e, {}) else None,
            "launch_floor_error": floors.get(e, {}).get("error"),
            "source": g["source"].iloc[0],
        }
    bw = m["bandwidth"]
    return {
        "machine": {
            "cpu_model": m["cpu_model"],
            "threads": m["threads"],
            "bandwidth_gbps": m["bytes_per_s"] / 1e9,
            "bandwidth_spread_gbps": [bw["read"]["min"] / 1e9, bw["read"]["max"] / 1e9],
            "copy_gbps": bw["copy"]["bytes_per_s"] / 1e9,
            "triad_gbps": bw["triad"]["bytes_per_s"] / 1e9,
            "gflops": {k: v / 1e9 for k, v in m["flop_per_s"].items()},
            "measured": m["time"],
        },
        "engines": engines_out,
        "above_bound": df.attrs["above_bound"],
    }
