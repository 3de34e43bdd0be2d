"""The one tokenizer the lab uses for text: the model's Hugging Face tokenizer (loaded once per folder).

Every engine is fed the same token ids; text becomes ids (prompts, chat templates, streamed text
re-tokenized by the HTTP engine) through this tokenizer only.
"""

from __future__ import annotations

import functools

from lablib.errors import FormatError, LabError

# a tokenizer's own files (the fast tokenizer's, SentencePiece's, a BPE vocabulary's); a folder with none of them
# makes transformers 5 build an empty tokenizer that turns every text into no ids at all
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_tokenizer_files(path) -> None:
    """FormatError unless the model folder ``path`` holds a tokenizer's own files (:data:`TOKENIZER_FILES`): the lab
    makes every prompt with it, and llama.cpp's converter and mlx-lm need it to derive their formats."""
    from pathlib import Path

    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise FormatError(
            f"{path}: no tokenizer beside the weights (none of {', '.join(TOKENIZER_FILES)}); expected the model's "
            "tokenizer files in its folder: save them there (tokenizer.save_pretrained(FOLDER)) or copy them in"
        )


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    check_tokenizer_files(path)
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
