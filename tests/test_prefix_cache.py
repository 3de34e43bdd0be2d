"""Prefix caching, only when asked (lab 08): each real engine on the real default model.

With a kept prefix the engine evaluates only the unique suffix (its own counter says so: llama.cpp's
perf counter n_p_eval, the tokens transformers' and mlx-lm's prefill forward passes received), the
row records cached_tokens, and the greedy ids equal those computed from an empty KV cache. Without
the switch, nothing is reused.
"""

import json

import pytest

from lablib.engines.base import GenerationConfig, PrefixCache
from lablib.errors import LabError
from lablib.measure.workload import chat_ids, prompt_of_length

N_OUT = 12  # greedy tokens compared with and without reuse
ASK = [{"role": "user", "content": "What is the main idea of the text above?"}]


@pytest.fixture(scope="module")
def shared(model):
    return prompt_of_length(model, 96, offset=3000)


@pytest.fixture(scope="module")
def ask(model):
    return chat_ids(model, ASK)


def test_reusable_is_the_common_prefix_less_the_last_prompt_token():
    c = PrefixCache("x", [1, 2, 3, 4])
    assert c.reusable([1, 2, 3, 4, 5, 6]) == 4
    assert c.reusable([1, 2, 9, 4, 5]) == 2
    assert c.reusable([1, 2, 3, 4]) == 3  # the last prompt token is computed: its logits give the first output
    assert c.reusable([7, 2, 3]) == 0
    assert PrefixCache("x", []).reusable([1, 2]) == 0


@pytest.mark.engine
def test_default_requests_reuse_nothing(engine, shared, ask):
    ids = shared + ask
    for _ in range(2):  # the same prompt twice: evaluated in full both times
        tr = engine.generate(ids, GenerationConfig(max_new_tokens=2))
        assert tr.cached_tokens == 0
        assert engine.engine_counters()["n_p_eval"] == len(ids) == tr.prompt_tokens_evaluated


@pytest.mark.engine
def test_reuse_evaluates_only_the_suffix_and_keeps_the_greedy_ids(engine, shared, ask):
    ids = shared + ask
    cfg = GenerationConfig(max_new_tokens=N_OUT)
    cold = engine.generate(ids, cfg)
    kept = engine.cache_prefix(shared)
    assert kept.engine == engine.name and kept.ids == shared
    for _ in range(2):  # the kept prefix is copied, never written: the second use is the same
        warm = engine.generate(ids, cfg, prefix_cache=kept)
        assert warm.cached_tokens == len(shared) == 96
        assert engine.engine_counters()["n_p_eval"] == len(ids) - warm.cached_tokens == len(ask)
        assert warm.prompt_tokens_evaluated == len(ask)
        assert warm.token_ids == cold.token_ids
    assert kept.ids == shared


@pytest.mark.engine
def test_a_longer_cache_is_cut_at_the_common_prefix(engine, model, shared, ask):
    other = chat_ids(model, [{"role": "user", "content": "Summarize the text above in one sentence."}])
    kept = engine.cache_prefix(shared + other)
    common = next(i for i, (a, b) in enumerate(zip(shared + other, shared + ask)) if a != b)
    assert common >= len(shared)
    cfg = GenerationConfig(max_new_tokens=N_OUT)
    tr = engine.generate(shared + ask, cfg, prefix_cache=kept)
    assert tr.cached_tokens == common
    assert engine.engine_counters()["n_p_eval"] == len(shared) + len(ask) - common
    assert tr.token_ids == engine.generate(shared + ask, cfg).token_ids


@pytest.mark.engine
def test_kept_bytes_match_the_shape_of_the_kv_cache(engine, model, shared):
    from lablib.engines.memory import kv_cache_bytes

    kept = engine.cache_prefix(shared)
    formula = kv_cache_bytes(model, type(engine), len(shared))  # 2 x 30 layers x 3 KV heads x 64 x bytes x 96
    assert formula == 2 * 30 * 3 * 64 * type(engine).kv_bytes_per_value * 96
    # transformers and mlx: exactly the tensors; llama.cpp's saved state adds a header per layer and cell
    assert formula <= kept.nbytes <= formula * 1.01


@pytest.mark.engine
def test_keep_holds_the_conversation_for_the_next_turn(engine, model, shared, ask):
    cfg = GenerationConfig(max_new_tokens=N_OUT)
    kept = engine.cache_prefix([])
    assert kept.ids == [] and kept.nbytes == 0
    first = engine.generate(shared + ask, cfg, prefix_cache=kept, keep=True)
    assert first.cached_tokens == 0
    turn = shared + ask + first.token_ids
    # the prompt and the output tokens fed back (all but the last, or all: engines differ)
    assert len(shared + ask) + N_OUT - 1 <= len(kept.ids) <= len(turn) and kept.ids == turn[: len(kept.ids)]
    nxt = turn + chat_ids(model, [{"role": "user", "content": "Why?"}])[-8:]
    held = len(kept.ids)
    second = engine.generate(nxt, cfg, prefix_cache=kept, keep=True)
    assert second.cached_tokens == held
    assert engine.engine_counters()["n_p_eval"] == len(nxt) - held
    assert second.token_ids == engine.generate(nxt, cfg).token_ids


@pytest.mark.engine
def test_a_cache_from_another_engine_or_keep_without_one_is_refused(llama, shared, ask):
    with pytest.raises(LabError, match="made by mlx, not llama.cpp"):
        llama.generate(shared + ask, prefix_cache=PrefixCache("mlx", shared))
    with pytest.raises(LabError, match="keep=True needs a prefix_cache"):
        llama.generate(shared + ask, keep=True)


def test_old_result_files_without_cached_tokens_load_as_no_reuse(tmp_path):
    from lablib.results.store import load_results

    p = tmp_path / "old.jsonl"
    p.write_text(json.dumps({"engine": "llama.cpp", "ttft_s": 0.5, "prompt_tokens": 64}) + "\n")
    df = load_results(p)
    assert df["cached_tokens"].tolist() == [0]


@pytest.mark.engine
def test_shared_prefix_and_chat_rows(model, tmp_path):
    from lablib.plots import prefix as prefix_plots
    from lablib.results import tables
    from lablib.results.store import load_results
    from lablib.studies import prefix

    out = tmp_path / "prefix.jsonl"
    df = prefix.shared_prefix(
        model, engines=["llama.cpp"], shared_tokens=[16, 48], questions=2, max_new_tokens=2, reps=1, out=out
    )
    assert len(df) == 2 * 2 * 2 and len(load_results(out)) == 8
    # the system turn: the document's tokens plus the chat template's (<|im_start|>system\n ... <|im_end|>\n)
    lengths = [len(prefix.shared_prompts(model, s, 2)[0]) for s in (16, 48)]
    assert all(16 < n <= 16 + 8 for n in lengths[:1]) and all(48 < n <= 48 + 8 for n in lengths[1:])
    reuse, cold = df[df["reuse"]], df[~df["reuse"]]
    assert (reuse["cached_tokens"] == reuse["shared_tokens"]).all() and (cold["cached_tokens"] == 0).all()
    assert (df["evaluated_tokens"] == df["prompt_tokens"] - df["cached_tokens"]).all()
    med = tables.prefix_medians(df)
    assert list(med["shared_tokens"]) == [lengths[0]] * 2 + [lengths[1]] * 2 and list(med["reuse"]) == [False, True] * 2
    mem = prefix.memory_table(df, model)
    assert list(mem["tokens"]) == lengths and (mem["formula_bytes"] == 23040 * mem["tokens"]).all()
    ch = prefix.chat(model, engines=["llama.cpp"], turns=2, max_new_tokens=4)
    assert len(ch) == 4
    kept_turn2 = ch[ch["reuse"] & (ch["turn"] == 2)].iloc[0]
    assert kept_turn2["cached_tokens"] > 0
    assert kept_turn2["evaluated_tokens"] == kept_turn2["prompt_tokens"] - kept_turn2["cached_tokens"]
    for fig in (prefix_plots.ttft_vs_shared(df), prefix_plots.chat_turns(ch), prefix_plots.kept_memory(mem)):
        assert len(fig.data) >= 2


@pytest.mark.engine
def test_cli_prefix_prints_ttft_with_and_without_reuse(capsys):
    from lablib.cli import main

    rc = main(
        ["prefix", "--engines", "llama.cpp", "--shared-tokens", "16", "--questions", "1", "--reps", "1"]
        + ["--max-new-tokens", "2", "--turns", "2", "--json"]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["reuse"] for r in rep["shared"]] == [False, True]
    assert rep["shared"][1]["cached_tokens"] == rep["shared"][1]["shared_tokens"] > 16
    assert rep["memory"][0]["formula_bytes"] == 23040 * rep["memory"][0]["tokens"]
    assert [(r["turn"], r["reuse"]) for r in rep["chat"]] == [(1, False), (1, True), (2, False), (2, True)]
