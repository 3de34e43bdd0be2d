"""The trace replayer (lablib.measure.replay, `lablib replay`): both trace formats, the scaling arithmetic,
the shared-prefix structure of the built prompts on the shipped Mooncake slice (checked against the trace's
own hash ids), what a perfect prefix cache could reuse, the generators, and a short real replay on
llama-server (rows, scheduled and actual send times, lag, output lengths as scaled)."""

import json
import math
import re

import pytest

from lablib.errors import LabError
from lablib.measure import replay as R
from lablib.measure.workload import corpus_ids
from lablib.results.schema import COLUMNS

SLICE = R.default_trace_path()


def common_blocks(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def write(path, text):
    path.write_text(text)
    return path


# --- reading ----------------------------------------------------------------------------------------
def test_the_shipped_mooncake_slice_reads_as_the_trace_says():
    raw = [json.loads(line) for line in SLICE.read_text().splitlines()]
    t = R.read_trace()
    assert t.format == "mooncake" and t.block_tokens == 512 and t.count == len(raw) == 1000
    assert len(t.sha256) == 64 and t.start == 0
    for r, rec in zip(t.requests, raw):  # the file is in arrival order: the same order, seconds from ms
        assert r.arrival_s == rec["timestamp"] / 1000
        assert (r.prompt_tokens, r.output_tokens, r.hash_ids) == (
            rec["input_length"],
            rec["output_length"],
            tuple(rec["hash_ids"]),
        )
        assert len(r.hash_ids) == math.ceil(r.prompt_tokens / 512)  # one id per 512-token block
    assert (SLICE.parent / "LICENSE-APACHE-mooncake").is_file()
    assert "kvcache-ai/Mooncake" in (SLICE.parent / "README.md").read_text()
    part = R.read_trace(start=24, count=6)
    assert [r.index for r in part.requests] == list(range(24, 30)) and part.requests == t.requests[24:30]


def test_plain_csv_and_jsonl_read_the_same(tmp_path):
    csv_path = write(
        tmp_path / "t.csv",
        "arrival_s,prompt_tokens,output_tokens,prefix_blocks\n0.5,100,10,7 8 9\n0,20,3,\n0.5,64,4,7\n",
    )
    lines = [
        {"arrival_s": 0.5, "prompt_tokens": 100, "output_tokens": 10, "prefix_blocks": [7, 8, 9]},
        {"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 3},
        {"arrival_s": 0.5, "prompt_tokens": 64, "output_tokens": 4, "prefix_blocks": [7], "session": 2, "turn": 1},
    ]
    jsonl = write(tmp_path / "t.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    a, b = R.read_trace(csv_path, block_tokens=64), R.read_trace(jsonl, block_tokens=64)
    assert a.format == b.format == "plain" and a.block_tokens == 64
    # arrival order, ties in file order
    assert [r.index for r in a.requests] == [r.index for r in b.requests] == [1, 0, 2]
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in a.requests] == [
        (0.0, 20, 3, ()),
        (0.5, 100, 10, (7, 8, 9)),
        (0.5, 64, 4, (7,)),
    ]
    assert [(r.session, r.turn) for r in b.requests] == [(None, None), (None, None), (2, 1)]
    assert R.read_trace(jsonl).block_tokens == 512  # the plain format's default, as Mooncake's


@pytest.mark.parametrize(
    "text, suffix, msg",
    [
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
            '{"timestamp": 3, "input_length": 5, "hash_ids": [0]}\n',
            ".jsonl",
            r"t\.jsonl:2: no output_length",
        ),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}\n', ".jsonl", "input_length=0"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n', ".jsonl", "timestamp=-1"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n', ".jsonl", "hash_ids"),
        ('{"arrival": 0}\n', ".jsonl", "cannot tell the trace format"),
        ("time,prompt\n0,5\n", ".csv", "expected a header row with arrival_s"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5,\n", ".csv", r"t\.csv:2: no output_tokens"),
        ("", ".jsonl", "is empty"),
    ],
)
def test_a_bad_trace_file_names_the_line_and_field(tmp_path, text, suffix, msg):
    with pytest.raises(LabError, match=msg):
        R.read_trace(write(tmp_path / f"t{suffix}", text))


def test_a_slice_outside_the_file_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(LabError, match=r"start=1000: the trace .* has 1000 requests"):
        R.read_trace(start=1000)
    with pytest.raises(LabError, match="count=0"):
        R.read_trace(count=0)
    with pytest.raises(LabError, match="not found"):
        R.read_trace(tmp_path / "none.jsonl")
    with pytest.raises(LabError, match="blocks are 512 tokens"):
        R.read_trace(block_tokens=16)


# --- scaling ---------------------------------------------------------------------------------------
def test_scaling_arithmetic_caps_prompts_at_the_context_and_records_the_factors(tmp_path):
    recs = [
        {"timestamp": 10_000, "input_length": 1000, "output_length": 100, "hash_ids": [0, 1]},
        {"timestamp": 14_000, "input_length": 2000, "output_length": 20, "hash_ids": [0, 2, 3, 4]},
        {"timestamp": 30_000, "input_length": 512, "output_length": 1, "hash_ids": [5]},
    ]
    t = R.read_trace(write(tmp_path / "m.jsonl", "".join(json.dumps(x) + "\n" for x in recs)))
    p = R.scale(t, time_scale=0.5, length_scale=1 / 32, n_ctx=40)
    assert [r.t_s for r in p.requests] == [0.0, 2.0, 10.0]  # (arrival - first) x 0.5
    # outputs: round(100/32) = 3, round(20/32) = 1, round(1/32) -> at least 1
    assert p.max_new_tokens() == [3, 1, 1]
    # prompts: ceil(1000/32) = 32; ceil(2000/32) = 63 -> cut to 40 - 1; 512/32 = 16
    assert [r.prompt_tokens for r in p.requests] == [32, 39, 16]
    assert [r.capped for r in p.requests] == [False, True, False]
    # blocks of 512/32 = 16 tokens: the ids each prompt reaches
    assert [r.hash_ids for r in p.requests] == [(0, 1), (0, 2, 3), (5,)]
    assert p.factors == {
        "time_scale": 0.5,
        "length_scale": 1 / 32,
        "output_scale": 1 / 32,
        "block_tokens": 16,
        "block_tokens_exact": 16.0,
        "trace_block_tokens": 512,
        "n_ctx": 40,
        "capped": 1,
    }
    assert p.labels() == {
        "trace_file": "m.jsonl",
        "time_scale": 0.5,
        "length_scale": 1 / 32,
        "output_scale": 1 / 32,
        "block_tokens": 16,
    }
    w = p.workload()
    assert w["arrival"] == "schedule" and w["replay"]["capped"] == 1 and w["replay"]["trace"]["sha256"] == t.sha256
    q = R.scale(t, length_scale=0.1, output_scale=0.5, block_tokens=40)
    assert [r.prompt_tokens for r in q.requests] == [100, 200, 52] and q.max_new_tokens() == [50, 10, 1]
    assert q.block_tokens == 40 and q.factors["block_tokens_exact"] == pytest.approx(51.2)
    assert [r.hash_ids for r in q.requests] == [(0, 1), (0, 2, 3, 4), (5,)]


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"length_scale": 1 / 1024}, "makes a 512-token block 0.5 tokens"),
        ({"length_scale": 0}, "length_scale=0"),
        ({"time_scale": -1}, "time_scale=-1"),
        ({"output_scale": math.nan}, "output_scale=nan"),
        ({"length_scale": 1 / 32, "n_ctx": 16}, "fills the context of 16 tokens, leaving no room for a prompt"),
        ({"block_tokens": 0}, "block_tokens=0"),
    ],
)
def test_scaling_refuses_factors_that_empty_a_prompt_or_a_block(kw, msg):
    with pytest.raises(LabError, match=msg):
        R.scale(R.read_trace(count=5), **kw)


# --- prompts -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slice_plan():
    """The first 200 requests of the shipped slice at 1/32 (blocks of 16 tokens), cut to 1024 tokens."""
    return R.scale(R.read_trace(count=200), time_scale=0.01, length_scale=1 / 32, n_ctx=1024)


def test_prompts_sharing_k_hash_ids_share_exactly_k_blocks_of_tokens(model, slice_plan):
    plan = slice_plan
    prompts = R.build_prompts(model, plan)
    bt = plan.block_tokens
    raw = R.read_trace(count=200).requests  # the trace's own ids, not the replay's
    assert [len(p) for p in prompts] == [r.prompt_tokens for r in plan.requests]
    assert sum(r.capped for r in plan.requests) > 0  # some prompts are cut to the context
    pairs = {"shared": 0, "longer": 0}
    for i in range(len(prompts)):
        for j in range(i + 1, len(prompts)):
            a, b = prompts[i], prompts[j]
            k = common_blocks(raw[i].hash_ids, raw[j].hash_ids)
            lcp = common_blocks(a, b)
            assert lcp == min(k * bt, len(a), len(b)), (i, j, k)
            if len(a) > k * bt and len(b) > k * bt:  # both go on: they differ right after the shared blocks
                assert lcp == k * bt and a[k * bt] != b[k * bt]
                pairs["longer"] += 1
            pairs["shared"] += k > 1
    assert pairs["shared"] > 0 and pairs["longer"] > 0  # the slice has prefixes shared beyond block 0


def test_each_block_id_is_one_cut_of_real_text(model, slice_plan):
    prompts = R.build_prompts(model, slice_plan)
    bt = slice_plan.block_tokens
    text = corpus_ids(model)
    wrapped = list(text) + list(text[:bt])
    starts = {}
    for ids in range(len(text)):
        starts.setdefault(tuple(wrapped[ids : ids + bt]), ids)
    seen = {}
    for p, r in zip(prompts, slice_plan.requests):
        for j, h in enumerate(r.hash_ids):
            block = tuple(p[j * bt : (j + 1) * bt])
            if len(block) == bt:
                assert block in starts  # consecutive corpus tokens (wrapping)
                assert seen.setdefault(h, block) == block  # the same tokens wherever the id appears
    assert len(seen) > 100


def test_perfect_reuse_of_a_small_structure_by_hand(tmp_path):
    lines = [
        {"arrival_s": 0, "prompt_tokens": 48, "output_tokens": 1, "prefix_blocks": [1, 2, 3]},
        {"arrival_s": 1, "prompt_tokens": 40, "output_tokens": 1, "prefix_blocks": [1, 2, 4]},
        {"arrival_s": 2, "prompt_tokens": 40, "output_tokens": 1, "prefix_blocks": [1, 2, 3]},
        {"arrival_s": 3, "prompt_tokens": 16, "output_tokens": 1, "prefix_blocks": [5]},
        {"arrival_s": 4, "prompt_tokens": 48, "output_tokens": 1, "prefix_blocks": [1, 2, 3]},
    ]
    t = R.read_trace(write(tmp_path / "p.jsonl", "".join(json.dumps(x) + "\n" for x in lines)), block_tokens=16)
    u = R.perfect_reuse(R.scale(t))
    # A: cold; B: blocks 1, 2; C: 1, 2 (its block 3 is partial); D: cold; E: 1, 2, 3 (A held 3 whole)
    assert u["per_request"] == [0, 32, 32, 0, 48]
    assert u["prompt_tokens"] == 192 and u["reusable_tokens"] == 112 and u["hit_fraction"] == 112 / 192


def test_perfect_reuse_on_the_slice_equals_a_set_of_seen_prefixes(slice_plan):
    bt = slice_plan.block_tokens
    seen, expect = set(), []
    for r in slice_plan.requests:
        full = r.hash_ids[: r.prompt_tokens // bt]
        k = max((n for n in range(len(full) + 1) if full[:n] in seen), default=0)
        expect.append(k * bt)
        seen.update(full[:n] for n in range(1, len(full) + 1))
    u = R.perfect_reuse(slice_plan)
    assert u["per_request"] == expect and 0 < u["hit_fraction"] < 1
    assert u["prompt_tokens"] == sum(r.prompt_tokens for r in slice_plan.requests)


# --- generators ----------------------------------------------------------------------------------
def test_sessions_grow_by_answer_and_question_and_share_their_own_blocks(model):
    t = R.sessions(
        3,
        3,
        question_tokens=R.uniform(5, 20),
        answer_tokens=7,
        think_time_s=2.0,
        rate=1.0,
        system_tokens=40,
        block_tokens=16,
        seed=3,
    )
    assert t.count == 9 and [r.index for r in t.requests] == list(range(9))
    assert [r.arrival_s for r in t.requests] == sorted(r.arrival_s for r in t.requests)
    by = {(r.session, r.turn): r for r in t.requests}
    plan = R.scale(t)
    prompts = dict(zip(((r.session, r.turn) for r in t.requests), R.build_prompts(model, plan)))
    for s in range(3):
        first = by[s, 0]
        assert first.hash_ids[:2] == (0, 1)  # the system prompt's two whole blocks, every session's
        assert 40 + 5 <= first.prompt_tokens <= 40 + 20
        for turn in (1, 2):
            prev, cur = by[s, turn - 1], by[s, turn]
            assert cur.arrival_s == pytest.approx(prev.arrival_s + 2.0)
            assert 7 + 5 <= cur.prompt_tokens - prev.prompt_tokens <= 7 + 20  # the answer, then a question
            assert cur.output_tokens == 7
            assert cur.hash_ids[: len(prev.hash_ids)] == prev.hash_ids
            assert prompts[s, turn][: prev.prompt_tokens] == prompts[s, turn - 1]  # the whole chat so far
    others = [set(by[s, 2].hash_ids[2:]) for s in range(3)]
    assert not (others[0] & others[1]) and not (others[1] & others[2])  # sessions share the system blocks only
    lcp = common_blocks(prompts[0, 0], prompts[1, 0])
    assert lcp == 32  # two whole blocks; the system prompt's last 8 tokens are in each session's own block


def test_length_distributions_and_the_lognormal_fit():
    import numpy as np

    assert R.fixed(12).sample(4) == [12] * 4
    u = R.uniform(3, 9).sample(500, seed=1)
    assert min(u) == 3 and max(u) == 9 and u == R.uniform(3, 9).sample(500, seed=1)
    lengths = [r.prompt_tokens for r in R.read_trace().requests]
    fit = R.fit_lognormal(lengths)
    logs = np.log(lengths)
    assert fit.kind == "lognormal" and fit.a == pytest.approx(logs.mean()) and fit.b == pytest.approx(logs.std())
    assert (fit.lo, fit.hi) == (min(lengths), max(lengths))
    x = fit.sample(2000, seed=0)
    assert min(x) >= fit.lo and max(x) <= fit.hi
    syn = R.synthetic(20, fit, R.fixed(5), rate=4.0, arrival="constant", seed=2)
    assert [r.arrival_s for r in syn.requests] == pytest.approx([i * 0.25 for i in range(20)])
    assert [r.prompt_tokens for r in syn.requests] == fit.sample(20, seed=2) and syn.block_tokens is None
    with pytest.raises(LabError, match="uniform 9 .. 3"):
        R.LengthDist("uniform", 9, 3)
    with pytest.raises(LabError, match="length distribution 'zipf'"):
        R.LengthDist("zipf", 1)


def test_synthetic_prompts_share_no_prefix(model):
    plan = R.scale(R.synthetic(30, R.uniform(4, 40), 2, rate=10.0, seed=5))
    prompts = R.build_prompts(model, plan)
    assert [len(p) for p in prompts] == [r.prompt_tokens for r in plan.requests]
    assert len({p[0] for p in prompts}) == 30  # each starts with its own token: no two share even one
    assert R.perfect_reuse(plan)["reusable_tokens"] == 0


# --- a real replay ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_server(model):
    from lablib.engines.servers import start_server

    srv = start_server("llama-server", model, parallel=2, threads=1, n_ctx=512, timeout_s=900)
    yield srv
    srv.stop()


@pytest.mark.engine
def test_a_short_replay_on_llama_server(llama_server, model):
    # requests 24..29 of the slice: two at 3 s, three at 6 s, one at 9 s; ten times faster, lengths / 64
    trace = R.read_trace(start=24, count=6)
    e = llama_server.engine(model)
    try:
        plan = R.scale(trace, time_scale=0.1, length_scale=1 / 64, n_ctx=e.n_ctx)
        seen = []
        rows = R.replay(e, plan, on_row=seen.append, max_duration_s=120)
        with pytest.raises(LabError, match="send time 1"):
            from lablib.measure.load import run_load

            run_load(e, [[1, 2]] * 2, "open", schedule=[1.0, 0.5])
    finally:
        e.close()
    assert len(rows) == 6 and seen == rows and [r["error"] for r in rows] == [None] * 6
    by = {r["trace_index"]: r for r in rows}
    assert sorted(by) == list(range(24, 30))
    for r, req in ((by[q.trace_index], q) for q in plan.requests):
        assert r["t_scheduled"] == pytest.approx(req.t_s)  # scheduled, seconds after the start
        assert r["schedule_lag_s"] >= 0  # actual send = t_scheduled + schedule_lag_s
        assert r["arrival"] == "schedule" and r["rate"] is None and r["mode"] == "open"
        assert r["max_new_tokens"] == req.max_new_tokens == max(1, math.floor(req.trace_output_tokens / 64 + 0.5))
        assert r["output_tokens"] == req.max_new_tokens  # EOS ignored: exactly the scaled output length
        room = plan.factors["n_ctx"] - req.max_new_tokens  # the server's context less the output
        assert r["prompt_tokens"] == req.prompt_tokens == min(math.ceil(req.trace_prompt_tokens / 64), room)
        assert r["hash_ids"] == list(req.hash_ids) and r["prefix_blocks"] == len(req.hash_ids)
        assert (r["time_scale"], r["length_scale"], r["block_tokens"]) == (0.1, 1 / 64, 8)
        assert r["trace_file"] == SLICE.name and r["server"] == "llama-server"
        assert set(r) <= set(COLUMNS) | set(R.ROW_COLUMNS)
    assert [by[i]["t_scheduled"] for i in (24, 26, 29)] == pytest.approx([0.0, 0.2999, 0.6])
    assert plan.factors["n_ctx"] == 512 and [q.capped for q in plan.requests] == [False, True] + [False] * 4
    s = R.replay_summary(rows, plan)
    assert s["requests"] == s["scheduled"] == 6 and s["not_sent"] == 0 and s["errors"] == 0
    assert s["schedule_lag_p99_s"] >= s["schedule_lag_p50_s"] >= 0
    assert s["kept_up"] == (s["schedule_lag_p99_s"] <= R.MAX_LAG_S) and s["output_count_ok"] is True
    assert s["output_tokens"] == sum(plan.max_new_tokens()) and s["length_scale"] == 1 / 64
    print(
        f"replay on llama-server: lag p50 {s['schedule_lag_p50_s'] * 1e3:.2f} ms, p99 {s['schedule_lag_p99_s'] * 1e3:.2f} ms"
    )


@pytest.mark.engine
def test_lablib_replay_writes_rows_and_prints_the_lag(llama_server, tmp_path, capsys):
    from lablib.cli import main
    from lablib.results.store import load_results

    out = tmp_path / "replay.jsonl"
    argv = ["replay", "--base-url", llama_server.base_url, "--start", "26", "--count", "3", "--time-scale", "0.1"]
    argv += ["--length-scale", "0.015625", "--max-concurrency", "2", "--warmup", "0", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("replay "))
    assert "requests=3/3" in line and "lag_p99_ms=" in line and "kept_up=" in line and "block_tokens=8" in line
    lag = re.search(r"client_lag_p99_ms=(\S+)", line).group(1)  # the client's headroom, measured in the run
    assert float(lag) >= 0, line
    df = load_results(out)
    assert len(df) == 3 and sorted(df["trace_index"]) == [26, 27, 28]
    assert (df["output_tokens"] == df["max_new_tokens"]).all() and df["schedule_lag_s"].notna().all()
    assert main(["replay", "--base-url", llama_server.base_url, "--length-scale", "0", "--out", str(out)]) == 2
    assert "lablib: --length-scale 0.0: expected a finite number above 0" in capsys.readouterr().err


_REPLAY = """\
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (CI) inherits it ignored
from lablib.cli import main
sys.exit(main(["replay", "--server", "llama-server", "--threads", "1", "--n-ctx", "512", "--parallel", "2",
               "--start", "20", "--count", "12", "--time-scale", "0.1", "--length-scale", "0.004",
               "--output-scale", "0.004", "--warmup", "0", "--out", sys.argv[1]]))
"""


@pytest.mark.engine
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT and SIGTERM at once"])
def test_replay_on_a_server_it_started_stopped_by_sigterm_or_two_signals(tmp_path, sent):
    """`lablib replay --server NAME` had no SIGTERM handler (bench and serve have): a SIGTERM (a workshop's `kill`, a
    container's stop) killed the lab outright, with no word, its server left to its death signal (llama-server
    killed, unreaped; vLLM's workers to themselves): a fuzz, 14 in 28 tries. A second signal right after Ctrl-C broke
    the writing of the rows in flight ("RuntimeError: release unlocked lock", exit 1; 1 in 28). Now either way: one
    line naming what came, the rows on disk, the server stopped and reaped by the lab. Both signals pending at once
    are sent while the lab is stopped (SIGSTOP), then SIGCONT."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    out = tmp_path / "replay.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLAY, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while (
            not (out.exists() and out.read_text().count("\n")) and time.monotonic() < deadline and proc.poll() is None
        ):
            time.sleep(0.01)
        assert out.exists(), f"replay wrote no row: {proc.communicate(timeout=30)}"
        server = next(c for c in psutil.Process(proc.pid).children() if "llama-server" in (c.cmdline() or [""])[0])
        signals = ["SIGTERM"] if sent == "SIGTERM" else ["SIGSTOP", "SIGINT", "SIGTERM", "SIGCONT"]
        for name in signals:
            os.kill(proc.pid, getattr(signal, name))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first, code = ("SIGTERM", 143) if sent == "SIGTERM" else ("Ctrl-C", 130)  # SIGINT's handler runs first
    assert "Traceback" not in err and proc.returncode == code, (proc.returncode, err)
    assert err.splitlines()[-1] == f"lablib replay: interrupted ({first}); the rows written before it are in {out}"
    assert all(json.loads(line) for line in out.read_text().splitlines())
    assert not server.is_running()  # stopped and reaped by the lab: not even a zombie


def test_a_replay_whose_client_was_near_its_limit_says_so():
    from lablib.measure.replay import lag_warning

    calm = {"kept_up": True, "not_sent": 0, "client_headroom": {"near_limit": False, "loop_lag_p99_s": 0.0004}}
    assert lag_warning(calm) is None
    busy = dict(calm, client_headroom={"near_limit": True, "loop_lag_p99_s": 0.0125})
    assert lag_warning(busy).startswith("the lab's client was near its own limit") and "12.5 ms at p99" in lag_warning(
        busy
    )
