"""lablib.studies.quant and lablib.studies.ladder on the real default model: the F32 reference, llama.cpp's quantizer,
quality against the reference, and a ladder that survives an interruption."""

import json

import numpy as np
import pytest

from lablib.errors import LabError
from lablib.studies import quality, quant


@pytest.fixture(scope="module")
def ref_path(model):
    return quant.reference(model, "F32")


def test_unknown_type_is_refused_with_the_known_ones():
    with pytest.raises(LabError) as e:
        quant.parse_types("Q8_0,Q9_9")
    msg = str(e.value)
    assert "Q9_9" in msg and "Q4_K_M" in msg and "IQ4_NL" in msg and msg.endswith("Example: types=Q8_0")
    assert quant.parse_types(" q8_0,Q4_K_M,Q8_0") == ["Q8_0", "Q4_K_M"]


def test_reference_keeps_metadata_and_tokenizer(model, ref_path):
    import gguf

    src, ref = gguf.GGUFReader(model.gguf_path), gguf.GGUFReader(str(ref_path))
    skip = {"general.file_type", "GGUF.kv_count"}
    assert {k for k in src.fields if k not in skip} == {k for k in ref.fields if k not in skip}
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.rope.freq_base"):
        assert ref.fields[k].contents() == src.fields[k].contents(), k
    facts = quant.file_facts(ref_path)
    assert facts["file_type"] == "ALL_F32" and [g["type"] for g in facts["types"]] == ["F32"]
    assert facts["bpw"] == 32.0 and facts["parameters"] == model.parameters
    # the dequantized values are the shipped Q4_1 blocks' values, exactly
    t_src = {t.name: t for t in src.tensors}["blk.3.attn_q.weight"]
    t_ref = {t.name: t for t in ref.tensors}["blk.3.attn_q.weight"]
    assert np.array_equal(gguf.quants.dequantize(t_src.data, t_src.tensor_type), t_ref.data)


def test_reference_gives_the_same_greedy_ids_as_transformers(model, ref_path, hf):
    from lablib.cli.run import DEFAULT_CHAT
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import chat_ids

    ids = chat_ids(model, [{"role": "user", "content": DEFAULT_CHAT}])
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    eng = load_engine("llama.cpp", quant.rung_model(ref_path, model, "F32"), n_ctx=256)
    try:
        got = eng.generate(ids, cfg).token_ids
    finally:
        eng.close()
    assert got == hf.generate(ids, cfg).token_ids


def test_requantizing_to_q4_1_reproduces_the_source(model, ref_path, tmp_path):
    import gguf

    from lablib.engines import load_engine

    rec = quant.rung(ref_path, "Q4_1", quant.quant_home(model.sha256), model.sha256)
    src = {t.name: t for t in gguf.GGUFReader(model.gguf_path).tensors}
    for t in gguf.GGUFReader(rec["path"]).tensors:  # llama.cpp's quantizer gives back the same blocks
        assert t.tensor_type == src[t.name].tensor_type and np.array_equal(t.data, src[t.name].data), t.name
    shipped = load_engine("llama.cpp", model, n_ctx=128)
    try:
        chunks = quality.text_chunks(shipped, 128, 2)
        ref = quality.reference_logprobs(shipped, chunks, tmp_path, key="shipped")
    finally:
        shipped.close()
    eng = load_engine("llama.cpp", quant.rung_model(rec["path"], model, "Q4_1"), n_ctx=128)
    try:
        out = quality.compare_to_reference(eng, ref)
    finally:
        eng.close()
    assert out["kl_mean"] < 1e-3 and out["top1"] == 1.0 and out["n_tokens"] == 126


def test_k_quants_fall_back_where_rows_are_576(model, ref_path):
    rec = quant.rung(ref_path, "Q4_K_M", quant.quant_home(model.sha256), model.sha256)
    groups = {g["type"]: g for g in quant.tensor_types(rec["path"])}
    k_tensors = [n for t, g in groups.items() if t.endswith("_K") for n in g["tensors"]]
    assert k_tensors and all(n.endswith("ffn_down.weight") for n in k_tensors)  # rows of 1536 = 6 x 256
    assert "blk.0.attn_q.weight" in groups["Q5_0"]["tensors"]  # Q4_K -> Q5_0 on rows of 576
    assert groups["Q5_0"]["n_elements"] > groups["Q4_K"]["n_elements"]


def test_q8_0_is_closer_to_the_reference_than_q4_0(model):
    from lablib.studies.ladder import run_ladder

    rows = run_ladder(
        ["Q8_0", "Q4_0"], model=model, speed=False, include_reference=False, n_ctx=128, n_chunks=2, log=lambda *_: None
    )
    by = {r["type"]: r for r in rows}
    assert 0 < by["Q8_0"]["kl_mean"] < by["Q4_0"]["kl_mean"]
    assert by["Q8_0"]["bytes"] > by["Q4_0"]["bytes"] and by["Q8_0"]["bpw"] > by["Q4_0"]["bpw"]
    assert by["Q8_0"]["ppl_ref"] == by["Q4_0"]["ppl_ref"]  # one reference for every rung


def test_interrupted_ladder_keeps_finished_files_and_rows(model, tmp_path):
    from lablib.studies.ladder import run_ladder

    out, home = tmp_path / "ladder.jsonl", tmp_path / "files"

    def stop_after_first(row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ladder(
            ["Q5_0", "Q4_0"],
            model=model,
            out=out,
            home=home,
            speed=False,
            include_reference=False,
            n_ctx=128,
            n_chunks=2,
            on_row=stop_after_first,
            log=lambda *_: None,
        )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in rows] == ["Q5_0"] and rows[0]["cached"] is False
    assert sorted(p.name for p in home.iterdir()) == ["Q5_0.gguf", "Q5_0.json"]
    first = (home / "Q5_0.gguf").stat().st_mtime_ns
    rows = run_ladder(
        ["Q5_0", "Q4_0"],
        model=model,
        out=out,
        home=home,
        speed=False,
        include_reference=False,
        n_ctx=128,
        n_chunks=2,
        log=lambda *_: None,
    )
    assert [r["cached"] for r in rows] == [True, False]
    assert (home / "Q5_0.gguf").stat().st_mtime_ns == first
    assert [json.loads(line)["type"] for line in out.read_text().splitlines()] == ["Q5_0", "Q5_0", "Q4_0"]


def test_cli_refuses_an_unknown_type_before_any_work(capsys):
    from lablib.cli import main

    assert main(["quantize", "--types", "Q8_0,Q3_X"]) == 2
    err = capsys.readouterr().err
    assert "Q3_X" in err and "Q4_K_M" in err


def test_cli_quality_writes_one_row(model, tmp_path, capsys):
    from lablib.cli import main
    from lablib.results.store import load_results

    out = tmp_path / "q.jsonl"
    assert (
        main(
            [
                "quality",
                "--engine",
                "llama.cpp",
                "--variant",
                "Q8_0",
                "--no-speed",
                "--n-ctx",
                "128",
                "--chunks",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    df = load_results(out)
    assert list(df["type"]) == ["Q8_0"] and df["n_tokens"].iloc[0] == 126
    assert 0 < df["kl_mean"].iloc[0] < 0.05 and df["reference"].iloc[0].startswith("dequantized Q4_1")
    assert "type=Q8_0" in capsys.readouterr().out


def test_quality_ladder_says_not_available_for_an_engine_without_variants(capsys, tmp_path):
    """onnxruntime-genai reads the HF folder but takes no torch dtype: one clear line, no load."""
    from lablib.cli import main

    out = tmp_path / "q.jsonl"
    args = ["quality", "--engine", "onnxruntime-genai", "--variant", "bfloat16", "--no-speed", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "engine onnxruntime-genai: the quality ladder has no variants for it (not available)" in err
    assert "Traceback" not in err and not out.exists()


def test_quality_of_another_gguf_engine_is_not_measured_on_llama_cpp(capsys, tmp_path):
    """openvino reads a GGUF too, but the ladder's GGUF rungs are measured on llama.cpp: asked for
    openvino, quality says not available instead of writing a llama.cpp row."""
    from lablib.cli import main

    out = tmp_path / "q.jsonl"
    assert main(["quality", "--engine", "openvino", "--no-speed", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "engine openvino: the quality ladder has no variants for it (not available)" in err
    assert not out.exists()


def test_the_ladder_finds_its_gguf_engine_by_the_class_fact(monkeypatch):
    """The engine GGUF rungs are made and measured on is the one whose class says quantizes_gguf;
    a second one is a clear error, not a silent pick."""
    from lablib.engines import ENGINES
    from lablib.errors import LabError
    from lablib.studies.ladder import gguf_engine

    assert gguf_engine() == "llama.cpp"
    assert [n for n, cls in ENGINES.items() if cls.quantizes_gguf] == ["llama.cpp"]

    class Second(ENGINES["openvino"]):
        quantizes_gguf = True

    monkeypatch.setitem(ENGINES, "openvino", Second)
    with pytest.raises(LabError, match=r"\['llama.cpp', 'openvino'\]; expected exactly one"):
        gguf_engine()


def test_an_interrupted_reference_leaves_no_half_file_and_the_next_run_makes_it_whole(model, tmp_path):
    """A Ctrl-C while the reference's log-probs are written (here after the first of two chunks, on the real
    engine) leaves no ``.tmp`` of them in the cache (an interrupted `lablib quality` left 161 MB); the next call
    writes the whole file."""
    from lablib.engines import load_engine

    eng = load_engine("llama.cpp", model, n_ctx=128)
    try:
        chunks = quality.text_chunks(eng, 128, 2)
        real, calls = eng.logits, []

        def interrupted_after_one(ids):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(ids)

        eng.logits = interrupted_after_one
        with pytest.raises(KeyboardInterrupt):
            quality.reference_logprobs(eng, chunks, tmp_path, key="shipped")
        assert list(tmp_path.iterdir()) == [] and len(calls) == 2
        eng.logits = real
        ref = quality.reference_logprobs(eng, chunks, tmp_path, key="shipped")
    finally:
        eng.close()
    assert [p.name for p in tmp_path.iterdir()] == [ref.path.name]
    # float32 log-probs of SmolLM2's 49,152 tokens at each scored position, [64, 127) of each of the 2 chunks
    assert ref.n_vocab == 49152 and ref.path.stat().st_size == 4 * 2 * 63 * 49152
