"""Speculative decoding (lab 10) through each engine's own implementation, on the real model, tiny budgets.

Greedy output with speculation against the same engine's without it, token for token; the engines' own counters
(drafted >= accepted >= 0, prompt lookup accepting tokens of a repetitive prompt; mlx-lm's rounds read from its
tokens' from_draft flags, checked against its own stream_generate responses); Leviathan et al.'s predicted
speedup against hand-computed values; bad input as one LabError. vLLM's n-gram speculation is tested on the
prefix-caching vLLM tests/test_serving_study.py starts anyway (one vLLM start fewer).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from lablib.engines import engine_class, load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.mlx import draft_rounds
from lablib.errors import LabError
from lablib.measure.workload import text_ids
from lablib.studies.decoding import speculative as sp

N = 16  # output tokens per request
CFG = GenerationConfig(max_new_tokens=N)


@pytest.fixture(autouse=True)
def _duration(request):
    t0 = time.perf_counter()
    yield
    print(f"\n{request.node.name}: {time.perf_counter() - t0:.1f} s")


def _ids(model, kind: str) -> list[int]:
    return text_ids(model, sp.TEXTS[kind])


# --- the prediction, by hand ---------------------------------------------------------------------------
def test_predicted_speedup_against_hand_computed_values():
    # alpha 0.8, k 4: (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616 tokens a step; cost 4 x 0.1 + 1 = 1.4
    assert sp.expected_tokens_per_pass(0.8, 4) == pytest.approx(3.3616)
    assert sp.predicted_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)  # 2.4011
    assert sp.predicted_speedup(1.0, 3, 0.0) == 4.0  # every draft accepted, free draft: k + 1
    assert sp.predicted_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)  # nothing accepted, a costly draft: a loss
    assert sp.predicted_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)  # (1 - 0.125) / 0.5 = 1.75
    for bad in ({"alpha": 1.2, "k": 4, "c": 0.1}, {"alpha": 0.5, "k": 0, "c": 0.1}, {"alpha": 0.5, "k": 2, "c": -1}):
        with pytest.raises(LabError):
            sp.predicted_speedup(**bad)


def test_rows_from_counters():
    f = sp.spec_fields({"draft_n": 12, "draft_n_accepted": 9}, output_tokens=16)
    assert f["acceptance"] == 0.75 and f["tokens_per_pass"] == 16 / 7  # 7 passes: each yields one own token
    with pytest.raises(LabError, match="accepted"):
        sp.spec_fields({"draft_n": 3, "draft_n_accepted": 5}, output_tokens=8)
    # vLLM's counts by position: 3 runs; 3 accepted their first token, 2 their second, 0 their third
    runs = sp._runs_from_positions({"drafts": 3, "draft_n": 9, "accepted_by_position": {0: 3, 1: 2, 2: 0}}, 3)
    assert runs == {"accepted_per_pass": [2, 2, 1], "drafted_per_pass": [3, 3, 3]}
    assert sp.arrivals([0.0, 0.0001, 0.0002, 0.05, 0.1, 0.1001]) == (3, 3)
    # mlx-lm's rounds from its from_draft flags: k 3, a budget of 6; 2 accepted then the target's own, then a full
    # run of 3 that ends the budget (no own token); then a request stopped early (EOS) inside its second round
    r = draft_rounds([True, True, False, True, True, True], 3, 6)
    assert (r["drafted_per_pass"], r["accepted_per_pass"], r["target_passes"]) == ([3, 3], [2, 3], 2)
    assert (r["draft_n"], r["draft_n_accepted"]) == (6, 5)
    assert sp.spec_fields(r, 6)["tokens_per_pass"] == 3.0  # 6 tokens, 2 passes (not 6 / (6 - 5): one own token)
    assert draft_rounds([True, False, True], 3, 16)["drafted_per_pass"] == [3, 1]  # the positions it reached
    with pytest.raises(LabError, match="from_draft"):
        draft_rounds([True, True, True, True], 3, 16)  # a full run of 3 and a 4th draft token: not mlx-lm's rounds
    assert sp.first_divergence([1, 2, 3], [1, 2, 3]) is None and sp.first_divergence([1, 2, 3], [1, 5, 3]) == 1


# --- bad input -----------------------------------------------------------------------------------------
def test_bad_input_is_one_clear_error(model, tmp_path):
    import gguf

    for k in (0, -1, "x"):
        with pytest.raises(LabError, match="draft length k"):
            sp.parse_ks([k])
    with pytest.raises(LabError, match="speculative=0"):
        load_engine("llama.cpp", model, n_ctx=256, speculative=0)
    with pytest.raises(LabError, match="no such GGUF"):
        sp.check_draft(model, tmp_path / "missing.gguf")
    # a GGUF whose vocabulary is another model's (32,000 tokens; SmolLM2 has 49,152)
    other = tmp_path / "other-vocab.gguf"
    w = gguf.GGUFWriter(str(other), "llama")
    w.add_vocab_size(32000)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(LabError, match="vocabulary of 32000 tokens, the target's has 49152"):
        sp.check_draft(model, other)
    from lablib.engines.servers import server_command, speculation_options

    with pytest.raises(LabError, match="no such GGUF"):
        server_command("llama-server", model, 8080, options={"draft": str(tmp_path / "missing.gguf")})
    with pytest.raises(LabError, match="runs no 'draft model' speculation"):
        speculation_options("vllm", "draft model", 3)
    with pytest.raises(LabError, match="runs no 'draft model' speculation"):
        engine_class("llama.cpp").speculation_kwargs("draft model", 3)
    with pytest.raises(LabError, match="draft='nope'"):
        load_engine("transformers", model, draft="nope")
    with pytest.raises(LabError, match="draft='nope'"):
        load_engine("mlx", model, draft="nope")
    with pytest.raises(LabError, match="speculative=3 without draft="):
        load_engine("mlx", model, speculative=3)


# --- llama.cpp in-process: llama-cpp-python's prompt lookup ---------------------------------------------------
def test_llamacpp_prompt_lookup_greedy_and_its_counters(model, llama):
    spec = load_engine("llama.cpp", model, n_ctx=512, speculative=4)
    try:
        ids = _ids(model, "repetitive")
        plain, tr = llama.generate(ids, CFG), spec.generate(ids, CFG)
        c = spec.engine_counters()
        assert tr.token_ids == plain.token_ids  # lossless, token for token
        assert c["draft_n"] >= c["draft_n_accepted"] > 0  # the lookup found the repeated lines
        assert sum(c["accepted_per_pass"]) == c["draft_n_accepted"] and len(c["drafted_per_pass"]) == c["target_passes"]
        assert sp.arrivals(tr.t_tokens)[1] > 1  # a verified run came out at once
        assert spec.info().flags["speculative"]["num_pred_tokens"] == 4
        # prose: no repeats to look up; where the output leaves the plain one, the plain engine's own logits show
        # a near tie (llama.cpp's multi-token batch computes logits a few hundredths apart from its one-token
        # decode, and verification always runs a batch)
        ids = _ids(model, "prose")
        plain, tr = llama.generate(ids, CFG), spec.generate(ids, CFG)
        at = sp.first_divergence(plain.token_ids, tr.token_ids)
        print(f"prose: diverged_at={at}, accepted={spec.engine_counters()['draft_n_accepted']}")
        if at is not None:
            row = llama.logits(ids + plain.token_ids[:at])[-1]
            top2 = np.sort(row)[-2:]
            assert {plain.token_ids[at], tr.token_ids[at]} == set(np.argsort(row)[-2:].tolist())
            assert top2[1] - top2[0] < 0.1, f"not a near tie at {at}: margin {top2[1] - top2[0]:.3f} logits"
    finally:
        spec.close()


# --- transformers: prompt lookup and assisted generation ----------------------------------------------------------
def test_transformers_prompt_lookup_and_assisted_generation_lossless(model, hf):
    ids = _ids(model, "repetitive")
    plain = hf.generate(ids, CFG).token_ids
    look = load_engine("transformers", model, prompt_lookup=4)
    try:
        assert look.generate(ids, CFG).token_ids == plain
        c = look.engine_counters()
        assert c["draft_n_accepted"] > 0 and c["target_passes"] < N  # fewer target passes than tokens
        assert "draft_n" not in c  # transformers does not say how many the lookup drafted
    finally:
        look.close()
    asst = load_engine("transformers", model, draft="bfloat16", speculative=3)
    try:
        p = _ids(model, "code")
        assert asst.generate(p, CFG).token_ids == hf.generate(p, CFG).token_ids
        c = asst.engine_counters()
        assert c["draft_n"] >= c["draft_n_accepted"] >= 0
        assert 0 <= sp.spec_fields(c, N)["acceptance"] <= 1
        assert sum(n + 1 for n in c["accepted_per_pass"]) == N  # each pass: accepted drafts + one own token
        assert asst.info().flags["speculative"]["draft_dtype"] == "bfloat16"
    finally:
        asst.close()


# --- llama-server: a draft model (lab 06's Q4_0 rung) ----------------------------------------------------------
def test_llama_server_draft_model_lossless_and_counted(model):
    from lablib.engines.servers import speculation_options, start_server

    ids = _ids(model, "repetitive")
    out = {}
    draft = sp.gguf_file(model, "Q4_0")
    for arm, options in (("plain", None), ("draft", speculation_options("llama-server", "draft model", 4, draft))):
        srv = start_server("llama-server", model, n_ctx=512, options=options)
        try:
            eng = srv.engine(model)
            tr = eng.generate(ids, CFG)
            eng.close()
        finally:
            srv.stop()
        out[arm] = tr
    assert out["draft"].token_ids == out["plain"].token_ids
    t = out["draft"].server_timings
    assert t["draft_n"] >= t["draft_n_accepted"] > 0
    assert "draft_n" not in out["plain"].server_timings
    print(f"llama-server Q4_1 target, Q4_0 draft: drafted {t['draft_n']}, accepted {t['draft_n_accepted']}")


def test_a_draft_loops_logits_that_will_not_fit_are_refused_before_loading(model, monkeypatch):
    """llama-cpp-python keeps n_ctx x vocabulary float32 logits with a draft model: 8192 x 49,152 x 4 bytes = 1.50
    GiB; with 1 GiB available it is refused, naming the n_ctx that fits (0.5 GiB / (49,152 x 4) = 2730)."""
    import lablib.machine

    monkeypatch.setattr(lablib.machine, "available_ram_bytes", lambda: 2**30)
    with pytest.raises(LabError, match=r"n_ctx=8192: .* 1\.50 GiB for 49152 tokens .* use n_ctx=2730 or less"):
        load_engine("llama.cpp", model, n_ctx=8192, speculative=4, threads=1)


# --- mlx-lm: a draft model (the folder's decoder layers quantized to 8 bits by mlx-lm) ------------------------------
def test_mlx_draft_model_lossless_and_counted_from_its_responses(model, mlx):
    from mlx_lm.generate import stream_generate

    k = 3
    spec = load_engine("mlx", model, n_ctx=512, draft="q8", speculative=k)
    try:
        assert spec.info().flags["speculative"]["draft_dtype"] == "8-bit (group 64), float32 head"
        for kind in ("repetitive", "prose"):
            # the repetitive text's first 40 tokens (of 101): the draft's prefill runs MLX's own quantized products,
            # seconds a prompt; the whole prose text (57 tokens), where the draft's 4th round is rejected at k 3
            ids = _ids(model, kind)[: 40 if kind == "repetitive" else None]
            plain, tr = mlx.generate(ids, CFG), spec.generate(ids, CFG)
            c = spec.engine_counters()
            print(f"mlx {kind}: drafted {c['draft_n']}, accepted {c['draft_n_accepted']}, passes {c['target_passes']}")
            assert tr.token_ids == plain.token_ids  # lossless, token for token
            assert c["draft_n"] >= c["draft_n_accepted"] >= 0 and c["n_p_eval"] == len(ids)
            assert c["draft_n_accepted"] == sum(c["from_draft"]) == sum(c["accepted_per_pass"])
            assert len(c["drafted_per_pass"]) == c["target_passes"] and max(c["drafted_per_pass"]) <= k
            # each pass: its accepted run, then one token of the target's own (the last may end at the budget)
            assert c["target_passes"] - 1 <= N - c["draft_n_accepted"] <= c["target_passes"]
            assert 1 <= sp.spec_fields(c, N)["tokens_per_pass"] == N / c["target_passes"] <= k + 1
            if c["draft_n_accepted"]:
                assert sp.arrivals(tr.t_tokens)[1] > 1  # a verified run came out at once
        assert c["draft_n_accepted"] < c["draft_n"]  # prose: a round with a rejected draft, and still lossless
        # mlx-lm's own responses (the last request's prompt) mark the tokens that came from the draft: the same
        # tokens, flagged as the engine read them (so its accepted count is theirs)
        out = list(
            stream_generate(
                spec.mlx_model, spec.tok, ids, max_tokens=N, draft_model=spec._spec["draft_model"], num_draft_tokens=k
            )
        )
        assert [r.token for r in out] == tr.token_ids
        assert [r.from_draft for r in out] == c["from_draft"]
        with pytest.raises(LabError, match="greedy"):
            spec.generate(ids, GenerationConfig(max_new_tokens=2, temperature=0.7))
        with pytest.raises(LabError, match="one sequence"):
            spec.batch_session(CFG, 2, 128)
    finally:
        spec.close()
