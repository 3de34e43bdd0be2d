"""llama.cpp's own benchmarks, built from the lab's build tree, measure the same model."""

import json
import subprocess

import pytest

from lablib.build.llama import TOOLS, BuildError, build_report, llama_tool, llama_tools, main as llama_build_main
from lablib.studies import anchors

pytestmark = pytest.mark.engine


def test_tools_come_from_the_build_tree_of_the_installed_library():
    report = build_report()
    exe = llama_tool("llama-bench")
    assert str(exe).startswith(report["build_dir"])  # same source, same CMake flags
    out = subprocess.run([str(llama_tool("llama-batched-bench")), "--help"], capture_output=True, text=True)
    assert "-npl" in out.stdout + out.stderr


def test_every_tool_at_once_is_the_one_each_name_gives(capsys):
    """`make setup` builds them all together (`python -m lablib.build.llama --tool all`); each is then the
    program :func:`llama_tool` gives, in the library's tree, and runs."""
    exes = llama_tools()
    assert sorted(exes) == sorted(TOOLS) and all(exes[n] == llama_tool(n) for n in TOOLS)
    assert all(str(e).startswith(build_report()["build_dir"]) and e.is_file() for e in exes.values())
    out = subprocess.run([str(exes["llama-quantize"]), "--help"], capture_output=True, text=True)
    assert "Q4_1" in out.stdout and "COPY" in out.stdout  # its list of quantization types
    assert llama_build_main(["--tool", "all"]) == 0
    assert capsys.readouterr().out.split() == [str(exes[n]) for n in TOOLS]
    with pytest.raises(BuildError, match="unknown llama.cpp tool 'llama-cli'"):
        llama_tools(("llama-server", "llama-cli"))


def test_llama_bench_runs_the_lab_model(model):
    gguf = model.path_for("gguf", "llama.cpp")
    out = subprocess.run(
        [str(llama_tool("llama-bench")), "-m", gguf, "-p", "0", "-n", "8", "-r", "1", "-o", "jsonl"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["model_n_params"] == model.parameters == 134_515_008
    assert row["n_gen"] == 8 and row["avg_ts"] > 0


def test_batched_rows_hold_the_anchor_and_the_lab_for_each_batch(model):
    rows = anchors.batched_rows(model, batches=(1, 2), pp=16, tg=8, threads=1)
    assert [(r["source"], r["concurrency"]) for r in rows] == [
        ("llama-batched-bench", 1),
        ("lab", 1),
        ("llama-batched-bench", 2),
        ("lab", 2),
    ]
    assert all(r["output_tps"] > 0 for r in rows)
    from lablib.plots import anchor_bars

    fig = anchor_bars(rows)  # drawn from the rows alone
    assert [t.name for t in fig.data] == ["llama-batched-bench", "lab"]
    assert list(fig.data[1].y) == [rows[1]["output_tps"], rows[3]["output_tps"]]
