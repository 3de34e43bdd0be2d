"""The one tokenizer the lab uses for text: the model's Hugging Face tokenizer (loaded once per folder).

Every engine is fed the same token ids; text becomes ids (prompts, chat templates, streamed text
re-tokenized by the HTTP engine) through this tokenizer only.
"""

from __future__ import annotations

import functools

from lablib.errors import LabError


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def lab_tokenizer(model):
    """The one tokenizer the lab uses for text: the model's Hugging Face tokenizer.

    ``model``: a ResolvedModel with an HF or MLX folder. Raises LabError otherwise.
    """
    path = model.hf_path or model.mlx_path
    if not path and getattr(model, "unavailable", {}).get("hf"):
        raise LabError(
            f"{model.source}: the lab makes prompts with the model's Hugging Face tokenizer, and no Hugging Face "
            f"folder could be made from it ({model.unavailable['hf']})"
        )
    if not path:
        raise LabError(f"{model.source} has no Hugging Face tokenizer folder; run `lablib prepare` on it")
    return _tokenizer(path)
