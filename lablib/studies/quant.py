"""GGUF formats and llama.cpp's quantizer: a full-precision reference and a ladder of quantized files.

Without a model hub no package ships a full-precision small model, so the reference is the
shipped Q4_1 GGUF *dequantized*: :func:`write_reference` rewrites it as F32, F16 or BF16 with
the ``gguf`` package (every metadata key and the tokenizer copied, ``general.file_type`` set,
1-D tensors kept F32). Every quality figure is therefore "relative to the dequantized Q4_1
reference". Given a GGUF converted from an original BF16 model (``lablib prepare <hub id>``,
then llama.cpp's convert_hf_to_gguf.py), the same code gives the true ladder.

:func:`quantize_file` calls llama.cpp's own quantizer in-process (``llama_model_quantize`` of
llama-cpp-python, ``allow_requantize`` set) on the reference. Files are cached under
``$LABLIB_HOME/quant/<sha256[:16] of the source model>/``, each with a JSON record of its facts,
and written to a temporary name then renamed: an interrupted ladder keeps its finished files.

K-quants (Q2_K ... Q6_K) need rows (ne[0]) divisible by 256 (``QK_K``). SmolLM2-135M's hidden
size is 576 = 2.25 x 256, so every tensor whose rows are the hidden size (q, k, v, o, gate, up,
token_embd) falls back to another type (llama-quant.cpp, "using fallback quantization": Q2_K/Q3_K
-> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0); only ffn_down (rows of 1536 = 6 x 256)
keeps its K type. :func:`tensor_types` shows what each file really holds.
"""

from __future__ import annotations

import json
from pathlib import Path

from lablib.checks import csv_list
from lablib.children import swallowed_interrupts_sent_again
from lablib.config import BUDGETS
from lablib.errors import LabError
from lablib.model.formats import gguf_facts, gguf_tensors
from lablib.model.reference import FILE_TYPE, REFERENCE_TYPES, quant_home, reference, write_reference  # noqa: F401
from lablib.staging import staged

# ladder rungs: llama.cpp ftype names (llama_cpp.LLAMA_FTYPE_MOSTLY_<name>; F32 is LLAMA_FTYPE_ALL_F32)
QUICK_LADDER, LADDER = BUDGETS["ladder"]["types"]  # the quick and the full ladder (lablib.config.BUDGETS)
# types that need an importance matrix (llama-imatrix, a tool the wheel does not ship)
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS")
QUANTIZER_VERSION = 1  # bump when the recipe changes (invalidates cached rungs)


def known_types() -> dict[str, int]:
    """llama.cpp quantization types this build's quantizer makes: name -> llama_ftype value."""
    import llama_cpp

    out = {"F32": llama_cpp.LLAMA_FTYPE_ALL_F32}
    for name in dir(llama_cpp):
        if name.startswith("LLAMA_FTYPE_MOSTLY_"):
            t = name[len("LLAMA_FTYPE_MOSTLY_") :]
            if t not in NEEDS_IMATRIX and not t.endswith("_MOE"):
                out[t] = int(getattr(llama_cpp, name))
    return out


def parse_types(types, what: str = "types") -> list[str]:
    """Type names (a list, or one comma-separated string) checked against :func:`known_types`;
    upper-cased, duplicates dropped. Raises LabError naming the unknown ones, the known list and an example of
    ``what`` (the keyword the caller took them as: ``types``, ``variant``; a command's flag in its message)."""
    if isinstance(types, str):
        types = csv_list(types, "types")
    names = [str(t).strip().upper() for t in types if str(t).strip()]
    if not names:
        raise LabError(f"no quantization types given; expected a comma-separated list such as {','.join(LADDER[:4])}")
    known = known_types()
    bad = [t for t in names if t not in known]
    if bad:
        hint = (
            " (IQ1/IQ2/IQ3_XXS types need an importance matrix from llama-imatrix, not built here)"
            if any(t in NEEDS_IMATRIX for t in bad)
            else ""
        )
        raise LabError(
            f"unknown quantization type(s) {', '.join(bad)}{hint}; expected some of: "
            f"{', '.join(sorted(known))}. Example: {what}=Q8_0"
        )
    return list(dict.fromkeys(names))


# --- what a GGUF file holds (read by lablib.model.formats, the one GGUF reader) ----------------
def tensor_types(path) -> list[dict]:
    """The tensors of a GGUF grouped by storage type, one dict per type:
    ``type`` (GGML type name), ``n_tensors``, ``n_elements`` (weights), ``bytes`` (tensor data),
    ``bpw`` (bits per weight of that type), ``tensors`` (names, sorted). Sorted by bytes, largest first."""
    groups: dict[str, dict] = {}
    for name, kind, elements, nbytes in gguf_tensors(path):
        g = groups.setdefault(kind, {"type": kind, "n_tensors": 0, "n_elements": 0, "bytes": 0, "tensors": []})
        g["n_tensors"] += 1
        g["n_elements"] += elements
        g["bytes"] += nbytes
        g["tensors"].append(name)
    for g in groups.values():
        g["bpw"] = 8 * g["bytes"] / g["n_elements"]
        g["tensors"].sort()
    return sorted(groups.values(), key=lambda g: -g["bytes"])


def file_facts(path) -> dict:
    """Size facts of a GGUF: ``bytes`` (the file), ``tensor_bytes`` (weights only), ``parameters``,
    ``bpw`` (bits per weight = 8 x tensor_bytes / parameters, as llama.cpp's loader prints it),
    ``file_type`` (general.file_type as a name: :func:`lablib.model.formats.file_type_name`) and
    ``types`` (:func:`tensor_types` without names)."""
    path = Path(path)
    groups = tensor_types(path)
    n = sum(g["n_elements"] for g in groups)
    tb = sum(g["bytes"] for g in groups)
    return {
        "bytes": path.stat().st_size,
        "tensor_bytes": tb,
        "parameters": n,
        "bpw": 8 * tb / n,
        "file_type": gguf_facts(path)["quantization"],
        "types": [{k: v for k, v in g.items() if k != "tensors"} for g in groups],
    }


def type_mix(types: list[dict]) -> str:
    """A one-line summary of a tensor-type list: 'Q5_0 68%, Q8_0 23%, Q4_K 9%' (shares of weights)."""
    n = sum(g["n_elements"] for g in types)
    return ", ".join(
        f"{g['type']} {100 * g['n_elements'] / n:.0f}%" for g in sorted(types, key=lambda g: -g["n_elements"])
    )


# --- the reference: a quantized GGUF rewritten at full precision (gguf package) --------------


# --- the ladder: llama.cpp's own quantizer ---------------------------------------------------
def quantize_file(src, out, qtype: str, threads: int | None = None, verbose: bool = False) -> Path:
    """Quantize GGUF ``src`` to ``qtype`` with llama.cpp's quantizer (``llama_model_quantize``),
    requantizing allowed (a quantized source is dequantized to F32 first). Written to a temporary
    name then renamed. Returns ``out``; LabError naming the type and file when llama.cpp fails.
    ``verbose``: let llama.cpp print its per-tensor log (the "falling back" lines of K-quants)."""
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    from lablib.machine.threads import default_threads

    qtype = parse_types([qtype])[0]
    src, out = Path(src), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = known_types()[qtype]
    params.nthread = int(threads or default_threads())
    params.allow_requantize = True
    with staged(out) as tmp:
        with swallowed_interrupts_sent_again(), suppress_stdout_stderr(disable=verbose):  # it logs per tensor
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            raise LabError(
                f"llama.cpp's quantizer failed on {src.name} -> {qtype} (code {rc}); expected a "
                "readable GGUF source and a type this build supports: run with another --types"
            )
    return out


def rung(source, qtype: str, home: Path, source_sha: str, log=print) -> dict:
    """One rung of the ladder, cached: the file ``home/<qtype>.gguf`` and its record
    (``type``, ``path``, ``source_sha256``, :func:`file_facts`, ``quantize_s``, ``cached``)."""
    import time

    import llama_cpp

    qtype = parse_types([qtype])[0]
    out, rec_path = home / f"{qtype}.gguf", home / f"{qtype}.json"
    key = {"source_sha256": source_sha, "llama_cpp": llama_cpp.__version__, "recipe": QUANTIZER_VERSION}
    try:
        rec = json.loads(rec_path.read_text())
        if out.is_file() and all(rec.get(k) == v for k, v in key.items()) and rec.get("bytes") == out.stat().st_size:
            return {**rec, "cached": True}
    except (OSError, ValueError):
        pass
    log(f"quantizing {Path(source).name} -> {qtype} (llama.cpp's quantizer)...")
    t0 = time.perf_counter()
    quantize_file(source, out, qtype)
    rec = {"type": qtype, "path": str(out), **key, "quantize_s": round(time.perf_counter() - t0, 2), **file_facts(out)}
    with staged(rec_path) as tmp:
        tmp.write_text(json.dumps(rec, indent=1) + "\n")
    return {**rec, "cached": False}


def quantize_ladder(types=LADDER, model=None, log=print) -> list[dict]:
    """Make (or find cached) one file per type in ``types`` from ``model``'s F32 reference.
    Types are checked before any work. Returns the rungs' records in order."""
    from lablib.model.resolve import ResolvedModel, prepare

    types = parse_types(types)
    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    ref = reference(rm, "F32", log=log)
    home = quant_home(rm.sha256)
    return [rung(ref, t, home, rm.sha256, log=log) for t in types]


def rung_model(path, base, qtype: str):
    """A ResolvedModel for a ladder file (GGUF only), labelled with its type; ``base`` is the
    source model's ResolvedModel (its HF folder keeps serving as the lab tokenizer)."""
    from lablib.model.resolve import ResolvedModel

    return ResolvedModel(
        name=f"{base.name} -> {qtype}",
        source=str(path),
        source_format="gguf",
        sha256=f"{base.sha256[:16]}-{qtype}",
        architecture=base.architecture,
        parameters=base.parameters,
        quantization=qtype,
        max_position_embeddings=base.max_position_embeddings,
        gguf_path=str(path),
        hf_path=base.hf_path,
    )
