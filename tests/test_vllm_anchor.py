"""The anchor of the lab's HTTP client (benchmarks/vllm_anchor.py): both tools send the same prompts, and
vllm bench's saved results read in the lab's names. No server is started: vLLM's own prompts and results
were saved from real runs (tests/data/vllm_random_prompts.json, tests/data/vllm_bench_*.json)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from lablib.cli import main
from lablib.errors import LabError
from lablib.measure.workload import lab_tokenizer, random_prompts
from sse_server import ScriptedServer, cmpl, sse

DATA = Path(__file__).parent / "data"
VLLM_PROMPTS = json.loads((DATA / "vllm_random_prompts.json").read_text())


def _anchor():
    spec = importlib.util.spec_from_file_location(
        "vllm_anchor", Path(__file__).parents[1] / "benchmarks" / "vllm_anchor.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", VLLM_PROMPTS["cases"], ids=lambda c: f"{c['tokens']}x{c['n']}@seed{c['seed']}")
def test_random_prompts_are_what_vllm_bench_sends(model, case):
    """The ids vLLM's RandomDataset (seed, length, count) makes, in its order; their text is its prompt."""
    ids = random_prompts(model, case["tokens"], case["n"], case["seed"])
    assert ids == [p["ids"] for p in case["prompts"]]
    tok = lab_tokenizer(model)
    assert [tok.decode(p) for p in ids] == [p["prompt"] for p in case["prompts"]]
    assert all(len(p) == case["tokens"] for p in ids)  # exact lengths (SmolLM2 adds no special tokens)
    special = set(tok.all_special_ids)
    assert not any(t in special for p in ids for t in p)
    assert all(0 <= t < tok.vocab_size for p in ids for t in p)


def test_random_prompts_are_seeded_and_checked(model):
    a = random_prompts(model, 32, 3, seed=5)
    assert a == random_prompts(model, 32, 3, seed=5)
    assert a != random_prompts(model, 32, 3, seed=6)
    assert len({tuple(p) for p in a}) == 3  # no two alike, no shared first token run
    assert len({p[0] for p in a}) == 3
    for bad in ({"tokens": 0, "n": 1}, {"tokens": 8, "n": 0}, {"tokens": 8, "n": 1, "seed": -1}):
        with pytest.raises(LabError):
            random_prompts(model, **{"seed": 0, **bad})


def test_bench_sends_the_random_prompts(tmp_path, capsys):
    """`lablib bench --prompts random --seed 0`: the measured requests carry vllm bench's prompts of seed 0
    as ids, in its order; the warm-up one of its own."""
    case = next(c for c in VLLM_PROMPTS["cases"] if c["seed"] == 0)
    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "r.jsonl"
    common = ["--base-url", srv.base_url, "--server", "vllm", "--concurrency", "1", "--max-new-tokens", "2"]
    try:
        rc = main(
            ["bench", *common, "--requests", str(case["n"]), "--prompt-tokens", str(case["tokens"])]
            + ["--prompts", "random", "--seed", "0", "--warmup", "1", "--out", str(out)]
        )
        with pytest.raises(SystemExit):  # argparse: one of prose, random
            main(["bench", *common, "--requests", "1", "--prompt-tokens", "8", "--prompts", "dice", "--out", str(out)])
    finally:
        srv.stop()
    assert rc == 0, capsys.readouterr()
    sent = [body["prompt"] for path, _, body in srv.requests if path.endswith("/completions")]
    assert sent[1:] == [p["ids"] for p in case["prompts"]]
    assert sent[0] not in sent[1:] and len(sent[0]) == case["tokens"]


def test_bench_refuses_an_unknown_prompt_kind(tmp_path):
    from lablib.measure.load import bench

    with pytest.raises(LabError, match="prose, random"):
        bench(
            base_url="http://127.0.0.1:9/v1",
            out=tmp_path / "x.jsonl",
            requests=1,
            prompt_tokens=8,
            max_new_tokens=2,
            concurrency=1,
            prompts="dice",
        )


@pytest.mark.parametrize("server", ["llama-server", "vllm"])
def test_anchor_summary_reads_vllm_bench_results(server):
    """A real `vllm bench serve --save-result --save-detailed` result, in the lab's names and seconds; the
    translated figures recomputed here from its per-request lists."""
    doc = json.loads((DATA / f"vllm_bench_{server}.json").read_text())
    res, m = doc["result"], doc["max_new_tokens"]
    s = _anchor().anchor_summary(res, m)
    assert s["requests"] == len(res["ttfts"]) and s["errors"] == 0
    assert s["ttft_p50_s"] == pytest.approx(np.median(res["ttfts"]))
    assert s["ttft_p50_s"] == pytest.approx(res["median_ttft_ms"] / 1e3)
    assert s["itl_p50_s"] == pytest.approx(np.median([g for it in res["itls"] for g in it]))
    tpot = [(lat - t) / (n - 1) for lat, t, n in zip(res["latencies"], res["ttfts"], res["output_lens"])]
    assert s["tpot_p50_s"] == pytest.approx(np.median(tpot))
    assert s["e2e_p50_s"] == pytest.approx(np.median(res["latencies"]))
    assert s["output_tps"] == pytest.approx(res["total_output_tokens"] / res["duration"])
    # vllm's stamps, the lab's definitions: the first M-1 gaps of each request, the M-th token's time
    gaps = [g for it in res["itls"] for g in it[: m - 1]]
    assert s["itl_p50_s@token_chunks"] == pytest.approx(np.median(gaps))
    assert s["tpot_p50_s@last_token"] == pytest.approx(np.median([sum(it[: m - 1]) / (m - 1) for it in res["itls"]]))
    last = max(st + t + sum(it[: m - 1]) for st, t, it in zip(res["start_times"], res["ttfts"], res["itls"]))
    assert s["output_tps@makespan"] == pytest.approx(m * len(res["ttfts"]) / (last - min(res["start_times"])))
    assert s["output_tps@makespan"] > s["output_tps"]  # vllm's duration runs past the last token
    if server == "llama-server":
        # its stream ends with a chunk that has `choices` but no token: one more ITL per request, and
        # no usage read (vllm bench reads usage only from a chunk without `choices`): counts re-tokenized
        assert s["itl_per_request"] == [m]
        assert all(it[-1] < 0.01 for it in res["itls"])
    else:
        assert s["itl_per_request"] == [m - 1] and s["output_tokens_per_request"] == [m]


def test_anchor_runs_the_same_workload(tmp_path):
    """The anchor's command line: the closed loop, the random dataset of the lab's seed and lengths,
    greedy with EOS ignored, the lab's extra body and headers."""
    import argparse

    va = _anchor()
    ns = argparse.Namespace(prompt_tokens=64, max_new_tokens=16, requests=8, concurrency=2, seed=3)
    argv = va.anchor_argv(
        "py",
        root_url="http://h:1",
        model_id="lab-model",
        tokenizer="/hf",
        ns=ns,
        result=tmp_path / "r.json",
        extra={"cache_prompt": False},
        backend="openai",
        headers={"Connection": "close"},
    )

    def arg(flag):
        return argv[argv.index(flag) + 1]

    assert argv[:2] == ["py", "-c"] and "vllm.benchmarks.serve" in argv[2]
    assert (arg("--random-input-len"), arg("--random-output-len"), arg("--num-prompts")) == ("64", "16", "8")
    assert (arg("--max-concurrency"), arg("--request-rate"), arg("--seed")) == ("2", "inf", "3")
    assert (arg("--random-range-ratio"), arg("--random-prefix-len"), arg("--temperature")) == ("0", "0", "0")
    assert "--ignore-eos" in argv and arg("--endpoint") == "/v1/completions" and arg("--base-url") == "http://h:1"
    assert json.loads(arg("--extra-body")) == {"cache_prompt": False} and arg("--header") == "Connection=close"
    assert "--save-detailed" in argv and arg("--result-filename") == str(tmp_path / "r.json")


@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_scripted_server_streams_as_the_server_it_stands_for(model, tmp_path, kind):
    """The anchor's scripted server: the lab reads M one-token chunks in that server's format (its count
    method), never sooner than the script's times."""
    from lablib.measure.load import bench

    va = _anchor()
    out = tmp_path / "s.jsonl"
    with va.ScriptedServer(kind, tmp_path / "s.log") as srv:
        (s,) = bench(
            base_url=srv.base_url,
            out=out,
            requests=4,
            prompt_tokens=16,
            max_new_tokens=4,
            concurrency=2,
            model=model,
            server=srv.kind,
            prompts="random",
            log=lambda m: None,
        )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert s["errors"] == 0 and len(rows) == 4
    assert all(r["output_count_ok"] and r["chunk_tokens"] == [1, 1, 1, 1] for r in rows)
    assert {r["count_method"] for r in rows} == {"token_ids"}
    assert all(r["prefill_s"] >= va.SCRIPTED_TTFT_S for r in rows)
    # the script's times are lower bounds: the last token never comes before TTFT + (M-1) ITL
    assert all(r["t_last_token"] - r["t_start"] >= va.SCRIPTED_TTFT_S + 3 * va.SCRIPTED_ITL_S for r in rows)


def test_together_counts_pairs_sent_and_prefilled_at_once():
    va = _anchor()
    # two pairs sent together (the first prefilled together, the second split), one request alone
    assert va.together([0, 0.001, 1, 1.002, 5], [0.5, 0.5, 1.5, 2.5, 6]) == "1/2"
    assert va.together([0, 1, 2], [0.1, 1.1, 2.1]) == "0/0"
