"""A model's skeleton: its architecture with the widths cut down, so a step moves almost no bytes.

The skeleton keeps what sets how many kernels an engine launches, and how much Python it runs, per
decode step: the architecture (``model_type``), the number of layers, of query and key/value heads,
each layer's attention kind and window, the vocabulary and the tokenizer, tied or untied embeddings.
It cuts what sets how many bytes and FLOPs a step costs: each head is :data:`HEAD_DIM` wide (so the
hidden size is heads x 8) and the MLP :data:`MLP_WIDTH` wide. SmolLM2-135M's skeleton has 4.2 M
weights (17 MB in float32, 14 of them the 49,152 x 72 embedding) against 134.5 M.

What an engine spends on one decode step of the skeleton is its **launch floor** on that device: the
fixed cost of a step (kernel launches, the framework's Python, synchronisations) that no model of that
shape can go under, whatever the bandwidth (:mod:`lablib.studies.launch_floor`). Its weights are drawn
from a seeded generator (seed 0): the skeleton's output is noise, and only its timing is used.

Made once per model from its Hugging Face folder (transformers' ``from_config``, ``save_pretrained``),
the tokenizer files copied beside it, and cached in ``<lab home>/models/<sha256[:16]>/skeleton/``; the
lab's own :func:`lablib.model.resolve.prepare` then derives its GGUF and MLX forms as for any model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lablib.config import lab_home
from lablib.errors import LabError
from lablib.staging import staged

HEAD_DIM = 8  # elements per attention head in the skeleton (SmolLM2: 64)
MLP_WIDTH = 32  # the skeleton's MLP width (SmolLM2: 1,536)
SEED = 0
# the config keys that carry a width, set from the two above (hidden = heads x HEAD_DIM); every other key is kept
WIDTH_KEYS = ("hidden_size", "intermediate_size", "head_dim")
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".gguf")


def skeleton_folder(model) -> Path:
    """Where ``model``'s skeleton is (or will be) kept: ``<lab home>/models/<sha256[:16]>/skeleton``."""
    return lab_home() / "models" / model.sha256[:16] / "skeleton"


def make_skeleton(model, log=print) -> Path:
    """``model``'s skeleton as a Hugging Face folder (made the first time; then the cached one).

    ``model``: a :class:`lablib.model.resolve.ResolvedModel` with a Hugging Face form. Raises LabError
    when it has none (the reason it gave), or when transformers cannot build its architecture."""
    out = skeleton_folder(model)
    if (out / "config.json").is_file():
        return out
    if not model.hf_path:
        why = model.unavailable.get("hf", "no Hugging Face folder was derived")
        raise LabError(
            f"{model.name}: its skeleton (the launch floor's model) is made from a Hugging Face folder, and it has "
            f"none ({why}); expected a model transformers reads"
        )
    import torch
    import transformers

    src = Path(model.hf_path)
    torch.manual_seed(SEED)
    try:
        cfg = transformers.AutoConfig.from_pretrained(src)
        text = cfg.get_text_config(decoder=True)
        heads = int(text.num_attention_heads)
        text.hidden_size, text.head_dim = heads * HEAD_DIM, HEAD_DIM
        for key in [k for k in vars(text) if k.endswith("intermediate_size") and getattr(text, k)]:
            setattr(text, key, MLP_WIDTH)  # the MLP's, and a mixture of experts' (moe_, shared_expert_)
        log(f"making {model.name}'s skeleton ({text.num_hidden_layers} layers, {heads} heads of {HEAD_DIM})...")
        skel = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.inference_mode():  # one forward pass: an architecture whose other widths were not cut fails here
            skel(input_ids=torch.tensor([[1, 2, 3]]))
    except Exception as e:  # noqa: BLE001 - any architecture: one message, not transformers' traceback
        raise LabError(
            f"{model.name}: transformers could not build and run its architecture at the skeleton's widths "
            f"({type(e).__name__}: {str(e)[:200]}); its launch floor cannot be measured, its rows keep the "
            "two-line roofline"
        ) from None
    try:
        with staged(out) as tmp:
            skel.save_pretrained(tmp)
            for f in src.iterdir():  # the tokenizer, its template, the generation config: everything but weights
                if (
                    f.is_file()
                    and f.name != "config.json"
                    and not f.name.endswith(WEIGHT_FILES)
                    and "index" not in f.name
                ):
                    shutil.copy(f, tmp / f.name)
    except OSError as e:
        raise LabError(
            f"cannot write {model.name}'s skeleton ({e.filename or out}: {e.strerror}); expected a writable lab "
            f"home: set LABLIB_HOME to one (now {lab_home()})"
        ) from None
    return out


def skeleton_of(model, log=print):
    """``model``'s skeleton, prepared as any model (:func:`lablib.model.resolve.prepare`: its GGUF and MLX
    forms derived once and cached): a ResolvedModel."""
    from lablib.model.resolve import prepare

    return prepare(str(make_skeleton(model, log=log)), log=log)
