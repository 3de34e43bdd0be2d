"""The quantization ladder measured: size, quality against the reference, speed; one tidy row per rung.

Every rung (a llama.cpp file of :mod:`lablib.studies.quant`, or a transformers dtype, or an MLX folder) is
measured the same way:

- quality: :mod:`lablib.studies.quality` against the F32 reference GGUF on llama.cpp (the dequantized Q4_1
  of the default model: figures are "relative to the dequantized Q4_1 reference");
- speed: one request of ``prompt_tokens`` real prose tokens and ``max_new_tokens`` decoded tokens
  (EOS ignored), after a warm-up, through the lab's engine (the trace of DESIGN.md): ``prefill_tps``
  and ``decode_tps``, medians over ``reps``.

Rows are appended to a results file as each rung finishes (``ResultsWriter``), so an interrupted
ladder keeps its finished files and rows; a rerun finds the files in the cache.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from lablib.config import budget
from lablib.errors import LabError

REFERENCE_LABEL = "dequantized Q4_1 (F32 GGUF)"  # the default model's


def reference_label(model) -> str:
    """What the reference of ``model`` is: 'dequantized Q4_1 (F32 GGUF)' for the default model, the
    original precision for a model that is already F32/F16/BF16."""
    q = (model.quantization or "").upper().replace("ALL_", "")
    return f"{q} original (F32 GGUF)" if q in ("F32", "F16", "BF16") else f"dequantized {q or '?'} (F32 GGUF)"


HF_DTYPES = ("float32", "bfloat16", "float16")
LADDER_ENGINES = "the ladder measures llama.cpp (GGUF types), transformers (dtypes) and mlx (float32, 8bit, 4bit)"
MLX_BITS = (8, 4)


def gguf_engine() -> str:
    """The name of the engine GGUF rungs are made (its quantizer) and measured on: the engine of
    :data:`lablib.engines.ENGINES` whose class says ``quantizes_gguf`` (llama.cpp). LabError when
    not exactly one does."""
    from lablib.engines import ENGINES

    found = [name for name, cls in ENGINES.items() if cls.quantizes_gguf]
    if len(found) != 1:
        raise LabError(
            f"engines that quantize GGUF (Engine.quantizes_gguf): {found or 'none'}; expected exactly one "
            "(set quantizes_gguf = True on the one engine class whose quantizer lablib.studies.quant uses)"
        )
    return found[0]


def settings(quick: bool | None = None, **override) -> dict:
    """Measurement sizes (:data:`lablib.config.BUDGETS` ``"ladder"``): ``n_ctx`` and ``n_chunks`` of the
    perplexity text, speed request sizes (``prompt_tokens``, ``max_new_tokens``, ``reps``);
    ``override`` replaces any of them."""
    from lablib.config import budgets

    base = {k: v for k, v in budgets("ladder", quick).items() if k != "types"}
    return {**base, **{k: int(v) for k, v in override.items() if v is not None}}


def measure_speed(engine, ids, max_new_tokens: int, reps: int = 1) -> dict:
    """``prefill_tps`` and ``decode_tps`` (medians over ``reps``, after a short warm-up request) of
    one greedy request of prompt ``ids``, EOS ignored."""
    from lablib.engines.base import GenerationConfig
    from lablib.measure.sweep import measured_traces

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True)
    # the warm-up differs on purpose: one short request (8 prompt tokens, 2 new) pays the first-call
    # costs without a full request's time on every rung of the ladder
    short = GenerationConfig(max_new_tokens=2, ignore_eos=True)
    traces = measured_traces(engine, [ids] * max(1, reps), cfg, warmup=[list(ids[:8])], warmup_cfg=short)
    ms = [t.metrics() for t in traces]
    return {
        "prefill_tps": statistics.median(m["prefill_tps"] for m in ms),
        "decode_tps": statistics.median(m["decode_tps"] for m in ms),
        "prompt_tokens": len(ids),
        "output_tokens": max_new_tokens,
    }


class Ladder:
    """The shared parts of one measurement: the source model, its F32 reference on llama.cpp, the
    perplexity chunks and the reference's log-probs (cached on disk)."""

    def __init__(
        self, model=None, n_ctx: int | None = None, n_chunks: int | None = None, home=None, log=print, **sizes
    ):
        from lablib.engines import load_engine
        from lablib.model.resolve import ResolvedModel, prepare
        from lablib.studies import quality, quant

        self.log = log
        self.cfg = settings(n_ctx=n_ctx, n_chunks=n_chunks, **sizes)
        self.model = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
        self.reference_path = quant.reference(self.model, "F32", log=log)
        self.cache = quant.quant_home(self.model.sha256)  # reference log-probs
        self.home = Path(home) if home else self.cache  # ladder files
        ref_rm = quant.rung_model(self.reference_path, self.model, "F32")
        eng = load_engine(gguf_engine(), ref_rm, n_ctx=self._engine_ctx())
        try:
            self.chunks = quality.text_chunks(eng, self.cfg["n_ctx"], self.cfg["n_chunks"])
            self.ref = quality.reference_logprobs(eng, self.chunks, self.cache, key=f"F32:{self.model.sha256}")
        finally:
            eng.close()
        n = self.cfg["prompt_tokens"]
        self.speed_ids = [t for c in self.chunks for t in c[1:]][:n]

    def _engine_ctx(self) -> int:
        return max(self.cfg["n_ctx"], self.cfg["prompt_tokens"] + self.cfg["max_new_tokens"] + 8)

    def base_row(self) -> dict:
        from lablib import __version__
        from lablib.machine.identity import hardware_info, load_average

        h = hardware_info()
        return {
            "reference": reference_label(self.model),
            "reference_path": str(self.reference_path),
            "model": self.model.name,
            "model_sha256": self.model.sha256,
            "n_ctx": self.cfg["n_ctx"],
            "n_chunks": len(self.chunks),
            "cpu_model": h["cpu_model"],
            "cores": h["cores_physical"],
            "load_avg_1m": load_average(),
            "lablib_version": __version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def measure(self, engine, speed: bool = True) -> dict:
        """Quality (and speed) of a loaded engine against the reference: a dict of figures."""
        from lablib.studies.quality import compare_to_reference

        out = compare_to_reference(engine, self.ref)
        if speed:
            out.update(measure_speed(engine, self.speed_ids, self.cfg["max_new_tokens"], self.cfg["reps"]))
        return out

    # --- llama.cpp ---------------------------------------------------------------------------
    def load_and_measure(self, engine: str, model, speed: bool = True, **kw) -> tuple[dict, object, float]:
        """Load ``engine`` on ``model`` (keyword arguments to :func:`lablib.engines.load_engine`),
        measure it (:meth:`measure`) and close it: (figures, its :class:`~lablib.engines.base.EngineInfo`,
        load seconds)."""
        from lablib.engines import load_engine

        t0 = time.perf_counter()
        eng = load_engine(engine, model, n_ctx=self._engine_ctx(), **kw)
        load_s = time.perf_counter() - t0
        try:
            return self.measure(eng, speed), eng.info(), load_s
        finally:
            eng.close()

    def llama_row(self, qtype: str, path, facts: dict, speed: bool = True) -> dict:
        from lablib.studies import quant

        engine = gguf_engine()
        figures, info, load_s = self.load_and_measure(engine, quant.rung_model(path, self.model, qtype), speed)
        return {
            **self.base_row(),
            "engine": engine,
            "engine_version": info.version,
            "format": "gguf",
            "type": qtype,
            "path": str(path),
            "bytes": facts["bytes"],
            "tensor_bytes": facts["tensor_bytes"],
            "bytes_per_token": facts["tensor_bytes"],
            "parameters": facts["parameters"],
            "bpw": facts["bpw"],
            "type_mix": quant.type_mix(facts["types"]),
            "tensor_types": json.dumps(facts["types"]),
            # the kernel prefill multiplies each type with on this CPU (lablib.engines.ggml_kernels)
            "matmul_kernels": info.flags.get("matmul_kernels"),
            "load_s": load_s,
            **figures,
        }


def run_ladder(
    types=None,
    model=None,
    out=None,
    speed: bool = True,
    include_reference: bool = True,
    n_ctx: int | None = None,
    n_chunks: int | None = None,
    home=None,
    on_row=None,
    log=print,
    **sizes,
) -> list[dict]:
    """Quantize ``model`` to each of ``types`` (default: :data:`lablib.studies.quant.LADDER`, or
    ``QUICK_LADDER`` in quick mode) with llama.cpp's quantizer and measure each rung on llama.cpp.

    Types are checked first (LabError listing the known ones). With ``out`` (.jsonl/.parquet) each
    row is appended as its rung finishes; ``on_row(row)`` is called after that. The reference
    itself (``type="F32"``, KL 0) comes first when ``include_reference``. ``home``: folder of the
    ladder files (default: the lab cache, :func:`lablib.studies.quant.quant_home`); ``sizes``: see
    :func:`settings`. Returns the rows.
    """
    from lablib.results.store import ResultsWriter
    from lablib.studies import quant

    types = quant.parse_types(types if types is not None else budget("ladder", "types"))
    writer = ResultsWriter(out) if out else None
    lad = Ladder(model, n_ctx=n_ctx, n_chunks=n_chunks, home=home, log=log, **sizes)
    rows = []

    def emit(row):
        rows.append(row)
        if writer:
            writer.append(row)
        log(f"{row.get('type')} ({row.get('engine')}): measured")
        if on_row:
            on_row(row)

    if include_reference:
        emit(lad.llama_row("F32", lad.reference_path, quant.file_facts(lad.reference_path), speed))
    for t in types:
        rec = quant.rung(lad.reference_path, t, lad.home, lad.model.sha256, log=log)
        emit({**lad.llama_row(t, rec["path"], rec, speed), "quantize_s": rec["quantize_s"], "cached": rec["cached"]})
    return rows


# --- other engines against the same reference ----------------------------------------------------
def _folder_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.suffix == ".safetensors")


def mlx_quantized(model, bits: int, group_size: int = 64, log=print) -> Path:
    """An MLX folder of ``model`` quantized to ``bits`` (mlx-lm's own quantizer: ``mlx_lm.convert``
    with ``quantize=True``, affine groups of ``group_size`` weights), cached next to the ladder."""
    import contextlib
    import io
    import shutil

    from lablib.studies import quant

    if bits not in (2, 3, 4, 5, 6, 8):
        raise LabError(f"MLX bits={bits}: expected one of 2, 3, 4, 5, 6, 8")
    out = quant.quant_home(model.sha256) / f"mlx-q{bits}-g{group_size}"
    if (out / "config.json").is_file():
        return out
    from mlx_lm import convert

    from lablib.model.formats import write_normalized_config

    src = Path(model.path_for("hf", "mlx-lm's quantizer"))
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    tmp = work / "mlx"
    log(f"quantizing {src} to {bits}-bit MLX (mlx_lm.convert, group size {group_size})...")
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), mlx_path=str(tmp), quantize=True, q_bits=bits, q_group_size=group_size)
    write_normalized_config(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def engine_row(lad: Ladder, engine: str, variant: str, speed: bool = True) -> dict:
    """Quality and speed of ``engine`` (transformers: a torch dtype; mlx: float32, 8bit, 4bit) against
    the ladder's reference. ``bytes``: the weights files read at load."""
    from dataclasses import replace

    from lablib.engines import canonical, engine_class

    key = canonical(engine)
    rm = lad.model
    reads = engine_class(key).format  # what the engine reads decides what a variant is
    dtypes = engine_class(key).dtypes
    if reads == "hf" and not dtypes:
        raise LabError(f"engine {key}: the quality ladder has no variants for it (not available); {LADDER_ENGINES}")
    if reads == "hf":
        if variant not in dtypes:
            raise LabError(f"{key} dtype {variant!r}: expected one of {', '.join(dtypes)}")
        kw, weights = {"dtype": variant}, _folder_bytes(rm.hf_path)
        bytes_ = weights if variant == "float32" else weights // 2  # in memory: 2 bytes per weight
        bpw = 8 * bytes_ / rm.parameters
        fmt = "safetensors"
    elif reads == "mlx":
        if variant == "float32":
            path = rm.mlx_path
        elif variant in ("8bit", "4bit"):
            path = str(mlx_quantized(rm, int(variant[0]), log=lad.log))
        else:
            raise LabError(f"mlx variant {variant!r}: expected float32, 8bit or 4bit")
        rm = replace(rm, mlx_path=path, quantization=variant)
        kw, bytes_ = {}, _folder_bytes(path)
        bpw, fmt = 8 * bytes_ / rm.parameters, "mlx"
    else:
        raise LabError(f"engine {engine!r}: expected transformers or mlx here (llama.cpp: run_ladder)")
    figures, info, load_s = lad.load_and_measure(key, rm, speed, **kw)
    return {
        **lad.base_row(),
        "engine": key,
        "engine_version": info.version,
        "format": fmt,
        "type": variant,
        "bytes": bytes_,
        "bytes_per_token": bytes_,
        "parameters": rm.parameters,
        "bpw": bpw,
        "load_s": load_s,
        **figures,
    }


def _reference_of(base, model, log):
    """The model whose F32 reference a measurement is held against: ``base`` when given; else the default model
    when ``model`` is none or a file of it (the same architecture and vocabulary: another quantization of
    SmolLM2), else ``model`` itself (Gemma 3 against SmolLM2's reference would compare two models)."""
    if base is not None or model is None:
        return base
    from lablib.model.resolve import ResolvedModel, prepare
    from lablib.model.shape import model_dims

    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    default = prepare(None, log=log)
    same = rm.architecture == default.architecture and model_dims(rm)["vocab"] == model_dims(default)["vocab"]
    if not same:
        log(f"{rm.name} is not a file of {default.name}: held against its own F32 reference (--base to choose)")
    return None if same else rm


def measure_one(
    engine: str,
    model=None,
    variant: str | None = None,
    base=None,
    speed: bool = True,
    out=None,
    n_ctx: int | None = None,
    n_chunks: int | None = None,
    log=print,
) -> dict:
    """Quality (and speed) of one engine/model/variant against the F32 reference of ``base``; one row,
    appended to ``out`` when given.

    - llama.cpp: ``variant`` a quantization type (a ladder rung, made if needed), else ``model`` a GGUF
      file, folder or packaged name (default: the shipped file); ``base`` defaults to the default model for a
      file of it, else to ``model`` itself (:func:`_reference_of`).
    - transformers: ``variant`` a torch dtype (float32, bfloat16, float16) on ``model``'s HF folder.
    - mlx: ``variant`` float32, 8bit or 4bit (mlx-lm's quantizer) on ``model``'s MLX/HF folder.
    """
    from lablib.engines import canonical, engine_class
    from lablib.model.formats import detect_format
    from lablib.results.store import ResultsWriter
    from lablib.studies import quant

    key = canonical(engine)
    reads = engine_class(key).format
    # another GGUF reader (openvino): its rows would be the GGUF engine's (Engine.quantizes_gguf)
    if reads == "gguf" and not engine_class(key).quantizes_gguf:
        raise LabError(f"engine {key}: the quality ladder has no variants for it (not available); {LADDER_ENGINES}")
    writer = ResultsWriter(out) if out else None
    if reads == "gguf":
        rm = None
        if variant:
            quant.parse_types([variant], "variant")
        elif model is not None:
            from lablib.model.resolve import prepare

            rm = prepare(model, log=log)  # a path, a packaged name: its GGUF (derived from a folder when needed)
            if not rm.gguf_path or detect_format(rm.gguf_path) != "gguf":
                raise LabError(
                    f"--model {model}: llama.cpp measures a GGUF file, and none could be had for it; expected a .gguf "
                    "path (or --variant TYPE for a ladder rung)"
                )
        lad = Ladder(_reference_of(base, rm if rm is not None else model, log), n_ctx=n_ctx, n_chunks=n_chunks, log=log)
        if variant:
            rec = quant.rung(lad.reference_path, variant, lad.home, lad.model.sha256, log=log)
            path, qtype = rec["path"], rec["type"]
        else:
            path = rm.gguf_path if rm is not None else lad.model.gguf_path
            rec = quant.file_facts(path)
            qtype = rec["file_type"]
        row = lad.llama_row(qtype, path, rec, speed)
    elif reads == "mlx" or (reads == "hf" and engine_class(key).dtypes):
        lad = Ladder(base if base is not None else model, n_ctx=n_ctx, n_chunks=n_chunks, log=log)
        row = engine_row(lad, key, variant or "float32", speed)
    else:
        raise LabError(f"engine {key}: the quality ladder has no variants for it (not available); {LADDER_ENGINES}")
    if writer:
        writer.append(row)
    return row


FORMAT_NOTES = {
    "gguf": "one file: metadata + tokenizer + tensors in their storage type; llama.cpp memory-maps it "
    "(pages are read on first touch and shared between processes; quantized blocks are used as stored)",
    "safetensors": "a folder: config.json + tokenizer files + tensors (header, then raw arrays); transformers "
    "memory-maps them, then copies into torch tensors of the dtype asked for",
    "mlx": "a folder like Hugging Face's (safetensors with MLX metadata, quantization in config.json); "
    "mlx-lm loads the arrays lazily and evaluates them on first use",
}


def format_table(model=None, engines=None, log=print):
    """The format lesson: what each engine reads for ``model``, its size on disk (bytes) and the time
    to load it (seconds, the lab's engine constructor), plus the F32 reference GGUF for the engine that
    quantizes GGUF files (``Engine.quantizes_gguf``). ``engines``: names (default: :data:`lablib.engines.NAMES`);
    what each reads is its class's ``format``. A DataFrame."""
    import pandas as pd

    from lablib.engines import NAMES, engine_class, load_engine
    from lablib.model.resolve import ResolvedModel, prepare
    from lablib.studies import quant

    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    ref = quant.reference(rm, "F32", log=log)
    cases = []  # (engine, how the file is stored, its type, model, path)
    for name in NAMES if engines is None else engines:
        cls = engine_class(name)
        stored = "safetensors" if cls.format == "hf" else cls.format
        dtype = rm.quantization if cls.format == "gguf" else "float32"  # the derived folders are float32
        cases.append((cls.name, stored, dtype, rm, getattr(rm, f"{cls.format}_path", None)))
        if cls.quantizes_gguf:
            cases.append((cls.name, "gguf", "F32 (reference)", quant.rung_model(ref, rm, "F32"), str(ref)))
    rows = []
    for engine, fmt, dtype, m, path in cases:
        if not path:
            continue
        p = Path(path)
        size = p.stat().st_size if p.is_file() else _folder_bytes(p)
        t0 = time.perf_counter()
        eng = load_engine(engine, m, n_ctx=256)
        load_s = time.perf_counter() - t0
        eng.close()
        rows.append(
            {
                "engine": engine,
                "format": fmt,
                "type": dtype,
                "bytes": size,
                "MiB": round(size / 2**20, 1),
                "load_s": round(load_s, 2),
                "path": str(p),
                "how it is read": FORMAT_NOTES[fmt],
            }
        )
    return pd.DataFrame(rows)
