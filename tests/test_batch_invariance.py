"""Lab 04's batch invariance (lablib.studies.batch_invariance) on the real llama.cpp engine and the shipped model:
each prompt alone twice, then through the engine's continuous batching; where its ids part, and the engine's own
top-2 margin there. Which prompts part depends on the CPU's kernels, so the tests hold what must be true on any
machine: alone repeats itself, the batched path with no neighbour gives the ids alone, and every row of the table
says what the ids say."""

import json

import numpy as np
import pandas as pd
import pytest

import lablib
from lablib import plots
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.studies.batch_invariance import QUESTIONS, batch_invariance, parted_row
from lablib.studies.compare import NEAR_TIE_NATS


@pytest.fixture(scope="module")
def result(model):
    return batch_invariance(model, "llama.cpp", concurrency="1,4", max_new_tokens=8, prompts=QUESTIONS[2:6])


def test_alone_repeats_and_the_batched_path_alone_gives_the_same_ids(result):
    assert result.engine == "llama.cpp"
    assert result.repeat_parted == []  # llama.cpp on the CPU is deterministic with nothing beside a prompt
    assert all(len(ids) == 8 for ids in result.alone)
    assert result.batched[1] == result.alone  # one sequence through llama_decode's batch: the same ids
    alone_rows = result.table[result.table["concurrency"] == 1]
    assert alone_rows["first_divergence"].isna().all()
    assert (alone_rows["same_tokens"] == 8).all()


def test_every_row_says_what_the_ids_say(result):
    t = result.table
    assert list(t["concurrency"].unique()) == [1, 4] and len(t) == 8
    assert list(t["question"][:4]) == list(QUESTIONS[2:6])
    for r in t.itertuples():
        a, b = result.alone[r.prompt], result.batched[r.concurrency][r.prompt]
        if pd.isna(r.first_divergence):
            assert a == b and r.same_tokens == 8 and r.margin is None
        else:
            pos = int(r.first_divergence)
            assert a[:pos] == b[:pos] and a[pos] != b[pos] and r.same_tokens == pos
            assert r.margin >= 0 and r.near_tie == (r.margin < NEAR_TIE_NATS)
    s = result.summary().set_index("concurrency")
    for c, g in t.groupby("concurrency"):
        assert s.loc[c, "parted"] == g["first_divergence"].notna().sum()
        assert s.loc[c, "same_share"] == pytest.approx(g["same_tokens"].sum() / (len(g) * 8))
    assert result.verdict.startswith("llama.cpp ")


def test_a_parted_row_carries_both_tokens_and_the_engines_own_margin(llama, model):
    prompt = lablib.question_ids(model)[0]
    alone = [int(t) for t in llama.generate(prompt, GenerationConfig(max_new_tokens=6)).token_ids]
    batched = alone[:3] + [alone[3] + 1] + alone[4:]
    row = parted_row(llama, prompt, alone, batched)
    assert row["first_divergence"] == 3 and row["same_tokens"] == 3
    assert row["alone_token"] == llama.detokenize([alone[3]])
    assert row["batched_token"] == llama.detokenize([alone[3] + 1])
    last = np.asarray(llama.logits(prompt + alone[:3]))[-1].astype(np.float64)
    logp = np.sort(last - np.log(np.exp(last - last.max()).sum()) - last.max())[::-1]
    assert row["margin"] == pytest.approx(logp[0] - logp[1], abs=1e-4)
    assert parted_row(llama, prompt, alone, list(alone))["first_divergence"] is None


def test_the_map_draws_one_square_per_prompt_and_concurrency(result):
    fig = plots.parting_map(result)
    same, parted = fig.data
    assert (same.name, parted.name) == ("same ids as alone", "parts from alone")
    cells = {name: set(zip(tr.x, tr.y)) for name, tr in (("same", same), ("parted", parted))}
    t = result.table
    expected = {"same": set(), "parted": set()}
    for r in t.itertuples():
        expected["parted" if not pd.isna(r.first_divergence) else "same"].add((str(r.concurrency), r.question))
    assert cells == expected and len(cells["same"]) + len(cells["parted"]) == 8
    for x, y, text in zip(parted.x, parted.y, parted.text):
        r = t[(t["concurrency"] == int(x)) & (t["question"] == y)].iloc[0]
        assert text == f"token {int(r.first_divergence)}, {r.margin:.2f} nats"
    assert set(same.text) <= {""}
    assert list(fig.layout.xaxis.categoryarray) == ["1", "4"]
    with pytest.raises(LabError, match="batch_invariance"):
        plots.parting_map(pd.DataFrame({"engine": ["x"]}))


def test_refusals_before_any_prompt_runs(llama, model):
    with pytest.raises(LabError, match="no continuous batching"):
        batch_invariance(model, "ortgenai")
    with pytest.raises(LabError, match="concurrency"):
        batch_invariance(model, llama, concurrency=0)
    with pytest.raises(LabError, match="prompts="):
        batch_invariance(model, llama, prompts="What is a cat?")
    with pytest.raises(LabError, match="n_seq_max"):  # loaded for one sequence: said before the prompts run
        batch_invariance(model, llama, concurrency=(1, 2))
    with pytest.raises(LabError, match="did you mean"):
        lablib.batch_invariance(model, llama, concurrencies=(1, 2))
    with pytest.raises(LabError, match=r"flash_attn='on': expected True"):
        lablib.load_engine("llama.cpp", model, flash_attn="on")
    with pytest.raises(LabError, match="dict of load keywords"):
        batch_invariance(model, "llama.cpp", load=4)


def test_lablib_compare_batches_puts_your_prompt_first_beside_the_lab_questions(model, tmp_path, capsys):
    from lablib.cli import main

    ids = lablib.question_ids(model)[0]
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    args = ["compare", "--batches", "1,2", "--ids", str(tmp_path / "ids.json"), "--max-new-tokens", "4", "--json"]
    assert main(args) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["engine"] == "llama.cpp" and out["repeat_parted"] == []
    table = pd.DataFrame(out["table"])
    assert len(table) == 2 * (1 + len(QUESTIONS)) and set(table["concurrency"]) == {1, 2}
    assert table.loc[table["prompt"] == 0, "question"].isna().all()  # yours, as ids
    assert list(table.loc[table["concurrency"] == 1, "question"][1:]) == list(QUESTIONS)
    assert [s["prompts"] for s in out["summary"]] == [9, 9]
    # its options belong to --batches, and --batches compares an engine with itself
    assert main(["compare", "--margins", "llama.cpp"]) == 2
    assert "--margins goes with --batches" in capsys.readouterr().err
    assert main(["compare", "--batches", "1,2", "--engine-model", "mlx=x"]) == 2
    assert "--engine-model has no meaning with --batches" in capsys.readouterr().err
    assert main(["compare", "--batches", "0"]) == 2 and "--batches=0" in capsys.readouterr().err
    assert main(["compare", "--batches", "1", "--prompt", " "]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    assert main(["compare", "--batches", "1", "--server", "llama-server"]) == 2
    assert "give --base-url too" in capsys.readouterr().err
    assert main(["compare", "--batches", "1", "--reference", "llama.cpp"]) == 2
    assert "--reference has no meaning with --batches" in capsys.readouterr().err


def test_what_was_given_is_checked_against_what_it_must_match(llama, model):
    gemma = lablib.prepare("gemma-3-270m")
    other = lablib.load_engine("llama.cpp", gemma, n_ctx=512)
    try:  # margins from another model's logits (and its tokenizer's pieces) would be another model's reading
        with pytest.raises(LabError, match="margins come from an engine of the same model"):
            batch_invariance(model, llama, concurrency=1, prompts=QUESTIONS[:1], margins=other)
        with pytest.raises(LabError, match="tokenized by the engine's model"):  # was: "token id ... outside"
            batch_invariance(gemma, llama, concurrency=1, prompts=QUESTIONS[:1])
    finally:
        other.close()
    with pytest.raises(LabError, match="closed"):
        batch_invariance(model, llama, concurrency=1, prompts=QUESTIONS[:1], margins=other)
    with pytest.raises(LabError, match="concurrency 4 with 2 prompts: at most 2 can share a step"):
        batch_invariance(model, llama, concurrency=4, prompts=QUESTIONS[:2])
    with pytest.raises(LabError, match=r"prompts\[0\]=1: .*wrap it"):
        batch_invariance(model, llama, concurrency=1, prompts=[1, 2, 3])
    with pytest.raises(LabError, match=r"prompts\[0\]=.*chat messages: pass the question's text"):
        batch_invariance(model, llama, concurrency=1, prompts=[{"role": "user", "content": "Hi"}])
    for bad in ({"a": 1}, {"q": "What is a cat?"}):
        with pytest.raises(LabError, match="prompts="):
            batch_invariance(model, llama, concurrency=1, prompts=bad)
    with pytest.raises(LabError, match="concurrency="):
        batch_invariance(model, llama, concurrency={1: 2})


def test_unknown_margins_are_no_near_ties_and_the_map_keeps_one_row_per_prompt():
    from lablib.studies.batch_invariance import BatchInvariance

    rows = [
        dict(concurrency=c, prompt=p, question="Hi", first_divergence=d, same_tokens=4 if d is None else d,
             alone_token=None if d is None else "A", batched_token=None if d is None else "B", margin=None,
             near_tie=None)
        for c, p, d in ((1, 0, None), (1, 1, None), (2, 0, 0), (2, 1, None))
    ]  # fmt: skip
    table = pd.DataFrame(rows)
    table["first_divergence"] = table["first_divergence"].astype("Int64")
    r = BatchInvariance("llama-server", 4, table)
    s = r.summary().set_index("concurrency")
    assert s.loc[2, "parted"] == 1 and pd.isna(s.loc[2, "near_ties"]) and s.loc[1, "near_ties"] == 0
    fig = plots.parting_map(r)
    assert list(fig.layout.yaxis.categoryarray) == ["Hi", "Hi (prompt 1)"]  # two prompts, two rows
    assert "(4 tokens each)" in fig.layout.title.text  # the budget, though one parted at token 0
    assert fig.data[1].text == ("token 0",)  # no margin known: none printed


def test_prefill_pieces_follow_split_equal_by_hand():
    """llama.cpp's split_equal (src/llama-batch.cpp): each micro-batch takes one token of every sequence with tokens
    left while all have one, so a piece is the shortest remaining prompt. By hand for 36, 35, 34, 40: 34 of each,
    then 1 of the three left (2, 1, 6 remain), then 1 of the two left (1, 5), then 4 of the last."""
    from lablib.studies.batch_invariance import prefill_pieces

    assert prefill_pieces([36, 35, 34, 40]) == [[34, 1, 1], [34, 1], [34], [34, 1, 1, 4]]
    assert prefill_pieces([7]) == [[7]] and prefill_pieces([5, 5]) == [[5], [5]]
    assert [sum(p) for p in prefill_pieces([42, 37, 9, 1])] == [42, 37, 9, 1]
    with pytest.raises(LabError, match=r"lengths\[1\]=0: expected"):
        prefill_pieces([3, 0])


def test_a_prompt_cut_alone_as_the_batch_cut_it_gets_the_batched_first_token(model):
    """The batch changes where each prompt is cut (prefill_pieces), and the first token follows the cut: the eight
    questions admitted together, "How do airplanes fly?" (35 tokens) is prefilled as 34 + 1 and "Describe a cat."
    (34) whole; alone with n_batch=34 each is cut the same way and gives the first token the batch gave. Both end
    in a micro-batch where they are the only sequence asking for logits, so the output head sees one row in both
    runs (any CPU: the same kernels on the same pieces). On the lab's Xeon the first differs from the prompt
    prefilled whole ("The" against "Air"); elsewhere it may not: that is the CPU's."""
    from lablib.studies.batch_invariance import prefill_pieces, prompt_ids

    ids, questions = prompt_ids(model, None)
    pieces = prefill_pieces([len(p) for p in ids])
    inv = batch_invariance(model, "llama.cpp", concurrency=8, max_new_tokens=1)
    cut = lablib.load_engine("llama.cpp", model, n_batch=34)
    try:
        for question, want in (("How do airplanes fly?", [34, 1]), ("Describe a cat.", [34])):
            q = questions.index(question)
            assert pieces[q] == want
            alone_cut = cut.generate(ids[q], GenerationConfig(max_new_tokens=1)).token_ids
            assert alone_cut == inv.batched[8][q][:1]
    finally:
        cut.close()
