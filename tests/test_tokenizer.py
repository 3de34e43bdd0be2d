"""The lab's tokenizer (the derived HF folder's) and each engine's agree, token for token.

Case tokenizer_probe.txt: transformers' own GGUF loader builds a plain ByteLevel
split for the pre-tokenizer type "smollm" and makes "\\n\\n" two tokens (198, 198);
llama.cpp splits digits first, then the GPT-2 regex, as the original tokenizer
did, and makes it one (1116). The lab restores the GGUF's split rule when it
derives the HF folder, so every engine sees the same ids.
"""

from pathlib import Path

import pytest

from lablib.measure.workload import lab_tokenizer
from lablib.studies.cases import unescape_probe

CASES = Path(__file__).parent / "data" / "cases"


def probe_lines():
    raw = (CASES / "tokenizer_probe.txt").read_text(encoding="utf-8").splitlines()
    return [unescape_probe(ln) for ln in raw]


def test_transformers_gguf_loader_splits_double_newline_in_two(model):
    """The upstream fault the lab works around (still present in transformers 5.24)."""
    from transformers import AutoTokenizer

    gguf = Path(model.gguf_path)
    direct = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    line = probe_lines()[1]
    ids = direct(line, add_special_tokens=False)["input_ids"]
    assert ids[5:7] == [198, 198]


def test_probe_line_two_is_one_token_for_double_newline(model, llama):
    line = probe_lines()[1]  # "a,b  c\n\n123456 ..."
    lab = lab_tokenizer(model)(line, add_special_tokens=False)["input_ids"]
    assert lab[:12] == [81, 28, 82, 216, 265, 1116, 33, 34, 35, 36, 37, 38]
    assert llama.tokenize(line) == lab


def test_whole_probe_identical_in_every_engine(model, llama, hf, mlx):
    text = "\n".join(probe_lines())
    lab = lab_tokenizer(model)(text, add_special_tokens=False)["input_ids"]
    assert llama.tokenize(text) == lab
    assert hf.tokenize(text) == lab
    assert mlx.tokenize(text) == lab


@pytest.mark.parametrize(
    "text",
    [
        "a\n\n\nb",
        "x  \n  y",
        "tabs\t\t\tthen\n\t\n",
        "end with newlines\n\n",
        "  leading",
        "1\n\n2\n\n\n3",
        "price: 1,000,000.50 $",
        "def g():\n\n\n    pass\n",
        "<|im_start|>user\nhi<|im_end|>\n",
    ],
)
def test_whitespace_digit_and_special_neighbours_agree(text, model, llama, hf):
    lab = lab_tokenizer(model)(text, add_special_tokens=False)["input_ids"]
    assert llama.tokenize(text) == lab
    assert hf.tokenize(text) == lab
