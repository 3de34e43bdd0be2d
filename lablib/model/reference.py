"""The model's full-precision reference GGUF (F32, F16 or BF16), dequantized from the shipped file.

A derived format like the HF and MLX folders (:mod:`lablib.model.derive`), written once with the
``gguf`` package and cached next to the quantization ladder (``<lab home>/quant/<sha256[:16]>/``). The
ladder of lab 06 (:mod:`lablib.studies.quant`) quantizes it, its quality is measured against it, and
OpenVINO reads its F16 version (:mod:`lablib.engines.openvino`).
"""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.model.formats import open_gguf
from lablib.staging import staged

REFERENCE_TYPES = ("F32", "F16", "BF16")  # what write_reference writes (gguf package only)


FILE_TYPE = {"F32": 0, "F16": 1, "BF16": 32}  # general.file_type of a reference (llama_ftype values)


def quant_home(model_sha: str) -> Path:
    """Folder of the reference and ladder files of one source model (by its sha256)."""
    from lablib.config import lab_home

    return lab_home() / "quant" / model_sha[:16]


def write_reference(src, out, dtype: str = "F32") -> Path:
    """Rewrite GGUF ``src`` with every quantized tensor dequantized, as ``dtype`` (F32, F16, BF16).

    Metadata and tokenizer are copied key by key (the pattern of gguf's gguf_new_metadata.py);
    ``general.file_type`` becomes 0/1/32; 1-D tensors (norms) stay F32 as llama.cpp keeps them.
    Dequantization is ``gguf.quants.dequantize`` (numpy, float32); BF16 is ``gguf.quants.quantize``.
    Written to ``<out>.<pid>.tmp`` then renamed (:func:`lablib.staging.staged`). Returns ``out``. Memory: about 2 x the F32 size.
    """
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize

    dtype = str(dtype).upper()
    if dtype not in FILE_TYPE:
        raise LabError(f"reference type {dtype!r}: expected one of {', '.join(REFERENCE_TYPES)}")
    src, out = Path(src), Path(out)
    r, _ = open_gguf(src)
    arch = r.fields["general.architecture"].contents()
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch=arch, endianess=r.endianess)
        align = r.fields.get("general.alignment")
        if align is not None:
            w.data_alignment = align.contents()
        for field in r.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF."):
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = FILE_TYPE[dtype] if field.name == "general.file_type" else field.contents()
            w.add_key_value(field.name, value, vtype, sub_type=sub)
        if "general.file_type" not in r.fields:
            w.add_file_type(FILE_TYPE[dtype])
        F32, F16, BF16 = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
        for t in r.tensors:
            if t.tensor_type in (F32, F16, BF16):
                data = t.data if t.tensor_type != BF16 else dequantize(t.data, BF16)
                data = np.asarray(data, dtype=np.float32)
            else:
                data = dequantize(t.data, t.tensor_type)  # float32, numpy shape (ne[1], ne[0])
            if data.ndim == 1 or dtype == "F32":
                w.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
            elif dtype == "F16":
                w.add_tensor(t.name, data.astype(np.float16))
            else:
                w.add_tensor(t.name, quantize(data, BF16), raw_dtype=BF16)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out


def reference(model=None, dtype: str = "F32", log=print) -> Path:
    """The full-precision reference GGUF of ``model`` (a ResolvedModel, a name/path or None for the
    default), made once by :func:`write_reference` and cached next to its ladder. A model that is
    already F32/F16/BF16 is its own reference when ``dtype`` matches."""
    from lablib.model.resolve import ResolvedModel, _locked, prepare

    rm = model if isinstance(model, ResolvedModel) else prepare(model, log=log)
    src = Path(rm.path_for("gguf", "the quantizer"))
    dtype = str(dtype).upper()
    if dtype not in FILE_TYPE:
        raise LabError(f"reference type {dtype!r}: expected one of {', '.join(REFERENCE_TYPES)}")
    if (rm.quantization or "").upper().replace("ALL_", "") == dtype:
        return src
    home = quant_home(rm.sha256)
    out = home / f"reference-{dtype}.gguf"
    if out.is_file():
        return out
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".lock"):
        if not out.is_file():
            log(f"writing the {dtype} reference of {src.name} (dequantized with the gguf package)...")
            write_reference(src, out, dtype)
    return out
