"""Lab 09's prefix reuse on real traffic and multi-turn chats (lablib.studies.scheduler.prefix_reuse,
multi_turn), and the http engine's explicit prompt-cache switches they run on.

By hand first: the engine's request bodies against the scripted SSE server (llama-server's ``cache_prompt``
false unless ``prompt_cache=True``, recorded as the manifest's ``cache_control``; vLLM's ``cache_salt``, one
per request or one for all), how an arm picks its switch from what the server was started with, the bound
``seen_prefix`` on prompts someone can check with a pencil, the by-turn table and the figures.

Then the real servers, asserting counts, never speed:

- llama-server (2 slots, 1 thread, a fresh one per test: its prompt cache in host memory would otherwise
  hold the other test's prompts), a plain trace of four requests with blocks of 16 tokens sent one at a time
  (``concurrency=1``: each finds the one before it finished): with prefix caching off its own counter and
  every response's ``cache_n`` say 0; on, no request is served more from the cache than earlier requests
  held (``seen_prefix_tokens``), the second reuses exactly its two shared blocks (32 tokens, what a perfect
  cache says), the rows' sum is the server's counter, and greedy outputs are the same both ways;
- the same server, one chat of three turns: each later turn finds the whole earlier prompt cached;
- vLLM (the session's server: prefix caching off), a Mooncake slice: the schedule and its lag are
  reported, vLLM got exactly the lab's prompts, their shared blocks are the trace's, and nothing was reused.
"""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.http.engine import SALT_PER_REQUEST
from lablib.errors import LabError
from lablib.measure import replay as R
from lablib.studies import scheduler as S


# --- the engine's switches, on the scripted server ---------------------------------------------------------
def _one(server, model, kind, **kw):
    from sse_server import cmpl, sse

    server.script = [sse(cmpl("a", finish="length")), sse("[DONE]")]
    e = load_engine("http", model, base_url=server.base_url, server=kind, **kw)
    try:
        e.generate([5, 6], GenerationConfig(max_new_tokens=1))
        e.generate([5, 7], GenerationConfig(max_new_tokens=1))
        flag = e.info().flags["cache_control"]
    finally:
        e.close()
    return [b for _, _, b in server.requests[-2:]], flag


def test_llama_servers_prompt_cache_is_off_unless_asked_and_recorded(server, model):
    bodies, flag = _one(server, model, "llama-server")
    assert [b["cache_prompt"] for b in bodies] == [False, False] and flag == "cache_prompt: false"
    bodies, flag = _one(server, model, "llama-server", prompt_cache=True)
    assert [b["cache_prompt"] for b in bodies] == [True, True] and flag == "cache_prompt: true"
    assert all("cache_salt" not in b for b in bodies)
    for kind in ("vllm", "openai"):  # no per-request switch there: refused, not ignored
        with pytest.raises(LabError, match="prompt_cache=True: a .* server has no per-request"):
            load_engine("http", model, base_url=server.base_url, server=kind, prompt_cache=True)
    with pytest.raises(LabError, match="prompt_cache=1: expected True"):
        load_engine("http", model, base_url=server.base_url, server="llama-server", prompt_cache=1)


def test_vllms_cache_salt_one_per_request_or_one_for_all(server, model):
    bodies, flag = _one(server, model, "vllm", cache_salt=SALT_PER_REQUEST)
    salts = [b["cache_salt"] for b in bodies]
    assert len(set(salts)) == 2 and all(s.startswith("lab-") for s in salts) and flag == "cache_salt: per-request"
    bodies, flag = _one(server, model, "vllm", cache_salt="run-7")
    assert [b["cache_salt"] for b in bodies] == ["run-7", "run-7"] and flag == "cache_salt: run-7"
    bodies, flag = _one(server, model, "vllm")
    assert all("cache_salt" not in b and "cache_prompt" not in b for b in bodies) and flag == "none"
    with pytest.raises(LabError, match="vLLM's cache_salt, but"):
        load_engine("http", model, base_url=server.base_url, server="llama-server", cache_salt="x")
    with pytest.raises(LabError, match="without @, / or"):
        load_engine("http", model, base_url=server.base_url, server="vllm", cache_salt="a/b")


def test_an_arm_takes_the_switch_the_server_was_started_with():
    calls = []

    def fake(settings):
        return SimpleNamespace(name="srv", settings=settings, engine=lambda model, **kw: calls.append(kw) or kw)

    assert S._arm_engine(fake({"batch": 2048}), None, "on") == {"prompt_cache": True}  # llama-server: per request
    assert S._arm_engine(fake({}), None, "off") == {"prompt_cache": False}
    on = S._arm_engine(fake({"prefix_caching": True}), None, "on")  # vLLM with its cache on: salts
    assert (
        on["cache_salt"].startswith("lab-run-")
        and on["cache_salt"] != S._arm_engine(fake({"prefix_caching": True}), None, "on")["cache_salt"]
    )  # a new salt per run: a rerun on the same server finds nothing of the last
    assert S._arm_engine(fake({"prefix_caching": True}), None, "off") == {"cache_salt": SALT_PER_REQUEST}
    assert S._arm_engine(fake({"prefix_caching": False}), None, "off") == {}
    with pytest.raises(LabError, match="started with its prefix cache off"):
        S._arm_engine(fake({"prefix_caching": False}), None, "on")
    with pytest.raises(LabError, match="arm 'maybe'"):
        S._arm_engine(fake({}), None, "maybe")


def test_seen_prefix_by_hand():
    prompts = [[1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 3, 4, 7, 8], [5, 6], [1, 2, 3, 4, 7, 8]]
    # sent in the order 0, 1, 2, 3, 4 (t_start), listed out of order; request 0 answered [7, 8]
    rows = [
        {"request_index": 2, "t_submit": 0.0, "t_start": 2.0, "token_ids": [5]},
        {"request_index": 0, "t_submit": 0.0, "t_start": 0.0, "token_ids": [7, 8]},
        {"request_index": 1, "t_submit": 0.0, "t_start": 1.0, "token_ids": None},
        {"request_index": 3, "t_submit": 3.0, "token_ids": [-1]},  # no t_start: when it was due
        {"request_index": 4, "t_submit": 3.5, "token_ids": []},
    ]
    # 2 finds 0's prompt and its answer (6 tokens in common, at most 6 - 1); 1 finds 0's first 3;
    # 3 nothing; 4 is 2 again (at most its length less one)
    assert S.seen_prefix(rows, prompts) == [5, 0, 3, 0, 5]
    assert S.seen_prefix(rows, prompts, block=2) == [4, 0, 2, 0, 4]  # whole blocks of 2
    assert S.seen_prefix(rows, prompts, before=[([5, 6, 6], None)]) == [5, 0, 3, 1, 5]  # a warm-up ahead
    # 0 and 1 sent within a millisecond: the server may take 1 first, and 0, waiting for a slot, then finds 1's
    # first 3 tokens cached (before its own first token at 0.5 s); 3 and 4 came back before 2 was sent
    together = [
        {"request_index": 0, "t_submit": 0.0, "t_start": 0.0, "t_first_token": 0.5, "token_ids": [7, 8]},
        {"request_index": 1, "t_submit": 0.0, "t_start": 0.0004, "t_first_token": 0.3, "token_ids": None},
        {"request_index": 2, "t_submit": 2.0, "t_start": 2.0, "t_first_token": 2.2, "token_ids": [5]},
    ]
    assert S.seen_prefix(together, prompts) == [3, 3, 5]
    assert S.seen_prefix([{**r, "t_first_token": None} for r in together], prompts) == [0, 3, 5]  # no first token


def _turn_rows():
    rows = []
    for arm, cached in (("on", (0, 40, 80)), ("off", (0, 0, 0))):
        for s in (0, 1):
            for t in range(3):
                rows.append(
                    {
                        "prefix_cache": arm,
                        "session": s,
                        "turn": t,
                        "prompt_tokens": 40 * (t + 1),
                        "usage_cached_tokens": cached[t],
                        "seen_prefix_tokens": 40 * t,
                        "ttft_s": 0.1 * (t + 1) * (1 if arm == "off" else 0.5) + 0.01 * s,
                        "error": None,
                    }
                )
    rows[-1]["error"] = "the server closed the connection"
    return pd.DataFrame(rows)


def test_turn_table_and_the_figures_of_hand_made_numbers():
    from lablib import plots

    t = S.turn_table(_turn_rows())
    assert list(zip(t["prefix_cache"], t["turn"])) == [
        ("on", 0),
        ("on", 1),
        ("on", 2),
        ("off", 0),
        ("off", 1),
        ("off", 2),
    ]
    assert t["requests"].tolist() == [2] * 6 and t["errors"].tolist() == [0] * 5 + [1]
    assert t["cached_tokens"].tolist() == [0, 40, 80, 0, 0, 0] and t["prompt_tokens"].tolist() == [40, 80, 120] * 2
    assert t["ttft_p50_s"].round(6).tolist() == [0.055, 0.105, 0.155, 0.105, 0.205, 0.3]  # the failed one left out
    fig = plots.turn_lines(t)
    ttft = [tr for tr in fig.data if tr.name.startswith("TTFT")]
    assert [tr.name for tr in ttft] == ["TTFT, prefix caching on", "TTFT, prefix caching off"]
    assert list(ttft[1].y) == pytest.approx([105, 205, 300]) and ttft[1].line.dash == "dash"
    table = pd.DataFrame(
        [
            {"prefix_cache": a, "prompt_tokens": 200, "reusable_tokens": 50, "seen_prefix_tokens": 60}
            | {"cached_tokens": c, "ttft_p50_s": 0.2, "ttft_p99_s": 0.5}
            for a, c in (("on", 40), ("off", 0))
        ]
    )
    fig = plots.reuse_bars(table)
    bars = fig.data[0]
    assert list(bars.y) == [20.0, 0.0] and list(bars.x) == ["prefix caching on", "prefix caching off"]
    bounds = [tr for tr in fig.data if tr.name.startswith("bound")]
    assert [tr.y[0] for tr in bounds] == [25.0, 30.0]
    with pytest.raises(LabError, match="turn_lines needs the columns turn"):
        plots.turn_lines(table)


# --- real servers -------------------------------------------------------------------------------------------
# Mooncake's format (512-token blocks, ms) at 1/32: blocks of 16 tokens. A; B shares A's first two blocks; C holds
# A's three (A's third only in part: A ends 8 tokens into it); D shares nothing. Prompts 40, 40, 48, 24 tokens, 2 out
TRACE = [
    {"timestamp": 0, "input_length": 1280, "output_length": 64, "hash_ids": [1, 2, 3]},
    {"timestamp": 100, "input_length": 1280, "output_length": 64, "hash_ids": [1, 2, 4]},
    {"timestamp": 200, "input_length": 1536, "output_length": 64, "hash_ids": [1, 2, 3]},
    {"timestamp": 300, "input_length": 768, "output_length": 64, "hash_ids": [5, 6]},
]


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture
def llama_server(model):
    from lablib.engines.servers import start_server

    srv = start_server("llama-server", model, parallel=2, n_ctx=256, threads=1)
    yield srv
    srv.stop()


@pytest.mark.engine
def test_prefix_reuse_on_llama_server_is_bounded_by_what_earlier_requests_held(llama_server, model, tmp_path):
    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in TRACE))
    rows, table = S.prefix_reuse(llama_server, model, trace=path, length_scale=1 / 32, concurrency=1)
    print(table.T.to_string())
    assert len(rows) == 8 and rows["error"].isna().all() and list(table["prefix_cache"]) == ["on", "off"]
    on, off = (rows[rows["prefix_cache"] == a].sort_values("request_index") for a in ("on", "off"))
    # the prompts' structure is the trace's: A and B share two blocks, A and C 40 tokens (A's whole prompt)
    plan = R.scale(R.read_trace(path), length_scale=1 / 32, n_ctx=llama_server.n_ctx)
    assert plan.block_tokens == 16 and [r.prompt_tokens for r in plan.requests] == [40, 40, 48, 24]
    p = R.build_prompts(model, plan)
    assert (_common(p[0], p[1]), _common(p[0], p[2]), _common(p[1], p[2]), _common(p[0], p[3])) == (32, 40, 32, 0)
    assert on["reusable_tokens"].tolist() == [0, 32, 32, 0] == R.perfect_reuse(plan)["per_request"]
    assert (on["usage_prompt_tokens"] == on["prompt_tokens"]).all()  # the server counted the lab's prompts
    # off: nothing from the cache, by the server's own counter and by every response's cache_n
    assert (off["usage_cached_tokens"] == 0).all() and set(off["cache_control"]) == {"cache_prompt: false"}
    t_on, t_off = table.iloc[0], table.iloc[1]
    assert t_off["cached_tokens"] == 0 and t_off["hit_rate"] == 0
    # on: never more than earlier requests held, B exactly its two shared blocks, the rows' sum the counter
    assert set(on["cache_control"]) == {"cache_prompt: true"}
    assert (on["usage_cached_tokens"] <= on["seen_prefix_tokens"]).all() and t_on["cached_above_bound"] == 0
    assert on["usage_cached_tokens"].iloc[1] == 32 == on["seen_prefix_tokens"].iloc[1]
    assert on["usage_cached_tokens"].iloc[3] == 0  # D shares no token with anything before it
    assert t_on["cached_tokens"] == on["usage_cached_tokens"].sum() >= 32
    assert t_on["prompt_tokens"] == 152 and t_on["hit_rate"] == t_on["cached_tokens"] / 152
    assert t_on["perfect_hit_rate"] == 64 / 152 and t_on["cache_block_tokens"] == 1  # token by token
    assert t_on["same_output"] == 4  # greedy: the same ids with and without the cache
    assert (rows["output_tokens"] == 2).all() and t_on["schedule_lag_p99_s"] is not None


@pytest.mark.engine
def test_multi_turn_on_llama_server_each_turn_finds_the_chat_so_far(llama_server, model):
    rows, turns = S.multi_turn(
        llama_server,
        model,
        n_sessions=1,
        turns=3,
        question_tokens=8,
        answer_tokens=4,
        system_tokens=32,
        think_time_s=0.0,
        concurrency=1,  # each turn after the last one's answer
    )
    print(turns.to_string())
    assert len(rows) == 6 and rows["error"].isna().all()
    on, off = (rows[rows["prefix_cache"] == a].sort_values("turn") for a in ("on", "off"))
    assert on["prompt_tokens"].tolist() == [40, 52, 64]  # 32 + 8, then + 4 (the answer's place) + 8 each turn
    assert (off["usage_cached_tokens"] == 0).all()
    got = on["usage_cached_tokens"].tolist()
    assert got[1] >= 40 and got[2] >= 52  # each later turn reuses at least the whole earlier prompt
    assert (on["usage_cached_tokens"] <= on["seen_prefix_tokens"]).all()
    assert list(turns["turn"]) == [0, 1, 2, 0, 1, 2] and turns["cached_tokens"].tolist() == got + [0, 0, 0]
    with pytest.raises(LabError, match="more than the server's 256"):
        S.multi_turn(llama_server, model, n_sessions=1, turns=3, question_tokens=100, answer_tokens=4)


@pytest.mark.engine
def test_a_mooncake_slice_on_vllm_reports_its_lag_and_the_traces_prefixes(vllm_server, model):
    with pytest.raises(LabError, match="prefix cache off: no arm with caching on"):
        S.prefix_reuse(vllm_server, model, count=2, arms=("on", "off"))
    rows, table = S.prefix_reuse(vllm_server, model, start=24, count=4, time_scale=0.1, arms=("off",))
    print(table.T.to_string())
    plan = R.scale(R.read_trace(start=24, count=4), 0.1, 1 / 64, n_ctx=vllm_server.n_ctx)
    assert len(rows) == 4 and rows["error"].isna().all() and list(table["prefix_cache"]) == ["off"]
    rows = rows.sort_values("request_index")
    # the schedule as sent: each row's scheduled time is the plan's, its lag reported (actual = scheduled + lag)
    assert rows["t_scheduled"].tolist() == pytest.approx(plan.schedule())
    assert (rows["schedule_lag_s"] >= 0).all() and table.iloc[0]["schedule_lag_p99_s"] >= 0
    assert table.iloc[0]["kept_up"] in (True, False) and table.iloc[0]["same_output"] is None
    # vLLM got exactly the lab's prompts, whose shared prefixes are the trace's blocks
    assert (rows["usage_prompt_tokens"] == rows["prompt_tokens"]).all()
    assert rows["hash_ids"].tolist() == [list(r.hash_ids) for r in plan.requests]
    prompts = R.build_prompts(model, plan)
    for i in range(4):
        for j in range(i + 1, 4):
            a, b = plan.requests[i].hash_ids, plan.requests[j].hash_ids
            k = _common(a, b)
            assert _common(prompts[i], prompts[j]) == min(k * plan.block_tokens, len(prompts[i]), len(prompts[j]))
    assert rows["reusable_tokens"].tolist() == R.perfect_reuse(plan)["per_request"]
    # its prefix cache is off: nothing reused, by its own counter
    t = table.iloc[0]
    assert t["prefix_caching"] is not None and not t["prefix_caching"]
    assert t["cached_tokens"] == 0 and t["cache_control"] == "none" and t["cache_block_tokens"] == 128
    assert (rows["usage_cached_tokens"] == 0).all()  # each response's usage says so too (prompt_tokens_details)
