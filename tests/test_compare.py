"""Is it the engine or the model? The handed cases give their right verdicts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lablib.errors import LabError
from lablib.model.formats import folder_with_config, gguf_config
from lablib.studies import compare as cmp
from lablib.studies.cases import load_case

CASES = Path(__file__).parent / "data" / "cases"


@pytest.fixture(scope="module")
def flip(model, hf, llama, first_token_flip):
    return cmp.compare(
        model,
        engines=["transformers", "llama.cpp"],
        ids=first_token_flip["prompt_token_ids"],
        loaded=[hf, llama],  # a list keyed by the engines' own names (lab 04 passes a dict, as below)
        max_new_tokens=8,
    )


def test_loaded_engines_that_are_no_engines_or_under_another_name_are_refused_before_any_load(model, hf, llama):
    """Was: AttributeError for a list of anything, and an engine keyed by an alias ("hf") loaded a second time."""
    assert cmp.loaded_engines({"hf": hf, "llama.cpp": llama}) == {"transformers": hf, "llama.cpp": llama}
    with pytest.raises(LabError, match=r"loaded=\[1\]: expected engines already loaded .* 1 is no engine"):
        cmp.compare(model, engines=["llama.cpp"], loaded=[1])
    with pytest.raises(LabError, match=r"loaded\['transformers'\] is a llama.cpp engine; key each loaded engine"):
        cmp.loaded_engines({"transformers": llama})


def test_first_token_flip_is_a_numerical_near_tie_at_position_0(flip, first_token_flip):
    # what must hold on any CPU (first_token_flip.json, robust_checks)
    assert flip.check("tokenizer").ok and flip.check("template").ok and flip.check("config").ok
    row = flip.check("logits").table.iloc[0]
    assert row["kl_last"] < 0.05
    assert len(set(row["top5_ref_last"]) & set(row["top5_last"])) >= 4
    assert row["top5_ref_last"] == first_token_flip["observed"]["top5_transformers"]
    # the verdict
    v = flip.verdict
    assert v["layer"] == "numerics" and v["near_tie"] is True and v["position"] == 0
    assert v["margin_ref"] < cmp.NEAR_TIE_NATS
    gen = flip.check("generation").table.set_index("engine")
    assert gen.loc["transformers", "text"].startswith("The capital of France is Paris.")


def test_comparison_json_has_the_verdict_object(flip):
    d = flip.to_dict()
    json.dumps(d, default=str)
    assert d["verdict"]["layer"] == "numerics" and d["verdict"]["position"] == 0 and d["verdict"]["near_tie"]
    assert [c["name"] for c in d["checks"]] == ["config", "tokenizer", "template", "logits", "generation"]


def test_rope_theta_v5_config_is_flagged_and_its_damage_shown(model, hf, tmp_path):
    folder = folder_with_config(model.mlx_path, CASES / "rope_theta_v5" / "config.json", tmp_path / "mlx_v5")
    r = cmp.compare(
        model,
        engines=["transformers", "mlx"],
        engine_models={"mlx": str(folder)},
        loaded={"transformers": hf},
        max_new_tokens=8,
    )
    cfg = r.check("config").table.set_index("setting")
    assert cfg.loc["rope_theta", "mlx"] == pytest.approx(10000.0)
    assert cfg.loc["rope_theta", "gguf file"] == 100000.0
    assert cfg.loc["rope_theta", "transformers"] == pytest.approx(100000.0, rel=1e-3)
    assert cfg.loc["rope_theta", "mismatch"] == "mlx"
    assert r.verdict["layer"] == "config" and "rope_theta" in r.verdict["text"]
    gen = r.check("generation").table.set_index("engine")
    assert gen.loc["mlx", "first_divergence"] is not None
    assert not gen.loc["mlx", "text"].startswith("The capital of France")


def test_tokenizer_probe_reports_position_and_pieces(model, llama):
    text = load_case("tokenizer_probe", root=CASES)
    view = cmp.TokenizerView.from_gguf(model.gguf_path)
    check = cmp.check_tokenizer({"llama.cpp": llama, view.name: view}, "llama.cpp", text)
    assert check.ok is False
    row = check.table.set_index("engine").loc[view.name]
    assert row["ids_there"][:2] == [198, 198] and row["reference_ids_there"][0] == 1116
    assert row["pieces_there"][:2] == ["\n", "\n"] and row["reference_pieces_there"][0] == "\n\n"
    # the position is where line 2's "\n\n" falls in the probe
    prefix = llama.tokenize(text)[: row["first_difference"]]
    assert llama.detokenize(prefix).endswith("a,b  c")


def test_a_check_that_cannot_run_says_so(model, llama):
    view = cmp.TokenizerView.from_gguf(model.gguf_path)
    check = cmp.check_logits({"llama.cpp": llama, view.name: view}, "llama.cpp", [1, 504, 3575])
    assert check.ok is None and "not available" in check.verdict


def test_template_with_bos_in_its_text_is_caught(model, hf):
    """A template that writes BOS itself, rendered by a path that adds BOS again: double BOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model.hf_path)
    tok.bos_token = "<|endoftext|>"  # a model whose BOS is separate from the turn markers
    tok.chat_template = "{{ bos_token }}" + tok.chat_template
    plain = cmp.TokenizerView(AutoTokenizer.from_pretrained(model.hf_path), "reference")
    plain.tok.bos_token = "<|endoftext|>"
    doubled = cmp.TokenizerView(tok, "bos-in-template")
    check = cmp.check_template({"reference": plain, "bos-in-template": doubled}, "reference")
    assert check.ok is False
    rows = check.table[check.table["engine"] == "bos-in-template"]
    assert (rows["first_difference"] == 0).all()
    assert (rows["bos_count"] == 1).all()  # one BOS id where the reference has none


def test_config_neighbours_other_moved_keys(model):
    """Keys that moved between transformers versions: rope scaling and the norm epsilon."""
    base = gguf_config(model.gguf_path)  # the one GGUF reader (lablib.model.formats)
    assert base["rope_theta"] == 100000.0 and base["tie_word_embeddings"] is True
    assert base["n_kv_heads"] == 3 and base["head_dim"] == 64 and base["rms_norm_eps"] == pytest.approx(1e-5)
    assert cmp._same(100000.0, 100000.04) and not cmp._same(10000.0, 100000.0)


@pytest.mark.parametrize(
    "kw, want",
    [
        ({"engines": "llama.cpp,nonsense"}, r"unknown engine 'nonsense'"),  # was: "unknown engine 'l'", its letters
        ({"messages": "What is the capital of France?"}, r"messages='What is the capital of France\?': expected a"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\]=\{'role': 'user'\}: expected a non-empty list of"),
        ({"messages": [{"content": "hi"}]}, r"messages\[0\]="),  # was: jinja2's "'dict object' has no attribute"
    ],
)
def test_engines_as_text_and_messages_that_are_no_chat_are_refused_before_any_load(model, kw, want, monkeypatch):
    import lablib.studies.compare

    monkeypatch.setattr(lablib.studies.compare, "load_engine", lambda *a, **k: pytest.fail("an engine was loaded"))
    with pytest.raises(LabError, match=want):
        cmp.compare(model, **{"engines": ["llama.cpp"], **kw})


def test_a_chat_of_messages_is_checked_where_it_is_rendered(model):
    from lablib.measure.workload import chat_ids

    assert len(chat_ids(model, [{"role": "user", "content": "Hi"}])) > 5
    for bad in ("hello", [], [{"content": "hi"}], [["user", "hi"]], None):
        with pytest.raises(LabError, match=r"messages.*: expected a non-empty list of \{\"role\": \.\.\., \"content\""):
            chat_ids(model, bad)


def test_decide_orders_layers():
    ok = lambda n: cmp.Check(n, True, "ok")  # noqa: E731
    bad = lambda n: cmp.Check(n, False, f"{n} differs")  # noqa: E731
    gen = cmp.Check("generation", False, "g", details={"position": 3, "margin_ref": 2.0, "engine": "x"})
    assert cmp.decide([ok("config"), bad("tokenizer"), bad("template"), gen])["layer"] == "tokenizer"
    d = cmp.decide([ok("config"), ok("tokenizer"), ok("template"), ok("logits"), gen])
    assert d["layer"] == "numerics" and d["position"] == 3 and d["near_tie"] is False
    assert cmp.decide([ok("config"), ok("generation")])["layer"] == "none"


def test_cli_compare_json(tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(json.loads((CASES / "first_token_flip.json").read_text())))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lablib.cli",
            "compare",
            "--engines",
            "transformers,llama.cpp",
            "--ids",
            str(ids),
            "--max-new-tokens",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)["verdict"]
    assert v["layer"] == "numerics" and v["position"] == 0 and v["near_tie"] is True


def test_compare_figures(flip, hf, llama):
    from lablib.plots import kl_per_position

    fig = kl_per_position(flip, "llama.cpp")
    kl = flip.check("logits").details["stats"]["llama.cpp"]["kl"]
    assert list(fig.data[0].y) == list(kl) and fig.layout.yaxis.title.text == "KL (nats)"
    assert fig.data[0].line.color == "#3D7DCA"  # llama.cpp's color everywhere
    from lablib.plots import topk_at_divergence

    bars = topk_at_divergence(flip, "llama.cpp")  # drawn from what compare stored: no engine runs
    ref, eng = bars.data[0], bars.data[1]
    assert ref.name == "transformers" and eng.name == "llama.cpp"
    assert ref.y[0].endswith("(504)") and eng.y[0].endswith("(60)")  # "The" vs "L" at position 0
    assert 0 < eng.x[0] < 1 and ref.x[0] >= ref.x[1]
    # given a table, or a check it did not run: one message each (was AttributeError on 'check', StopIteration)
    with pytest.raises(LabError, match="kl_per_position draws a comparison, what lablib.compare.* given a DataFrame"):
        kl_per_position(flip.check("logits").table, "llama.cpp")
    with pytest.raises(LabError, match=r"no 'numerics' check in this comparison: it ran config, tokenizer"):
        flip.check("numerics")


def test_cases_are_read_once_and_agree_with_the_tests_copy():
    """lablib.studies.cases reads data/cases (notebook 04); the tests keep their own copy of the inputs."""
    assert load_case("tokenizer_probe") == load_case("tokenizer_probe", root=CASES)
    assert "a,b  c\n\n123456" in load_case("tokenizer_probe")  # escapes written out
    assert load_case("first_token_flip")["prompt_token_ids"] == load_case("first_token_flip", CASES)["prompt_token_ids"]
    assert load_case("rope_theta_v5").name == "config.json"
    with pytest.raises(LabError, match="unknown case"):
        load_case("no_such_case")


def test_the_verdict_names_only_checks_that_ran():
    """openvino exposes no logits: the logit check is n/a (or covers only the other engines), so a
    verdict of no disagreement must not say the logits agree for it."""
    ok = lambda n: cmp.Check(n, True, "ok")  # noqa: E731
    na = cmp.Check("logits", None, "openvino: logits not available", details={"unavailable": ["openvino: x"]})
    d = cmp.decide([ok("config"), ok("tokenizer"), ok("template"), na, ok("generation")])
    assert d["layer"] == "none"
    assert d["text"] == (
        "no disagreement found: config, tokenizer, template and greedy text agree; "
        "not checked: logits (openvino: logits not available)"
    )
    part = cmp.Check("logits", True, "llama.cpp: ...", details={"unavailable": ["openvino: logits not available (x)"]})
    d = cmp.decide([ok("config"), ok("tokenizer"), ok("template"), part, ok("generation")])
    assert d["text"] == (
        "no disagreement found: config, tokenizer, template, logits and greedy text agree; "
        "not checked: openvino: logits not available (x)"
    )
    assert cmp.decide([ok("config"), ok("generation")])["text"] == "no disagreement found: config and greedy text agree"
