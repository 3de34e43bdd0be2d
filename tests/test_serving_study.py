"""Lab 05's study functions (lablib.studies.serving) on the real vLLM: the session's measured server
(``vllm_server`` in conftest.py: prefix caching off) and, in this module, one started with prefix
caching on, in the same configuration (2 sequences of 512 tokens: vLLM's compile cache is reused).
Every number below is the servers' own: TTFTs on the lab's clock, counters from their /metrics. The
module's last tests check lab 10's n-gram speculation on that server (it speculates too), then kill it
mid-stream (serving under faults, on vLLM).
"""

import time

import pytest

from killed_runs import classify, killed_run, port_free
from lablib.engines.servers import VLLM_BLOCK_TOKENS, changed_steps, speculation_options, start_server, vllm_dtype
from lablib.errors import LabError
from lablib.studies import serving
from procs import BOUND_S

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def vllm_cached(vllm_server, model):
    """vLLM with prefix caching on, in the measured server's configuration (started after it: its compile
    cache is written), and n-gram speculation (k=3, lab 10) so that one start serves both subjects: neither
    changes what the other counts (prompt blocks hit; tokens drafted and accepted)."""
    srv = start_server(
        "vllm",
        model,
        parallel=serving.VLLM_PARALLEL,
        n_ctx=serving.VLLM_N_CTX,
        prefix_caching=True,
        options=speculation_options("vllm", "ngram", 3),
        log=print,
    )
    yield srv
    srv.stop()


def test_the_lab_starts_vllm_in_the_test_suites_configuration(vllm_server, model):
    s = vllm_server.settings
    assert (s["max_num_seqs"], s["max_model_len"]) == (serving.VLLM_PARALLEL, serving.VLLM_N_CTX)
    # the session's server started to the end, so the notebook may start its two vLLMs together
    assert serving._vllm_started_before(model, serving.VLLM_PARALLEL, serving.VLLM_N_CTX, vllm_dtype())
    assert not serving._vllm_started_before(model, serving.VLLM_PARALLEL, 12345, vllm_dtype())
    table = serving.servers_table([vllm_server])
    row = table.iloc[0]
    assert row["server"] == "vllm" and row["prefix_caching"] is not None and not row["prefix_caching"]
    assert row["dtype"] == s["dtype"] and row["kv_cache_gib"] == s["kv_cache_space_gib"] >= 1
    assert row["cpus_bound"] == s["cpus_bound"] and row["parallel"] == 2 and row["startup_s"] > 0


def test_prefix_cache_counters_measured_server_none_cached_server_whole_blocks(vllm_server, vllm_cached, model):
    shared, own = 2 * VLLM_BLOCK_TOKENS, 16
    df = serving.prefix_cache_demo(model, [vllm_server, vllm_cached], shared_tokens=shared, own_tokens=own)
    print(df.to_string())
    assert list(df["request"]) == [0, 1, 2] * 2 and list(df["prefix_caching"]) == [False] * 3 + [True] * 3
    assert (df["prompt_tokens"] == shared + own).all() and df["ttft_s"].gt(0).all()
    off, on = df[~df["prefix_caching"].astype(bool)], df[df["prefix_caching"].astype(bool)]
    # the measured server: its own counter says no token came from a cache, for any request
    assert (off["prefix_cache_hits"] == 0).all(), off
    # prefix caching on: the first request finds nothing; the next ones find the shared prefix, in whole
    # 128-token blocks (the question's own 16 tokens fill no block)
    assert on["prefix_cache_hits"].iloc[0] == 0, on
    assert (on["prefix_cache_hits"].iloc[1:] == shared).all(), on
    assert (on["prefix_cache_hits"] % VLLM_BLOCK_TOKENS == 0).all()
    assert (on["prefix_cache_queries"] == shared + own).all(), on  # every prompt token looked up
    # and each response's own usage says the same (--enable-prompt-tokens-details)
    assert df["cached_tokens"].tolist() == df["prefix_cache_hits"].tolist(), df


def test_rate_sweep_samples_vllm_and_one_run_is_the_timeline(vllm_server, model):
    from lablib import plots

    table = serving.rate_sweep_table([vllm_server], model, [8.0], requests=4, prompt_tokens=32, max_new_tokens=8)
    row = table.iloc[0]
    assert row["errors"] == 0 and row["goodput_rps"] >= 0
    # vLLM's own view of the run: at 8 requests/s some were running, and its KV cache held them
    assert 1 <= row["running_max"] <= serving.VLLM_PARALLEL and row["waiting_max"] >= 0
    assert 0 < row["kv_usage_max"] < 1 and row["preemptions"] == 0
    run, samples = serving.one_run(table, "vllm")
    assert len(run) == 4 and set(run["rate"]) == {8.0}
    assert {"running", "waiting", "kv_usage"} <= set(samples["metric"])
    # the samples cover the run, on the lab's clock
    assert samples["t_s"].min() <= run["t_submit"].min() and samples["t_s"].max() >= run["t_last_token"].max()
    fig = plots.server_timeline(run, samples)
    names = {t.name for t in fig.data}
    assert {"running (server)", "waiting (server)", "KV cache used (server, %)"} <= names
    with pytest.raises(LabError, match=r"server='llama-server': this sweep has vllm"):
        serving.one_run(table, "llama-server")
    with pytest.raises(LabError, match=r"rate=1.0: vllm was swept at \[8.0\]"):
        serving.one_run(table, "vllm", rate=1.0)


def test_http_cost_vllm_against_transformers_in_process(vllm_server, model):
    cost = serving.http_cost(model, [vllm_server], prompt_tokens=16, max_new_tokens=4, reps=1)
    row = cost.iloc[0]
    assert row["server"] == "vllm" and row["in_process"] == "transformers" and row["threads"] == vllm_server.threads
    assert row["count_method"] == "token_ids"
    for k in ("ttft_in_process_s", "ttft_http_s", "tpot_in_process_s"):
        assert row[k] > 0, (k, row[k])
    assert row["ttft_added_s"] == pytest.approx(row["ttft_http_s"] - row["ttft_in_process_s"])
    rows = cost.attrs["rows"]
    assert list(rows["where"]) == ["in-process", "http"] and (rows["output_tokens"] == 4).all()
    http = rows[rows["where"] == "http"].iloc[0]
    assert 1 <= http["chunks"] <= 4 and row["tokens_per_chunk_http"] == pytest.approx(4 / http["chunks"])
    # under load vLLM's API process merges the tokens its engine made meanwhile into one event (a CI run
    # here got all 4 in one: TPOT over HTTP 0); the HTTP TPOT is 0 exactly when the whole answer came at once
    assert (row["tpot_http_s"] == 0) == (http["chunks"] == 1), (row["tpot_http_s"], http["chunks"])


def test_start_progress_lines_pass_only_when_the_step_changes():
    seen = []
    say = changed_steps(seen.append, every_s=3600)
    for t, step in ((15, "Loading weights"), (30, "Warming up"), (45, "Warming up"), (60, "Warming up"), (75, "Done")):
        say(f"vllm: starting, {t} s: {step}")
    assert seen == [
        "vllm: starting, 15 s: Loading weights",
        "vllm: starting, 30 s: Warming up",
        "vllm: starting, 75 s: Done",
    ]
    every = []
    say = changed_steps(every.append, every_s=0)  # a minute later the same step passes again
    say("vllm: starting, 15 s: Warming up")
    say("vllm: starting, 75 s: Warming up")
    assert len(every) == 2


def test_a_start_progress_line_names_a_step_not_a_fragment():
    """vLLM's log while it starts, as lab 05 showed it (lines from a real vLLM 0.32 CPU start here): the progress
    line named a warning's source line (``wrapper = lookup(...)``) or one line of a record spread over several
    (``reserved_cpus=[]``), which a learner reads as an error. llama-server's lines keep their step."""
    from lablib.engines.servers.process import _last_step

    vllm_tail = "\n".join(
        [
            "(EngineCore pid=26208) INFO 12-06 22:12:41 [ompmultiprocessing.py:185] OpenMP thread binding info: ",
            "(EngineCore pid=26208) INFO 12-06 22:12:41 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]",
            "(EngineCore pid=26208) INFO 12-06 22:12:41 [ompmultiprocessing.py:185] \treserved_cpus=[]",
            "/x/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated",
            '  wrapper = lookup(vars(value).get("kernel"))',
        ]
    )
    assert _last_step(vllm_tail) == "OpenMP thread binding info:"
    llama_tail = "0.00.003.900 I srv  llama_server: initializing ...\n0.00.005.995 I srv  load_model: loading model"
    assert _last_step(llama_tail) == "0.00.005.995 I srv  load_model: loading model"
    assert _last_step("  only an indented line\n") == "(nothing in its log yet)"


def test_vllm_ngram_speculation_lossless_and_counted(vllm_server, vllm_cached, model):
    """Lab 10 on vLLM: greedy output with n-gram speculation equals the same vLLM's without it, token for
    token, on a repetitive text (prompt lookup finds its continuation); vLLM's own counters say what was drafted
    and accepted, by position, and a verified run arrives in one chunk."""
    from lablib.engines.base import GenerationConfig
    from lablib.engines.http.metrics import speculation_counters
    from lablib.measure.workload import text_ids
    from lablib.studies.decoding import speculative as sp

    ids, cfg = text_ids(model, sp.TEXTS["repetitive"]), GenerationConfig(max_new_tokens=16)
    plain_engine, spec_engine = vllm_server.engine(model), vllm_cached.engine(model)
    try:
        plain = plain_engine.generate(ids, cfg)
        before = speculation_counters(vllm_cached.base_url)
        tr = spec_engine.generate(ids, cfg)
        after = speculation_counters(vllm_cached.base_url)
    finally:
        plain_engine.close()
        spec_engine.close()
    assert tr.token_ids == plain.token_ids and len(tr.token_ids) == 16
    d = sp._metric_delta(before, after)
    assert d["draft_n"] >= d["draft_n_accepted"] > 0
    assert sum(d["accepted_by_position"].values()) == d["draft_n_accepted"]
    assert max(tr.chunk_tokens) > 1  # a verified run arrived in one chunk
    print(f"vLLM ngram k=3: {d}")


def test_vllm_killed_mid_stream_keeps_every_request_and_takes_its_engine_core(vllm_cached, model, tmp_path):
    """Serving under faults (the llama-server half is tests/test_serving_faults.py), on this module's
    prefix-caching vLLM once the tests that measure it are done (last in the module: one vLLM start fewer
    per run): its API server SIGKILLed mid-stream; its EngineCore and worker die by themselves
    (lablib.build.vllm's tie)."""
    out = tmp_path / "vllm-killed.jsonl"
    requests = 12
    srv = vllm_cached
    try:
        members = srv.group_alive()
        assert len(members) > 1, f"vLLM's process group holds only {members}: expected its EngineCore too"
        # 8 clients on 2 sequences: kill 0.4 of a request's e2e after the first pair finished; the rest broke
        # (2 streaming, 6 waiting in vLLM's queue) or were refused (the 2 sent after the kill)
        s, rows, killer, t_return = killed_run(srv, model, out, "closed", requests, 2, 0.4, max_new_tokens=48)
        assert len(rows) == requests
        ok, broken, refused = classify(rows)
        assert len(ok) >= 2 and all(r["output_tokens"] == 48 for r in ok)
        assert len(broken) >= 2 and any(r["output_tokens"] > 0 for r in broken)
        for r in broken:
            assert f"mid-stream after {r['output_tokens']} tokens" in r["error"], r["error"]
        # every request is one of the three kinds; on a loaded machine all 10 unfinished ones may have been sent
        # (and broken) before the kill, so none need be refused (a CI run here had none)
        assert len(ok) + len(broken) + len(refused) == requests
        assert s["errors"] == len(broken) + len(refused) and s["requests"] == requests
        assert t_return - killer.t_kill < 10
        # nothing of vLLM is left: its EngineCore and worker die with the API server, before any stop()
        deadline = time.monotonic() + BOUND_S
        while srv.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = srv.group_alive()
        assert left == [], f"vLLM processes {left} outlived the API server (pid {srv.pid}) {BOUND_S} s"
        print(
            f"vllm (started in {srv.startup_s:.0f} s): {len(ok)} finished, {len(broken)} broken "
            f"(tokens {sorted(r['output_tokens'] for r in broken)}), {len(refused)} refused; "
            f"its group of {len(members)} gone"
        )
    finally:
        srv.stop()
    assert srv.group_alive() == [] and port_free(srv.port)
