"""Prompts of an exact number of tokens, cut from real text, identical for every engine.

Text goes through one tokenizer, the lab's (the model's Hugging Face tokenizer,
from the derived or given folder); every engine is then fed the same token ids.
The text is natural prose written for this project (``data/text/prose.txt``)
or code (the lab's own source), never random token ids.
"""

from __future__ import annotations

import functools
from pathlib import Path

from lablib.config import data_dir
from lablib.errors import LabError
from lablib.model.tokenizer import _tokenizer, lab_tokenizer  # noqa: F401 (lab_tokenizer: the measure layer's name for it)

CORPORA = ("prose", "code")
# the lab's default question (lab 01, `lablib run`, lablib.studies.compare)
DEFAULT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def corpus_text(name: str = "prose") -> str:
    """The text of a corpus: 'prose' (data/text/prose.txt) or 'code' (lablib's own source)."""
    if name == "prose":
        path = data_dir() / "text" / "prose.txt"
        if not path.is_file():
            raise LabError(
                f"prompt text not found at {path}; expected the project's data/ folder "
                "(set LABLIB_DATA to its path when lablib is installed elsewhere)"
            )
        return path.read_text(encoding="utf-8")
    if name == "code":
        src = Path(__file__).resolve().parents[1]  # lablib/, every layer's source
        return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(src.rglob("*.py")))
    raise LabError(f"unknown corpus {name!r}: expected one of {', '.join(CORPORA)}")


@functools.lru_cache(maxsize=8)
def _corpus_ids(path: str, name: str) -> tuple[int, ...]:
    tok = _tokenizer(path)
    return tuple(tok(corpus_text(name), add_special_tokens=False)["input_ids"])


def prompt_of_length(model, n: int, corpus: str = "prose", offset: int = 0) -> list[int]:
    """Exactly ``n`` token ids of real text, starting ``offset`` tokens into the corpus.

    Wraps around the corpus when it is shorter than ``offset + n`` (the prose
    corpus holds about 10,000 tokens of the default model). Raises LabError
    for n < 1.
    """
    if n < 1:
        raise LabError(f"prompt length {n}: expected at least 1 token")
    lab_tokenizer(model)  # raises when the model has no tokenizer folder
    ids = _corpus_ids(model.hf_path or model.mlx_path, corpus)
    out: list[int] = []
    pos = offset % len(ids)
    while len(out) < n:
        take = ids[pos : pos + n - len(out)]
        out.extend(take)
        pos = 0
    return out


DISTINCT_GAP = 17  # tokens skipped between two prompts, so that no prompt starts where the last one ended


def distinct_prompts(model, n: int, count: int, start: int = 0, corpus: str = "prose") -> list[list[int]]:
    """``count`` prompts of exactly ``n`` token ids each, cut from the corpus at different offsets
    (``start``, then every ``n`` + :data:`DISTINCT_GAP` tokens): no two share a prefix, so no measured
    request can reuse another's KV cache (DESIGN.md's rule). Raises LabError for n < 1."""
    return [prompt_of_length(model, n, corpus=corpus, offset=start + i * (n + DISTINCT_GAP)) for i in range(count)]


def chat_ids(model, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Chat messages rendered by the model's own (Hugging Face) chat template, as token ids."""
    tok = lab_tokenizer(model)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def text_ids(model, text: str) -> list[int]:
    """Plain text as token ids with the lab tokenizer (special tokens parsed, none added)."""
    return list(lab_tokenizer(model)(text, add_special_tokens=False)["input_ids"])
