"""Texts keep every token: each piece of the default vocabulary detokenizes to its full text in
every engine, and text round-trips (../shared/cases, "long vocabulary pieces")."""

import json
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "data" / "cases"


@pytest.fixture(scope="module")
def long_pieces():
    return json.loads((CASES / "long_vocabulary_pieces.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def vocabulary_bytes(model):
    """Every token's piece as bytes, read from the GGUF itself (tokenizer.ggml.tokens, GPT-2's
    byte-to-unicode table; control tokens as written): no engine involved."""
    import gguf
    from gguf.vocab import bytes_to_unicode

    r = gguf.GGUFReader(model.gguf_path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    control = int(gguf.TokenType.CONTROL)
    return [t.encode() if ty == control else bytes(byte_of[c] for c in t) for t, ty in zip(tokens, types)]


def test_the_case_lists_every_piece_longer_than_32_bytes(long_pieces, vocabulary_bytes):
    assert len(vocabulary_bytes) == long_pieces["vocabulary_size"] == 49152
    longer = [i for i, b in enumerate(vocabulary_bytes) if len(b) > 32]
    assert longer == [p["id"] for p in long_pieces["pieces"]] and len(longer) == 47
    assert all(vocabulary_bytes[p["id"]] == p["text"].encode() for p in long_pieces["pieces"])


def test_every_long_piece_detokenizes_in_full(engine, long_pieces):
    for p in long_pieces["pieces"]:
        assert engine.detokenize([p["id"]]) == p["text"], p["id"]
    ids = [p["id"] for p in long_pieces["pieces"]]
    assert engine.detokenize(ids) == "".join(p["text"] for p in long_pieces["pieces"])


def test_every_piece_of_the_vocabulary_detokenizes_to_its_text(engine, vocabulary_bytes):
    """All 49,152 ids one by one (a piece that is part of a UTF-8 character shows U+FFFD, as
    the bytes decode with errors='replace')."""
    wrong = [i for i, b in enumerate(vocabulary_bytes) if engine.detokenize([i]) != b.decode("utf-8", errors="replace")]
    assert wrong == []


def test_the_llama_cpp_pieces_are_the_vocabulary_bytes(llama, vocabulary_bytes):
    assert [llama.piece_bytes(i) for i in range(len(vocabulary_bytes))] == vocabulary_bytes


@pytest.mark.parametrize("text", ["=" * 80, "x = 1\n" + " " * 40 + "return x\n", "\n" + " " * 64 + "end"])
def test_text_round_trips(engine, text):
    assert engine.detokenize(engine.tokenize(text)) == text


def test_the_tokenizer_probe_round_trips(engine):
    lines = (CASES / "tokenizer_probe.txt").read_text(encoding="utf-8").splitlines()
    text = "\n".join(ln.replace("\\n", "\n").replace("\\t", "\t") for ln in lines)
    assert engine.detokenize(engine.tokenize(text)) == text
