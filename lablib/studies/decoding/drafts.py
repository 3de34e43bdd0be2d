"""Lab 10's target and drafts: the GGUF files lab 06 makes of the model (a reference, a rung of its ladder), a
draft checked against the target (same vocabulary), and what predicts a draft's use (its KL to the target, its
cost relative to the target's pass)."""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.studies.decoding.texts import TEXTS


def _model(model=None):
    from lablib.model.resolve import ResolvedModel, prepare

    return model if isinstance(model, ResolvedModel) else prepare(model, log=lambda *_: None)


def gguf_file(model, kind: str) -> Path:
    """The GGUF of ``model`` as lab 06 makes it: a reference (F32, F16, BF16: :func:`lablib.model.reference.reference`)
    or a rung of its ladder (Q8_0, Q4_0, Q2_K...: :func:`lablib.studies.quant.rung`, cached under the lab home);
    a path is checked as a draft of ``model`` (:func:`check_draft`)."""
    from lablib.model.reference import REFERENCE_TYPES, quant_home, reference
    from lablib.studies.quant import rung

    rm = _model(model)
    if "/" in str(kind) or str(kind).endswith(".gguf"):
        return check_draft(rm, kind)
    kind = str(kind).upper()
    if kind in REFERENCE_TYPES:
        return Path(reference(rm, kind, log=lambda *_: None))
    rec = rung(reference(rm, "F32", log=lambda *_: None), kind, quant_home(rm.sha256), rm.sha256, log=lambda *_: None)
    return Path(rec["path"])


def check_draft(model, path) -> Path:
    """``path`` as a draft GGUF for ``model``: LabError when it is missing or its vocabulary differs from the
    model's (a draft must propose the target's token ids)."""
    from lablib.model.formats import gguf_config

    p = Path(path)
    if not p.is_file():
        raise LabError(
            f"draft {path}: no such GGUF file; expected a draft model's GGUF (e.g. gguf_file(model, 'Q4_0'))"
        )
    rm = _model(model)
    try:
        have = int(gguf_config(p)["vocab_size"])
    except Exception as e:  # not a GGUF the reader understands
        raise LabError(f"draft {path}: not a readable GGUF ({e}); expected a draft model's GGUF") from None
    want = int(gguf_config(rm.gguf_path)["vocab_size"])
    if have != want:
        raise LabError(
            f"draft {path}: a vocabulary of {have} tokens, the target's has {want}; expected a draft of the same "
            "vocabulary (the same model family, e.g. a lower-bit quantization of the target)"
        )
    return p


def _gguf_model(model, kind: str):
    from lablib.studies.quant import rung_model

    rm = _model(model)
    return rung_model(gguf_file(rm, kind), rm, str(kind).upper())


def draft_facts(model=None, draft: str = "Q4_0", target: str = "F16", max_new_tokens: int = 16) -> dict:
    """What predicts a draft's use, measured in-process on llama.cpp: ``draft_kl`` (mean KL(target || draft) per
    token over the prose text, nats: lab 06's measure of a rung against its reference), ``draft_tpot_s`` and
    ``target_tpot_s`` (plain greedy TPOT of each, s) and ``draft_cost`` (their ratio: c of the prediction)."""
    import numpy as np

    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import text_ids
    from lablib.studies.logits import logit_stats

    rm = _model(model)
    ids = text_ids(rm, TEXTS["prose"])
    out, logits = {}, {}
    for role, kind in (("target", target), ("draft", draft)):
        eng = load_engine("llama.cpp", _gguf_model(rm, kind), n_ctx=256)
        try:
            logits[role] = eng.logits(ids)
            eng.generate(ids, GenerationConfig(max_new_tokens=4))  # warm-up
            tr = eng.generate(ids, GenerationConfig(max_new_tokens=max_new_tokens))
            out[f"{role}_tpot_s"] = tr.tpot_s
        finally:
            eng.close()
    out["draft_kl"] = float(np.mean(logit_stats(logits["target"], logits["draft"])["kl"]))
    out["draft_cost"] = out["draft_tpot_s"] / out["target_tpot_s"]
    return out
