"""Lab 11's study (lablib.studies.adapters) end to end on real engines and a real llama-server: the arms and what
their rows say, the cost and multi-LoRA tables, the figures drawn from them, `lablib lora`, and the adapter's size
from the model's shape against the adapter the lab made. Small budgets (8-token answers, one request per arm):
what is checked is what the rows and tables state, never a timing."""

import subprocess
import sys

import pytest

from lablib.studies import adapters as ad
from lablib.studies.compare import NEAR_TIE_NATS

N_OUT = 8
SMALL = {"prompt_tokens": 16, "max_new_tokens": N_OUT}


@pytest.fixture(scope="module")
def llama_rows(model):
    return ad.in_process_rows("llama.cpp", model, ranks=(8,), reps=1, log=lambda m: None, **SMALL)


def test_size_from_the_shape_equals_the_adapter_made(model):
    """r * (in + out) summed over q, k, v, o, gate, up, down of 30 layers: what make_adapter counted in the
    PEFT weights it saved, and 4 bytes each in float32 (the llama.cpp engine holds exactly that, test_adapters)."""
    from lablib.model.adapters import make_adapter

    r8 = make_adapter(model, rank=8, log=lambda *_: None)
    (row,) = ad.size_table(model, ranks=(8,))
    assert row["adapter_parameters"] == r8.parameters == 8 * 30 * (1152 + 768 + 768 + 1152 + 3 * 2112)
    assert row["bytes_f32"] == 4 * r8.parameters
    assert 0 < row["flops_share"] < row["parameter_share"] * 2


def test_in_process_arms_say_the_adapter_moved_the_output_and_merged_agrees(llama_rows):
    """One row per arm (none, r8 unmerged, r8 merged): the unmerged and merged outputs differ from the no-adapter
    output (adapter_diverged_at is a position), merged equals unmerged or parts at a near tie, the adapter's bytes
    are 4 per parameter unmerged and llama-export-lora's F16 growth merged."""
    by_arm = {r["adapter_arm"]: r for r in llama_rows}
    assert list(by_arm) == ["none", "unmerged", "merged"]
    assert all(r["engine"] == "llama.cpp" and r["output_tokens"] == N_OUT for r in llama_rows)
    none, unmerged, merged = by_arm["none"], by_arm["unmerged"], by_arm["merged"]
    assert none["adapter"] is None and none["adapter_bytes"] == 0 and "adapter_diverged_at" not in none
    assert unmerged["adapter"] == merged["adapter"] == "r8" and unmerged["adapter_rank"] == 8
    assert 0 <= unmerged["adapter_diverged_at"] < N_OUT and 0 <= merged["adapter_diverged_at"] < N_OUT
    assert unmerged["adapter_bytes"] == 4 * unmerged["adapter_parameters"]
    assert unmerged["adapter_load_s"] > 0 and merged["adapter_load_s"] is None
    assert merged["adapter_bytes"] > unmerged["adapter_bytes"]  # merged tensors F16 where the base is Q4_1
    if merged["merged_diverged_at"] is not None:
        assert merged["merged_margin_nats"] < NEAR_TIE_NATS


def test_cost_table_and_its_figures(llama_rows):
    table = ad.cost_table(llama_rows)
    assert [(r["adapter_rank"], r["adapter_arm"]) for r in table] == [(None, "none"), (8, "unmerged"), (8, "merged")]
    none, unmerged, merged = table
    assert none["tpot_vs_none"] == 1.0 and none["changed"] is None and none["same_as_unmerged"] is None
    assert unmerged["changed"] is True and merged["changed"] is True
    assert merged["same_as_unmerged"] in ("yes", "near tie")
    assert unmerged["tpot_vs_none"] == pytest.approx(unmerged["tpot_s"] / none["tpot_s"])
    text = ad.format_cost_table(table)
    assert text.splitlines()[2].startswith("llama.cpp") and "unmerged" in text
    from lablib import plots

    fig = plots.adapter_cost_bars(table)
    (bars,) = fig.data
    assert bars.name == "llama.cpp" and list(bars.x) == ["no adapter", "rank 8 unmerged", "rank 8 merged"]
    assert list(bars.marker.pattern.shape) == ["", "/", "."]
    assert bars.y[1] == pytest.approx(unmerged["tpot_s"] * 1e3)


def test_an_engine_without_adapters_is_refused_before_loading(model):
    from lablib.errors import LabError

    with pytest.raises(LabError, match="openvino loads no LoRA adapter in the lab; expected one of transformers"):
        ad.in_process_rows("openvino", model, log=lambda m: None)


def test_multi_lora_on_llama_server(model):
    """llama-server with two rank-8 adapters: each adapter's first and second request, then two clients with no
    adapter, the same adapter and distinct adapters: every request answered, each row names the adapter it asked
    for (the distinct loop's requests in flight use both), and the table has a row per mix with a throughput."""
    rows = ad.multi_lora_rows(
        "llama-server", model, concurrency=(2,), requests_per_client=1, log=lambda m: None, **SMALL
    )
    assert not [r["error"] for r in rows if r.get("error")]
    mixes = {m: [r for r in rows if r["adapter_mix"] == m] for m in ad.MIXES}
    assert [r["adapter"] for r in mixes["first use"]] == ["r8", "r8", "r8-s1", "r8-s1"]
    assert {r["adapter"] for r in mixes["none"]} == {None}
    assert {r["adapter"] for r in mixes["same"]} == {"r8"}
    assert sorted(r["adapter"] for r in mixes["distinct"]) == ["r8", "r8-s1"]
    assert all(r["output_tokens"] == N_OUT and r["adapters_loaded"] == 2 for r in rows)
    table = ad.multi_table(rows)
    loops = {r["adapter_mix"]: r for r in table if r["adapter_mix"] != "first use"}
    assert set(loops) == {"none", "same", "distinct"} and all(r["output_tps"] > 0 for r in loops.values())
    assert loops["none"]["tput_vs_none"] == 1.0
    (first,) = [r for r in table if r["adapter_mix"] == "first use"]
    assert first["ttft_first_s"] > 0 and first["ttft_second_s"] > 0
    from lablib import plots

    fig = plots.multi_lora_lines(table)
    assert {t.name: t.line.dash for t in fig.data} == {
        "llama-server, no adapter": "dot",
        "llama-server, same adapter": "dash",
        "llama-server, distinct adapters": "solid",
    }


def test_lablib_lora_prints_the_cost_table(tmp_path):
    out = tmp_path / "lora.jsonl"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lablib.cli",
            "lora",
            "--engines",
            "llama.cpp",
            "--servers",
            "",
            "--ranks",
            "8",
            "--reps",
            "1",
            "--prompt-tokens",
            "16",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if not ln.startswith("#")]
    assert lines[0].split()[:3] == ["engine", "rank", "arm"]
    assert [ln.split()[:3] for ln in lines[1:4]] == [
        ["llama.cpp", "-", "none"],
        ["llama.cpp", "8", "unmerged"],
        ["llama.cpp", "8", "merged"],
    ]
    assert lines[-1] == f"3 rows appended to {out}" and len(out.read_text().splitlines()) == 3


def test_an_adapter_of_the_second_model_from_its_shape_and_in_two_engines():
    """Gemma 3 270M (the model a user brings, issue 36: sliding-window layers, head_dim 256, no chat template): its
    lab adapter counts what size_table computes from its shape, and llama.cpp (its Q4_K_M GGUF) and transformers+PEFT
    (its bfloat16-derived folder) both answer differently with it than without."""
    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig
    from lablib.measure.workload import text_ids
    from lablib.model.adapters import make_adapter
    from lablib.model.resolve import prepare

    gemma = prepare("gemma-3-270m", log=lambda *_: None)
    r8 = make_adapter(gemma, rank=8, forms=("peft", "gguf"), log=lambda *_: None)
    assert ad.size_table(gemma, ranks=(8,))[0]["adapter_parameters"] == r8.parameters == 1_898_496
    ids, cfg = text_ids(gemma, "The capital of France is"), GenerationConfig(max_new_tokens=N_OUT)
    for name in ("llama.cpp", "transformers"):
        outs = []
        for adapter in (None, r8):
            engine = load_engine(name, gemma, n_ctx=128, adapter=adapter)
            try:
                outs.append(list(engine.generate(ids, cfg).token_ids))
            finally:
                engine.close()
        assert ad.first_difference(*outs) is not None, f"{name}: the adapter did not move the output"


def test_sigterm_to_a_command_with_a_server_stops_the_server_itself_and_says_so(tmp_path):
    """`lablib lora` with llama-server, sent SIGTERM after its first row: the lab stops its server (the server's
    log ends with its own "cleaning up before exit", the way a stop by SIGTERM ends; was: the lab died at once and
    the server by its death signal, mid-request), one line names the rows' file, exit code 143."""
    import os
    import signal
    import time

    import psutil

    from procs import wait_gone

    out = tmp_path / "lora.jsonl"
    args = ["lora", "--engines", "", "--servers", "llama-server", "--ranks", "8", "--concurrency", "1,2"]
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lablib.cli",
            *args,
            "--prompt-tokens",
            "32",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LABLIB_QUICK": "1"},
    )
    deadline = time.monotonic() + 300
    while not (out.is_file() and out.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    (server,) = [c for c in psutil.Process(p.pid).children() if c.name() == "llama-server"]
    port = server.cmdline()[server.cmdline().index("--port") + 1]
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    wait_gone(server)
    assert p.returncode == 143, (p.returncode, err[-2000:])
    assert (
        err.strip().splitlines()[-1] == f"lablib lora: interrupted (SIGTERM); the rows written before it are in {out}"
    )
    from lablib.config import lab_home

    (log,) = sorted((lab_home() / "servers").glob(f"llama-server-{port}-*.log"))[-1:]
    assert "cleaning up before exit" in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
    from lablib.results.store import load_results

    assert len(load_results(out)) >= 1
