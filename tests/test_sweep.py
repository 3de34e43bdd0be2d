"""Sweeps: parameters and guards, durable rows, cancel and crash, on the real default model."""

import json
import threading
from pathlib import Path

import pytest

from lablib.engines import ENGINES, memory
from lablib.errors import ContextOverflowError, LabError
from lablib.measure import sweep
from lablib.results.store import ResultsWriter, load_results


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_results_are_appended_and_earlier_rows_kept(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    w = ResultsWriter(path)
    w.append({"engine": "a", "e2e_s": 1.5, "itl_s": [0.1, 0.2]})
    w.append({"engine": "b", "e2e_s": 2.5, "itl_s": [0.3]})
    assert list(load_results(path)["engine"]) == ["a", "b"]
    ResultsWriter(path).append({"engine": "c", "e2e_s": 3.5, "itl_s": []})  # a later sweep adds
    df = load_results(path)
    assert list(df["e2e_s"]) == [1.5, 2.5, 3.5]
    assert list(df["itl_s"][0]) == [0.1, 0.2]
    # a file named twice is read once (was: its rows counted twice); a list of files as one argument; a folder
    assert load_results(path, tmp_path / ".." / tmp_path.name / path.name)["engine"].tolist() == ["a", "b", "c"]
    assert load_results([path])["engine"].tolist() == ["a", "b", "c"]
    with pytest.raises(LabError, match=r"results file .* is a folder; expected a \.jsonl or \.parquet file"):
        load_results(tmp_path)


def test_a_load_runs_writer_hands_each_row_over_and_makes_rows_durable_at_most_every_sync_every_s(tmp_path, fsynced):
    """A row is in the file (handed to the OS: a crash of the lab loses none) as append returns; an fsync is
    the first row's, then the first row's ``sync_every_s`` or more after the last, and sync()'s for the rows
    since (none when none are left). The default writer fsyncs every row."""
    import time

    path = tmp_path / "r.jsonl"
    w = ResultsWriter(path, sync_every_s=3600)
    for i in range(3):
        w.append({"engine": "e", "i": i})
        assert list(load_results(path)["i"]) == list(range(i + 1))
    assert fsynced(path) == [len(path.read_text().splitlines()[0]) + 1]  # the first row's
    w.sync()
    assert fsynced(path)[1:] == [path.stat().st_size]
    w.sync()  # nothing written since
    assert len(fsynced(path)) == 2

    w = ResultsWriter(path, sync_every_s=0.05)
    w.append({"engine": "e", "i": 3})
    w.append({"engine": "e", "i": 4})  # within 0.05 s of the last fsync (or not: then fsync'd, which is as right)
    time.sleep(0.06)
    w.append({"engine": "e", "i": 5})  # past it: fsync'd
    assert fsynced(path)[-1] == path.stat().st_size and len(fsynced(path)) in (4, 5)

    w, before = ResultsWriter(path), len(fsynced(path))
    for i in range(3):
        w.append({"engine": "e", "i": 6 + i})
        assert fsynced(path)[-1] == path.stat().st_size
    assert len(fsynced(path)) == before + 3
    assert list(load_results(path)["i"]) == list(range(9))


def test_rows_of_a_file_renamed_before_its_fsync_are_still_made_durable(tmp_path, fsynced):
    """sync() fsyncs the files the rows went to (found by a helper: it reopened the path, so a file renamed
    meanwhile, as by log rotation, never had its last rows fsync'd, and an empty file appeared at the path)."""
    path, moved = tmp_path / "r.jsonl", tmp_path / "r.1.jsonl"
    w = ResultsWriter(path, sync_every_s=3600)
    w.append({"engine": "e", "i": 0})
    w.append({"engine": "e", "i": 1})
    path.rename(moved)
    w.sync()
    assert fsynced(moved)[-1:] == [moved.stat().st_size] and not path.exists()
    w.append({"engine": "e", "i": 2})  # a new file at the path: fsync'd at the next sync, the moved one not again
    w.sync()
    assert fsynced(path) == [path.stat().st_size] and len(fsynced(moved)) == 2
    assert list(load_results(moved)["i"]) == [0, 1] and list(load_results(path)["i"]) == [2]


def test_with_a_writer_a_failed_run_keeps_its_own_error_and_a_failed_sync_is_said_otherwise(tmp_path, monkeypatch):
    """``with writer:`` around a run syncs at its end; where the run failed, an fsync failing too is dropped (found by
    a helper: the replay panel's sync replaced the run's error with its own), else it is the error."""
    import errno
    import os

    w = ResultsWriter(tmp_path / "r.jsonl", sync_every_s=3600)
    w.append({"engine": "e"})  # the first row: fsync'd
    w.append({"engine": "e"})  # pending

    def fails(fd):
        raise OSError(errno.EIO, "input/output error")

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(LabError, match="the server died"), w:
        raise LabError("the server died")
    w.append({"engine": "e"})
    with pytest.raises(OSError, match="input/output error"), w:
        pass


def test_a_row_on_disk_is_counted_though_an_interrupt_stops_its_fsync(tmp_path, monkeypatch):
    """`lablib bench` interrupted as its first row was fsync'd said "2 rows of this run are in FILE" with 3 there: the
    row was written and handed to the OS, then the Ctrl-C came inside the fsync (the first row's, then one each
    sync_every_s: milliseconds), before the row was counted (found by a test that interrupts bench once its first row
    is on disk: 1 in 6 tries). Here the interrupt comes inside that fsync, every time."""
    import os

    real = os.fsync

    def fsync_then_ctrl_c(fd):
        real(fd)
        raise KeyboardInterrupt

    path = tmp_path / "r.jsonl"
    w = ResultsWriter(path, sync_every_s=3600)
    monkeypatch.setattr(os, "fsync", fsync_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        w.append({"engine": "e", "i": 0})
    assert w.written == 1 and list(load_results(path)["i"]) == [0]


@pytest.mark.parametrize("bad", [float("nan"), -1, "1", True])
def test_a_writer_refuses_a_sync_interval_that_is_not_seconds(tmp_path, bad):
    with pytest.raises(LabError, match=r"sync_every_s=.*: expected seconds between fsyncs"):
        ResultsWriter(tmp_path / "r.jsonl", sync_every_s=bad)


@pytest.mark.parametrize("writer", ["orjson", "json.dumps"])
def test_a_jsonl_row_reads_back_as_json_dumps_writes_it(tmp_path, monkeypatch, writer):
    """The .jsonl writer's line (orjson's where installed and the row is plain, else json.dumps') reads back to
    what json.dumps' line reads back to, value for value: a load run's kind of row, and the values orjson
    writes otherwise (NaN and infinities, an int past 64 bits, keys that are not str, numpy values, nesting)."""
    import math

    import numpy as np

    from lablib.results import store

    if writer == "json.dumps":
        monkeypatch.setattr(store, "_orjson", False)
    else:
        import importlib.util

        assert importlib.util.find_spec("orjson"), "the serve extra's orjson is missing: pip install 'lablib[serve]'"
        monkeypatch.setattr(store, "_orjson", None)
    rows = [
        {"engine": "http", "ttft_s": 0.0123, "itl_s": [0.01, 0.0099, 1e-05], "token_ids": [1, 2], "error": None},
        {"text": 'héllo \u2603 \\ "q"\n', "ok": True, "n": -3, "mixed": [1, "a", None, 2.5, True], "empty": []},
        {"tpot_s": float("nan"), "e2e_s": math.inf, "itl_s": [0.1, -math.inf], "big": 2**70},
        {"itl_s": [0.1, float("nan")]},  # one at a time, in a list only
        {"gaps": [1, math.inf]},
        {"words": ["a", -math.inf]},
        {"tpot_s": float("nan")},
        {"e2e_s": -math.inf, "n": 1},
        {"server": {"load": float("nan")}},  # a NaN nested where orjson would write null
        {"ids": [1, 10**400]},  # an int no float holds
        {"error": "bad\u2028request", "text": "caf\u00e9\u0085"},  # split by str.splitlines() unless escaped
        {"np": np.float64(0.5), "i": np.int64(7), "nested": {"a": [1, {"b": None}]}, "nested_list": [[1, 2]]},
        {1: "int key"},
    ]

    def same(a, b):  # NaN equal to NaN
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    for row in rows:
        line = store.row_line(row)
        assert line.endswith("\n") and len(line[:-1].splitlines()) == 1 and line.isascii()
        assert same(json.loads(line), json.loads(json.dumps(row, default=store._jsonable)))
    plain = store.row_line(rows[0])
    if writer == "orjson":  # the plain rows are orjson's (no spaces), the others json.dumps'
        assert plain.startswith('{"engine":"http"') and store.row_line(rows[2]).startswith('{"tpot_s": NaN')
    else:
        assert plain == json.dumps(rows[0]) + "\n"
    path = tmp_path / "r.jsonl"
    for row in rows[:3] + [rows[10]]:  # the last: U+2028 and U+0085 in its text
        ResultsWriter(path).append(row)
    df = load_results(path)
    assert len(df) == 4 and df["error"][3] == "bad\u2028request"
    assert list(df["itl_s"][0]) == [0.01, 0.0099, 1e-05] and df["text"][1] == rows[1]["text"]
    assert math.isnan(df["tpot_s"][2]) and df["e2e_s"][2] == math.inf


def test_load_merges_files_and_names_the_source(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    ResultsWriter(a).append({"engine": "x", "hostname": "laptop-1"})
    ResultsWriter(b).append({"engine": "x", "hostname": "laptop-2"})
    df = load_results(a, b)
    assert list(df["hostname"]) == ["laptop-1", "laptop-2"]
    assert list(df["source_file"]) == [str(a), str(b)]
    with pytest.raises(LabError, match="not found"):
        load_results(tmp_path / "missing.jsonl")
    with pytest.raises(LabError, match=r"\.jsonl or \.parquet"):
        load_results(tmp_path / "x.csv")


def test_parameter_guards():
    with pytest.raises(LabError, match="is empty"):
        sweep.positive_ints([], "prompt_tokens")
    with pytest.raises(LabError, match=r"at least 1 \(got \[0\]\)"):
        sweep.positive_ints("64,0", "prompt_tokens")
    with pytest.raises(LabError, match=r"got \[-2\]"):
        sweep.positive_ints([4, -2], "concurrency")
    with pytest.raises(LabError, match="whole numbers"):
        sweep.positive_ints("64,abc", "prompt_tokens")
    assert sweep.positive_ints("64, 256", "x") == [64, 256]
    with pytest.raises(LabError, match="unknown engine 'vllm'"):
        sweep.engine_names("llama.cpp,vllm")
    with pytest.raises(LabError, match="no engine"):
        sweep.engine_names("")
    assert sweep.engine_names("hf,llamacpp,llama.cpp") == ["transformers", "llama.cpp"]


def test_plan_refuses_context_overflow_and_memory(model):
    with pytest.raises(ContextOverflowError, match="8190 \\+ output 8 = 8198 tokens.*trained to 8192"):
        sweep.check_plan(model, ["llama.cpp"], [64, 8190], 8)
    with pytest.raises(LabError, match=r"memory: transformers needs about .* GiB .* KV cache .* for 8 x 4096 tokens"):
        memory.check_fits(model, [ENGINES["transformers"]], 4096, 8, available=256 * 2**20)
    memory.check_fits(model, [ENGINES["llama.cpp"]], 4096, 1, available=8 * 2**30)  # fits: no error


def test_kv_cache_size_of_the_default_model(model):
    # 30 layers x 3 KV heads x 64 dims x (K and V), f16 in llama.cpp, f32 in transformers
    assert memory.kv_cache_bytes(model, ENGINES["llama.cpp"], 1) == 2 * 30 * 3 * 64 * 2 == 23040
    assert memory.kv_cache_bytes(model, ENGINES["transformers"], 1000) == 2 * 30 * 3 * 64 * 4 * 1000
    # what llama.cpp allocates (lablib.engines.llamacpp.llama_kv_cells): a stream of cells per sequence, padded to
    # 256, so two sequences of 100 tokens hold 2 x 256 cells
    est = memory.estimate_bytes(model, ENGINES["llama.cpp"], 100, 2)
    assert est["weights"] > 90e6 and est["kv_cache"] == 23040 * 512


def test_llama_cpp_buffers_are_one_micro_batch_of_logits_plus_the_graph(model):
    """n_batch x vocabulary x 4 bytes + 32 MiB; llama.cpp caps the batch at n_ctx."""
    mib = 2**20
    assert (
        memory.estimate_bytes(model, ENGINES["llama.cpp"], 4096)["runtime"] == 512 * 49152 * 4 + 32 * mib == 128 * mib
    )
    assert (
        memory.estimate_bytes(model, ENGINES["llama.cpp"], 256, n_batch=120_000)["runtime"]
        == 256 * 49152 * 4 + 32 * mib
    )
    assert memory.estimate_bytes(model, ENGINES["transformers"], 4096)["runtime"] == 0


@pytest.mark.parametrize(
    "config, shape",
    [
        (
            {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 100, "n_positions": 128},  # GPT-2 names
            {"layers": 2, "kv_heads": 4, "head_dim": 16, "vocab": 100},
        ),
        (
            {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": None, "hidden_size": 64},
            {"layers": 3, "kv_heads": 4, "head_dim": 16, "vocab": 0},
        ),  # null KV heads: multi-head attention
    ],
)
def test_model_shape_reads_other_config_spellings(tmp_path, config, shape):
    from lablib.model.formats import trained_context
    from lablib.model.resolve import ResolvedModel
    from lablib.model.shape import model_shape

    (tmp_path / "config.json").write_text(json.dumps(config))
    rm = ResolvedModel(name="m", source=str(tmp_path), source_format="hf", sha256="0", hf_path=str(tmp_path))
    assert model_shape(rm) == shape
    assert trained_context(config) == config.get("n_positions", 0)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery"}))
    with pytest.raises(LabError, match=r"cannot tell the model's layers"):
        model_shape(rm)


def test_default_prompt_lengths(model, monkeypatch):
    monkeypatch.setenv("LABLIB_QUICK", "0")
    assert sweep.default_prompt_lengths(model, 32) == [64, 128, 256, 512, 1024, 2048, 4096]
    monkeypatch.setenv("LABLIB_QUICK", "1")
    assert sweep.default_prompt_lengths(model, 32) == [64, 256]


def test_context_sweep_rows_and_file(model, tmp_path):
    out = tmp_path / "ctx.jsonl"
    df = sweep.context_sweep(
        model,
        engines=["llama.cpp"],
        prompt_tokens=[16, 48],
        max_new_tokens=3,
        reps=2,
        warmup=1,
        out=out,
        progress=False,
    )
    assert list(df["prompt_tokens"]) == [16, 16, 48, 48]
    assert list(df["repetition"]) == [0, 1, 0, 1]
    assert (df["output_tokens"] == 3).all() and (df["cached_tokens"] == 0).all()
    assert (df["sweep"] == "context").all() and (df["engine"] == "llama.cpp").all()
    on_disk = load_results(out)
    assert len(on_disk) == 4 and list(on_disk["prompt_tokens"]) == [16, 16, 48, 48]
    assert on_disk["model_sha256"].str.len().eq(64).all()


def test_cancelled_sweep_keeps_every_finished_row(model, tmp_path):
    out = tmp_path / "ctx.parquet"
    cancel = threading.Event()
    seen = []

    def on_row(row):
        seen.append(row)
        if len(seen) == 2:
            cancel.set()

    df = sweep.context_sweep(
        model,
        engines=["llama.cpp"],
        prompt_tokens=[16, 32, 48],
        max_new_tokens=2,
        reps=1,
        warmup=0,
        out=out,
        cancel=cancel,
        on_row=on_row,
        progress=False,
    )
    assert len(df) == 2 and len(load_results(out)) == 2
    assert list(load_results(out)["prompt_tokens"]) == [16, 32]


def test_crashed_sweep_keeps_every_finished_row(model, tmp_path):
    out = tmp_path / "ctx.jsonl"
    count = []

    def on_row(row):
        count.append(1)
        if len(count) == 2:
            raise RuntimeError("kernel died")

    with pytest.raises(RuntimeError):
        sweep.context_sweep(
            model,
            engines=["llama.cpp"],
            prompt_tokens=[16, 32, 48],
            max_new_tokens=2,
            reps=1,
            warmup=0,
            out=out,
            on_row=on_row,
            progress=False,
        )
    lines = out.read_text().splitlines()
    assert [json.loads(line)["prompt_tokens"] for line in lines] == [16, 32]


def test_cli_sweep_writes_a_file_that_merge_and_report_read(tmp_path):
    import subprocess
    import sys

    a, b, merged, html = tmp_path / "a.jsonl", tmp_path / "b.parquet", tmp_path / "all.jsonl", tmp_path / "r.html"

    def lablib(*args):
        p = subprocess.run([sys.executable, "-m", "lablib.cli", *args], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return p.stdout

    lablib(
        "sweep",
        "context",
        "--engines",
        "llama.cpp",
        "--prompt-tokens",
        "16,32",
        "--max-new-tokens",
        "2",
        "--reps",
        "1",
        "--out",
        str(a),
        "--quiet",
    )
    lablib(
        "sweep",
        "concurrency",
        "--engines",
        "llama.cpp",
        "--concurrency",
        "1,2",
        "--mode",
        "serial,batched",
        "--requests",
        "2",
        "--prompt-tokens",
        "16",
        "--max-new-tokens",
        "2",
        "--out",
        str(b),
        "--quiet",
    )
    out = lablib("merge", str(a), str(b), "--out", str(merged))
    df = load_results(merged)
    # context: 2 lengths x 1 rep; concurrency: 2 levels x 2 requests x 2 modes
    assert len(df) == 2 + 2 * 2 * 2 and "10 rows from 2 file(s)" in out
    assert set(df["sweep"]) == {"context", "concurrency"}
    assert set(df["source_file"]) == {str(a), str(b)}
    lablib("report", str(merged), "--html", str(html))
    page = html.read_text()
    assert page.count("<html") == 1 and "plotly" in page.lower() and len(page) > 100_000


def test_merge_refuses_to_overwrite(tmp_path):
    from lablib.results.store import merge_results

    a = tmp_path / "a.jsonl"
    ResultsWriter(a).append({"engine": "x"})
    with pytest.raises(LabError, match="exists"):
        merge_results([a], a)


def test_torn_jsonl_is_named_and_appends_stay_readable(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"engine": "a"}\n{"engine": "b", "e2')  # a crash mid-row
    with pytest.raises(LabError, match=r"r.jsonl, line 2: not a JSON row"):
        load_results(path)
    path.write_text('{"engine": "a"}')  # no trailing newline
    ResultsWriter(path).append({"engine": "b"})
    assert list(load_results(path)["engine"]) == ["a", "b"]


def test_zero_budgets_are_refused_not_defaulted(model):
    with pytest.raises(LabError, match="max_new_tokens=0: expected a whole number of at least 1"):
        sweep.context_sweep(model, engines=["llama.cpp"], prompt_tokens=[8], max_new_tokens=0, progress=False)
    with pytest.raises(LabError, match="reps=0: expected a whole number of at least 1"):
        sweep.context_sweep(model, engines=["llama.cpp"], prompt_tokens=[8], reps=0, progress=False)
    with pytest.raises(LabError, match="prompt_tokens is empty"):
        sweep.context_sweep(model, engines=["llama.cpp"], prompt_tokens=[], progress=False)


def test_report_refuses_to_overwrite_its_input(tmp_path):
    import subprocess
    import sys

    a = tmp_path / "keep.jsonl"
    ResultsWriter(a).append({"engine": "x", "sweep": "context"})
    for target in (a, tmp_path / "r.txt"):
        p = subprocess.run(
            [sys.executable, "-m", "lablib.cli", "report", str(a), "--html", str(target)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr
    assert load_results(a)["engine"].tolist() == ["x"]


@pytest.mark.parametrize("kind", ["corrupt parquet", "unwritable folder"])
def test_a_results_file_that_cannot_be_written_is_refused_before_any_measurement(model, tmp_path, kind):
    if kind == "corrupt parquet":
        out = tmp_path / "old.parquet"
        out.write_bytes(b"not parquet at all")
        want = r"old\.parquet: not a readable parquet file; expected a results file the lab wrote"
    else:
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / "results.jsonl"  # a folder that cannot exist
        want = r"cannot write there"
    measured = []
    with pytest.raises(LabError, match=want):
        sweep.context_sweep(
            model,
            engines=["llama.cpp"],
            prompt_tokens=[16],
            max_new_tokens=2,
            reps=1,
            out=out,
            on_row=measured.append,
            progress=False,
        )
    assert measured == []
    if kind == "corrupt parquet":
        assert out.read_bytes() == b"not parquet at all"  # left as it was


def test_fewer_requests_than_clients_is_refused(model):
    with pytest.raises(LabError, match=r"requests=2 with concurrency up to 4.*requests >= 4"):
        sweep.concurrency_sweep(model, engines=["llama.cpp"], concurrency=[1, 4], requests=2, progress=False)
    assert sweep.check_requests(None, [1, 4]) is None and sweep.check_requests(4, [1, 4]) == 4


def test_a_dangling_link_or_a_foreign_parquet_is_refused_before_any_measurement(model, tmp_path):
    import pandas as pd

    dangling = tmp_path / "results.jsonl"
    dangling.symlink_to(tmp_path / "no-such-folder" / "r.jsonl")
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"engine": [1, 2], "prefill_s": ["a", "b"]}).to_parquet(foreign)
    for out, want in (
        (dangling, r"links to .*no-such-folder.*whose folder does not exist"),
        (foreign, r"foreign\.parquet is not a results file the lab wrote"),
    ):
        measured = []
        with pytest.raises(LabError, match=want):
            sweep.context_sweep(
                model,
                engines=["llama.cpp"],
                prompt_tokens=[16],
                max_new_tokens=2,
                reps=1,
                out=out,
                on_row=measured.append,
                progress=False,
            )
        assert measured == []


def test_parquet_appends_keep_rows_as_written(tmp_path):
    """A second writer adds to a parquet file without baking a source_file column into old rows."""
    import pandas as pd

    path = tmp_path / "r.parquet"
    row = {"engine": "llama.cpp", "prompt_tokens": 16, "ttft_s": 0.5, "e2e_s": 1.0}
    ResultsWriter(path).append(row)
    ResultsWriter(path).append({**row, "e2e_s": 2.0})
    raw = pd.read_parquet(path)
    assert "source_file" not in raw.columns and list(raw["e2e_s"]) == [1.0, 2.0]
    assert list(load_results(path)["source_file"]) == [str(path)] * 2


def test_one_token_runs_append_to_parquet_and_bad_rows_are_named(tmp_path):
    """TPOT is None for every 1-token request: an all-null column is still the lab's."""
    path = tmp_path / "one.parquet"
    row = {"engine": "llama.cpp", "prompt_tokens": 8, "ttft_s": 0.1, "tpot_s": None, "decode_tps": None}
    ResultsWriter(path).append(row)
    ResultsWriter(path).append(row)
    assert len(load_results(path)) == 2
    lines = tmp_path / "list.jsonl"
    lines.write_text('{"engine": "a"}\n[1, 2]\n')
    with pytest.raises(LabError, match=r"list\.jsonl, line 2: a JSON array, expected one row as a JSON object"):
        load_results(lines)
    lines.write_text('{"engine": "a"}\nnull\n')  # said in JSON's words (was: "a JSON NoneType")
    with pytest.raises(LabError, match=r"list\.jsonl, line 2: a JSON null, expected one row as a JSON object"):
        load_results(lines)


def test_merge_into_parquet_names_a_type_clash_and_writes_nothing(tmp_path):
    from lablib.results.store import merge_results

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"engine": "llama.cpp", "threads": 2}\n')
    b.write_text('{"engine": "llama.cpp", "threads": "two"}\n')
    out = tmp_path / "all.parquet"
    with pytest.raises(LabError, match=r"cannot write .*all\.parquet: the files disagree on a column's type") as e:
        merge_results([a, b], out)
    # pyarrow's own words whole, from their start: which value it could not convert
    assert "(pyarrow says: (\"Could not convert 'two' with type str: tried to convert to int64" in str(e.value)
    assert list(tmp_path.glob("all.parquet*")) == []
    assert len(merge_results([a, b], tmp_path / "all.jsonl")) == 2  # JSON lines hold both


def test_a_file_that_is_not_parquet_is_said_first_pyarrows_words_last(tmp_path, capsys):
    """`lablib report bad.parquet` quoted pyarrow's exception in the middle ("not a readable parquet file
    (ArrowInvalid: Could not open Parquet input source '<the path again>': Parquet file size is 5 bytes, ...);
    expected ..."). Now the file, what was expected and what to do, then pyarrow's reason as a short clause."""
    from lablib.cli import main

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"hello")
    assert main(["report", str(bad), "--html", str(tmp_path / "r.html")]) == 2
    assert capsys.readouterr().err == (
        f"lablib: {bad}: not a readable parquet file; expected a results file the lab wrote (rows in Parquet): "
        "restore it, or write to a new file (pyarrow says: Parquet file size is 5 bytes, smaller than the minimum "
        "file footer (8 bytes))\n"
    )


def test_a_mode_an_engine_lacks_is_refused_before_any_work(model, tmp_path):
    """onnxruntime-genai runs serial only (Engine.modes): asked for batched alone, the concurrency
    sweep says so before loading anything, instead of returning no rows."""
    out = tmp_path / "c.jsonl"
    kw = dict(concurrency=[1], prompt_tokens=16, max_new_tokens=2, out=out, progress=False)
    with pytest.raises(LabError, match=r"onnxruntime-genai has no batched mode \(it runs serial\)"):
        sweep.concurrency_sweep(model, engines=["onnxruntime-genai"], modes=["batched"], **kw)
    assert not out.exists()
    plan = sweep.modes_per_engine(["openvino", "onnxruntime-genai"], ["serial", "batched"])
    assert plan == {"openvino": ["serial", "batched"], "onnxruntime-genai": ["serial"]}


# --- the one loop of a sweep, the warm-up loop, the manifest: on a stand-in engine (no library) ---------
class _Info:
    def to_dict(self):
        return {"name": "stand-in", "version": "0"}


class _Model:
    def manifest(self):
        return {"name": "m", "sha256": "0" * 64}


class _Trace:
    def __init__(self, ids, cfg):
        self.ids, self.cfg = list(ids), cfg
        self.prefill_tps, self.decode_tps = float(len(ids)), float(cfg.max_new_tokens)

    def metrics(self):
        return {"prefill_tps": self.prefill_tps, "decode_tps": self.decode_tps}


class _StandIn:
    """What the loops use of an engine: generate, info, model, close; it logs each call."""

    def __init__(self, log, name="stand-in", **load):
        self.log, self.name, self.load, self.model = log, name, load, _Model()
        log.append(("load", name))

    def generate(self, ids, cfg, **_):
        self.log.append(("generate", len(ids), cfg.max_new_tokens))
        return _Trace(ids, cfg)

    def info(self):
        return _Info()

    def close(self):
        self.log.append(("close", self.name))


def test_engine_manifest_takes_any_object_with_info_and_model():
    from lablib.results.store import engine_manifest

    m = engine_manifest(_StandIn([]), {"prompt_tokens": 3})
    assert m["engine"] == {"name": "stand-in", "version": "0"} and m["model"]["name"] == "m"
    assert m["workload"] == {"prompt_tokens": 3} and {"hardware", "lablib_version", "time"} <= set(m)
    assert sweep.engine_manifest is engine_manifest  # where the sweeps' callers reach it


def test_the_guards_live_in_plan_and_positive_ints_is_the_one_check():
    from lablib import checks
    from lablib.measure import plan

    assert sweep.positive_ints is plan.positive_ints is checks.positive_ints
    for name in ("budgeted_int", "engine_names", "weights_load_kwargs", "default_prompt_lengths", "check_plan"):
        assert getattr(sweep, name) is getattr(plan, name)
    assert plan.scheduling_modes("batched, serial") == ["batched", "serial"]
    with pytest.raises(LabError, match=r"modes=\['fast'\]: expected one or more of serial, batched"):
        plan.scheduling_modes(["fast"])
    with pytest.raises(LabError, match=r"warmup=-1: expected 0 or more"):
        plan.check_warmup(-1)


def test_measured_traces_warm_up_unrecorded_then_measure_each_prompt_and_stop_on_cancel():
    from lablib.engines.base import GenerationConfig

    log = []
    e = _StandIn(log)
    cfg, short = GenerationConfig(max_new_tokens=4), GenerationConfig(max_new_tokens=2)
    traces = list(sweep.measured_traces(e, [[1] * 5, [1] * 6], cfg, warmup=[[1] * 3], warmup_cfg=short))
    assert [len(t.ids) for t in traces] == [5, 6]
    assert log[1:] == [("generate", 3, 2), ("generate", 5, 4), ("generate", 6, 4)]
    cancel = threading.Event()
    gen = sweep.measured_traces(e, [[1]] * 3, cfg, warmup=[[1]], cancel=cancel)
    next(gen)
    cancel.set()
    assert list(gen) == []


def test_ladder_and_anchors_measure_through_the_warm_up_loop(monkeypatch):
    from lablib.studies import anchors, ladder

    log = []
    speed = ladder.measure_speed(_StandIn(log), list(range(20)), 5, reps=2)
    # one short warm-up (8 prompt tokens, 2 new), then the reps
    assert log[1:] == [("generate", 8, 2), ("generate", 20, 5), ("generate", 20, 5)]
    assert speed == {"prefill_tps": 20.0, "decode_tps": 5.0, "prompt_tokens": 20, "output_tokens": 5}
    monkeypatch.setattr(anchors, "prompt_of_length", lambda model, n: [1] * n)
    log.clear()
    assert anchors.lab_single(_StandIn(log), "pp512", reps=2) == 512.0  # no warm-up unless asked
    assert log[1:] == [("generate", 512, 1)] * 2
    log.clear()
    assert anchors.lab_single(_StandIn(log), "tg128@d0", reps=1, warmup=1) == 128.0
    assert log[1:] == [("generate", 1, 128)] * 2


def test_in_process_vs_server_warms_up_each_way_then_one_distinct_prompt_per_rep(monkeypatch):
    import lablib.engines
    from lablib.studies import serving

    class Trace(_Trace):
        ttft_s = tpot_s = e2e_s = 0.1
        output_tokens, count_method = 2, "token_ids"
        chunk_arrivals = [0.1, 0.2]  # an HTTP trace's content events (the http rows' chunks)

    class Engine(_StandIn):
        def generate(self, ids, cfg, **_):
            self.log.append((self.name, ids[0]))
            return Trace(ids, cfg)

    class Server:
        name, threads = "llama-server", 1

        def engine(self, model):
            return Engine(log, "http")

    log = []
    # prompt i starts with token i: which prompt each request got
    monkeypatch.setattr(
        "lablib.measure.workload.distinct_prompts", lambda model, n, count: [[i] * n for i in range(count)]
    )
    monkeypatch.setattr(lablib.engines, "load_engine", lambda name, model, **kw: Engine(log, name))
    df = serving.in_process_vs_server(None, Server(), prompt_tokens=4, max_new_tokens=2, reps=2)
    assert list(df["where"]) == ["in-process"] * 2 + ["http"] * 2 and list(df["rep"]) == [0, 1, 0, 1]
    # each way: the warm-up on the last prompt (no measured request uses it), then prompts 0 and 1
    assert [e for e in log if e[0] != "load" and e[0] != "close"] == [
        ("llama.cpp", 2), ("llama.cpp", 0), ("llama.cpp", 1), ("http", 2), ("http", 0), ("http", 1),
    ]  # fmt: skip


def _stand_in_plan(monkeypatch, log):
    monkeypatch.setattr(sweep, "load_engine", lambda name, model, **load: _StandIn(log, name, **load))

    def rows(tag, n):
        def run(engine, emit):
            for i in range(n):
                emit({"engine": engine.name, "step": tag, "i": i})

        return run

    return [
        sweep.Step("a", {"n_ctx": 64}, rows("a1", 2)),
        sweep.Step("a", {"n_ctx": 64}, rows("a2", 1)),  # same engine and load keywords: loaded once
        sweep.Step("b", {"n_ctx": 64}, rows("b1", 2)),
    ]


def test_run_plan_loads_each_engine_once_writes_rows_in_order_and_closes(monkeypatch, tmp_path):
    log, seen = [], []
    plan = _stand_in_plan(monkeypatch, log)
    out = tmp_path / "plan.jsonl"
    df = sweep.run_plan(None, plan, out=out, on_row=seen.append, progress=False, total=5)
    assert [(r["step"], r["i"]) for r in seen] == [("a1", 0), ("a1", 1), ("a2", 0), ("b1", 0), ("b1", 1)]
    assert list(df["step"]) == list(load_results(out)["step"]) == ["a1", "a1", "a2", "b1", "b1"]
    assert log == [("load", "a"), ("close", "a"), ("load", "b"), ("close", "b")]


def test_run_plan_stops_on_cancel_and_closes_on_a_crash(monkeypatch, tmp_path):
    log = []
    plan = _stand_in_plan(monkeypatch, log)
    cancel = threading.Event()

    def on_row(row):
        if row["step"] == "a2":
            cancel.set()

    df = sweep.run_plan(None, plan, on_row=on_row, cancel=cancel, progress=False)
    assert list(df["step"]) == ["a1", "a1", "a2"] and log == [("load", "a"), ("close", "a")]
    log.clear()
    assert sweep.run_plan(None, plan, cancel=cancel, progress=False).empty and log == []  # set before: nothing loads

    def crash(row):
        if row["step"] == "b1":
            raise RuntimeError("kernel died")

    log.clear()
    out = tmp_path / "crash.jsonl"
    with pytest.raises(RuntimeError):
        sweep.run_plan(None, plan, out=out, on_row=crash, progress=False)
    assert list(load_results(out)["step"]) == ["a1", "a1", "a2", "b1"] and log[-1] == ("close", "b")


def test_a_torn_last_row_is_refused_before_rows_are_added_after_it(tmp_path):
    """A crash mid-row leaves a torn last line: rows appended after it would leave a file load_results refuses
    while the run said it wrote them. The writer refuses first, naming the line and how to remove it; without
    that line it appends, and every row loads."""
    import subprocess

    path = tmp_path / "r.jsonl"
    path.write_text('{"engine": "a"}\n{"engine": "b"}\n{"engine": "c", "tt')
    with pytest.raises(LabError, match=r"r.jsonl, line 3: a row torn by a crash .*sed -i '3d' "):
        ResultsWriter(path)
    path.write_text('{"engine": "a"}\n{"engine": "b"}\n{"engine": "c", "tt\n')  # torn, then a newline
    with pytest.raises(LabError, match=r"line 3: a row torn"):
        ResultsWriter(path)
    subprocess.run(["sed", "-i", "3d", str(path)], check=True)  # the message's mend
    ResultsWriter(path).append({"engine": "d"})
    assert list(load_results(path)["engine"]) == ["a", "b", "d"]
    # what else a crash or a power loss leaves last, each named at its own line (blank lines after it not counted)
    row = '{"engine": "a"}\n'
    for tail, line, why in (
        ('{"engine": "b", "x\n\n\n', 2, "a row torn by a crash"),
        ('{"engine": "b", "x\n   \n', 2, "a row torn by a crash"),
        ("\0" * 300, 2, "NUL bytes"),
        ('{"engine": "b"}\n' + "\0" * 300 + "\n", 3, "NUL bytes"),
        ("[1, 2]\n", 2, "a JSON value that is not a row"),
        ('{"engine": "b", "text": "' + "x" * (3 << 20) + "\n", 2, "a row torn by a crash"),  # longer than 1 MiB
    ):
        path.write_text(row + tail)
        with pytest.raises(LabError, match=rf"r.jsonl, line {line}: {why}.*sed -i '{line}d' "):
            ResultsWriter(path)
    for fine in (row + "\n\n", row.replace("\n", "\r\n"), row + '{"engine": "b", "text": "' + "y" * (3 << 20) + '"}'):
        path.write_text(fine)
        ResultsWriter(path).append({"engine": "c"})
        assert load_results(path)["engine"].tolist()[-1] == "c"


def test_a_full_disk_is_one_message_and_the_rows_before_it_stay(tmp_path):
    full = tmp_path / "full.jsonl"
    full.symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(
        LabError,
        match=r"full.jsonl: a row could not be written \(No space left on device\); the rows "
        r"written before it \(0\) are kept: free space, or choose another results file",
    ):
        ResultsWriter(full).append({"engine": "a"})


def test_merge_and_report_refuse_files_that_are_not_rows(tmp_path):
    """lablib merge and lablib report combine files the lab wrote; a foreign JSON file, an empty file, a sweep's
    run records (.runs.jsonl) and an unwritable target are each one message, and nothing is written."""
    from lablib.cli import main
    from lablib.results.store import merge_results

    rows = tmp_path / "sw.jsonl"
    ResultsWriter(rows).append({"engine": "llama.cpp", "sweep": "context", "prompt_tokens": 8})
    (tmp_path / "sw.runs.jsonl").write_text('{"point": 1, "requests": 1}\n')
    (tmp_path / "obj.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "empty.jsonl").write_text("")
    # a glob picks up a run's companion records beside its rows (docs/workshop.md: report data/reference/*.jsonl):
    # left out, said, and the rows merged
    said = []
    from lablib.results.store import load_lab_rows

    assert load_lab_rows([rows, tmp_path / "sw.runs.jsonl"], log=said.append)["engine"].tolist() == ["llama.cpp"]
    assert said == [f"left out {tmp_path / 'sw.runs.jsonl'}: a run's records beside its results file, not result rows"]
    # a summary the lab wrote (lab 05's rate sweep: rows per server) merges, as data/reference/README.md says
    shipped = sorted((Path(__file__).resolve().parents[1] / "data" / "reference").glob("serving-rates-*.jsonl"))
    assert len(merge_results(shipped, tmp_path / "rates.jsonl")) == 15
    for bad, said in (
        ("obj.jsonl", r"obj.jsonl is not a results file the lab wrote \(1 of 1 rows name neither an engine nor"),
        ("empty.jsonl", r"empty.jsonl has no rows: leave it out"),
    ):
        with pytest.raises(LabError, match=said):
            merge_results([rows, tmp_path / bad], tmp_path / "m.jsonl")
        assert main(["report", str(rows), str(tmp_path / bad), "--html", str(tmp_path / "r.html")]) == 2
    assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "r.html").exists()
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(LabError, match=r"--html .*dir.html is a folder"):
        from lablib.results.store import writable_file

        writable_file(tmp_path / "dir.html", "--html")
    assert main(["report", str(rows), "--html", str(tmp_path / "dir.html")]) == 2
    assert merge_results([rows], tmp_path / "ok.jsonl")["engine"].tolist() == ["llama.cpp"]


def test_the_shipped_reference_files_make_one_report(tmp_path, capsys):
    """docs/workshop.md's check of the reference files, as a facilitator runs it: `lablib report
    data/reference/*.jsonl`. The glob takes lab 05's rate-sweep summary (rows per server, no engine) beside the
    concurrency sweep's requests; the roofline's bound columns met a row with no engine and raised
    AttributeError ('float' object has no attribute 'info'), a traceback (found by a helper following the docs)."""
    from lablib.cli import main

    shipped = sorted((Path(__file__).resolve().parents[1] / "data" / "reference").glob("*.jsonl"))
    assert {p.name.split("-")[0] for p in shipped} >= {"concurrency", "serving"}
    rates = [p for p in shipped if p.name.startswith("serving-rates-")]
    html = tmp_path / "reference.html"
    assert main(["report", *map(str, shipped), "--html", str(html)]) == 0
    n = sum(len(p.read_text().splitlines()) for p in shipped)
    assert f"{n} rows from {len(shipped)} file(s)" in capsys.readouterr().out
    summaries = sum(len(p.read_text().splitlines()) for p in rates)  # one per server and rate
    text = html.read_text()
    # the summaries are drawn as lab 05 draws them, and not counted as requests
    assert f"{n - summaries} measured requests and {summaries} rate-sweep summaries" in text
    assert "Concurrency" in text and "Servers under a rate sweep (lab 05)" in text
    assert main(["report", *map(str, rates), "--html", str(tmp_path / "rates.html")]) == 0  # the summaries alone
    assert "Servers under a rate sweep (lab 05)" in (tmp_path / "rates.html").read_text()


def test_a_refused_or_failed_command_leaves_no_empty_folder(tmp_path, capsys):
    """writable_file and ResultsWriter made the output's folder when they checked it, before the rows loaded or the
    work ran: `lablib merge --one-clock` refused after it and left new/ empty behind, and so did every refused
    bench or sweep (ResultsWriter is made before the server is asked anything). Now they check the nearest existing
    folder without making one; the first write makes it."""
    from lablib.cli import main
    from lablib.results.store import writable_file

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"engine": "llama.cpp", "ttft_s": 0.1}\n')  # no clock_unix_offset_s: --one-clock refuses it
    new = tmp_path / "new"
    assert main(["merge", str(rows), "--out", str(new / "deeper" / "m.jsonl"), "--one-clock"]) == 2
    assert "one_clock: 1 rows have no clock_unix_offset_s" in capsys.readouterr().err
    assert not new.exists()
    assert writable_file(new / "r.html", "--html") == new / "r.html" and not new.exists()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(LabError, match=r"--html .*a-file/r\.html: cannot write there \(.*a-file is not a folder\)"):
        writable_file(tmp_path / "a-file" / "r.html", "--html")
    # a results file: its folder made with the first row, not before
    w = ResultsWriter(new / "deeper" / "r.jsonl")
    assert not new.exists()
    w.append({"engine": "llama.cpp", "ttft_s": 0.1})
    w.sync()
    assert load_results(new / "deeper" / "r.jsonl")["engine"].tolist() == ["llama.cpp"]
    # and the commands still write into a folder not there yet
    assert main(["merge", str(rows), "--out", str(tmp_path / "m" / "all.jsonl")]) == 0
    assert load_results(tmp_path / "m" / "all.jsonl")["engine"].tolist() == ["llama.cpp"]


def test_a_ctrl_c_python_drops_still_stops_the_sweep(tmp_path):
    """Python prints and drops a KeyboardInterrupt that lands in a finalizer or a ctypes callback ("Exception
    ignored in ..."): here one is dropped on purpose in the second row's callback. The CLI's handler also sets the
    sweep's cancel event, so the real llama.cpp sweep stops at its next request and the way out is the same
    KeyboardInterrupt (before: all 50 repetitions ran)."""
    import os
    import signal
    import time

    from lablib.cli.common import ctrl_c_also_cancels

    rows, handler_before = [], signal.getsignal(signal.SIGINT)

    def on_row(row):
        rows.append(row)
        if len(rows) == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler runs here
            except KeyboardInterrupt:
                pass  # dropped, as in a finalizer
            else:
                raise AssertionError("no KeyboardInterrupt within 5 s of SIGINT")

    with pytest.raises(KeyboardInterrupt), ctrl_c_also_cancels() as cancel:
        sweep.context_sweep(
            engines=["llama.cpp"], prompt_tokens=[16], max_new_tokens=4, reps=50, on_row=on_row, cancel=cancel,
            progress=False, out=tmp_path / "c.jsonl",
        )  # fmt: skip
    assert cancel.is_set() and len(rows) == 2, len(rows)
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler put back


def test_ctrl_c_in_a_sweep_is_one_line_and_its_rows_load(tmp_path, monkeypatch, capsys):
    """Ctrl-C (SIGINT) in the middle of `lablib sweep`: one line naming the file the rows are in, exit code 130,
    and every row written before it loads."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "int.jsonl"

    def sweep(reps: int):
        args = ["sweep", "context", "--engines", "llama.cpp", "--prompt-tokens", "16", "--max-new-tokens", "4"]
        return subprocess.Popen(
            [sys.executable, "-m", "lablib.cli", *args, "--reps", str(reps), "--quiet", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LABLIB_QUICK": "1"},
        )

    p = sweep(500)
    deadline = time.monotonic() + 120
    while not (out.is_file() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # say what it printed, for the next engineer
        p.kill()
        _, err = p.communicate()
        raise AssertionError(f"still running 60 s after SIGINT; its stderr ended: {err[-3000:]}") from None
    assert p.returncode == 130, err
    assert (
        err.strip().splitlines()[-1] == f"lablib sweep: interrupted (Ctrl-C); the rows written before it are in {out}"
    )
    assert "Traceback" not in err
    assert len(load_results(out)) >= 2
    # Ctrl-C before this run's first row (in-process: at once, whatever the machine's speed): its earlier rows are
    # said to be as they were, not to be this run's
    import lablib.cli.sweep
    from lablib.cli import main

    def interrupted(ns):
        raise KeyboardInterrupt

    before = out.read_bytes()
    monkeypatch.setattr(lablib.cli.sweep, "run", interrupted)
    assert main(["sweep", "context", "--engines", "llama.cpp", "--out", str(out)]) == 130
    assert out.read_bytes() == before
    assert capsys.readouterr().err.strip() == (
        f"lablib sweep: interrupted (Ctrl-C); no rows were added to {out} (its earlier rows are as they were)"
    )
    assert main(["sweep", "context", "--engines", "llama.cpp", "--out", str(tmp_path / "new.jsonl")]) == 130
    assert (
        capsys.readouterr().err.strip().endswith(f"no results file was written (it would be {tmp_path / 'new.jsonl'})")
    )


@pytest.mark.parametrize(
    "signals,code,said",
    [
        (["SIGTERM"], 143, "SIGTERM"),  # was: killed by it, exit code -15, not a word
        (["SIGINT", "SIGINT", "SIGINT"], 130, "Ctrl-C"),  # was: a later one killed it by SIGINT on its way out
        (["SIGINT", "SIGTERM"], 130, "Ctrl-C"),
    ],
)
def test_every_command_takes_sigterm_as_ctrl_c_and_one_signal_only(tmp_path, signals, code, said):
    """`lablib sweep` (a command that holds no handler of its own, as bench, replay and serve do) stopped by SIGTERM
    says so in one line and exits 143, its rows on disk; signals after the first (0.2 s apart: during its way out)
    change nothing: one line, exit code 130, no traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sig.jsonl"
    args = ["sweep", "context", "--engines", "llama.cpp", "--prompt-tokens", "16", "--max-new-tokens", "4"]
    p = subprocess.Popen(
        [sys.executable, "-m", "lablib.cli", *args, "--reps", "500", "--quiet", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LABLIB_QUICK": "1"},
    )
    deadline = time.monotonic() + 120
    while not (out.is_file() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    for i, name in enumerate(signals):
        if i:
            time.sleep(0.2)
        if p.poll() is None:
            p.send_signal(getattr(signal, name))
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        raise AssertionError(f"still running 60 s after {signals}; its stderr ended: {err[-3000:]}") from None
    assert p.returncode == code, (p.returncode, err[-2000:])
    assert (
        err.strip().splitlines()[-1] == f"lablib sweep: interrupted ({said}); the rows written before it are in {out}"
    )
    assert "Traceback" not in err and err.count("interrupted") == 1, err[-2000:]
    assert len(load_results(out)) >= 2


def test_side_by_side_writes_each_row_as_it_finishes_and_a_crash_keeps_the_requests_before_it(
    model, tmp_path, monkeypatch
):
    """``out``: every measured row on disk as the frame holds it, each engine's record in ``<out>.runs.jsonl``.
    A failure in the second engine's second measured request (the real engine's generate, made to fail there)
    leaves the first engine's rows and the second engine's first request on disk (was: an engine's rows were
    written only once all its requests had finished)."""
    from lablib.results.store import runs_path

    out = tmp_path / "sbs.jsonl"
    df = sweep.side_by_side(model, engines=["llama.cpp"], max_new_tokens=2, reps=2, progress=False, out=out)
    back = load_results(out)
    assert list(back["engine"]) == ["llama.cpp"] * 2 and list(back["repetition"]) == [0, 1]
    assert list(back["ttft_s"]) == list(df["ttft_s"]) and [list(x) for x in back["token_ids"]] == list(df["token_ids"])
    (rec,) = [json.loads(line) for line in runs_path(out).read_text().splitlines()]
    assert (rec["engine"], rec["sweep"], rec["run_id"]) == ("llama.cpp", "side_by_side", df["run_id"][0])

    real_load = sweep.load_engine

    def load(name, *a, **kw):
        engine = real_load(name, *a, **kw)
        if name == "transformers":
            real, calls = engine.generate, []

            def generate(*ga, **gk):  # the warm-up, the first measured request, then a crash
                calls.append(1)
                if len(calls) == 3:
                    raise RuntimeError("kernel died")
                return real(*ga, **gk)

            engine.generate = generate
        return engine

    monkeypatch.setattr(sweep, "load_engine", load)
    crashed = tmp_path / "crashed.jsonl"
    with pytest.raises(RuntimeError, match="kernel died"):
        sweep.side_by_side(
            model, engines=["llama.cpp", "transformers"], max_new_tokens=2, reps=3, progress=False, out=crashed
        )
    kept = load_results(crashed)
    assert list(kept["engine"]) == ["llama.cpp"] * 3 + ["transformers"] and list(kept["repetition"]) == [0, 1, 2, 0]


def test_side_by_side_refuses_a_results_file_it_cannot_write_before_any_engine_loads(model, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr(sweep, "load_engine", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(LabError, match="is a folder; expected a file name ending in .jsonl or .parquet"):
        sweep.side_by_side(model, engines=["llama.cpp"], progress=False, out=tmp_path / "folder.jsonl")
    # a name that is no path (a number, a list): one message, not pathlib's TypeError after the engines loaded
    for out in (123, ["a.jsonl"]):
        with pytest.raises(LabError, match=r"results file .*: expected a file name \(a str or a Path\) ending in"):
            sweep.context_sweep(model, engines=["llama.cpp"], prompt_tokens=[16], progress=False, out=out)
    assert loaded == []


def test_json_lines_of_something_else_are_refused_as_a_results_file_and_left_as_they_were(model, tmp_path):
    """A trace to replay (the Mooncake trace's first lines) or a dataset of prompts named as the results file: rows
    appended to it would spoil it for what it is. Refused before any measurement, the file unchanged; a file of
    lab rows (an engine's, or lab 05's summary naming a server) is still added to."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}\n'
        '{"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14]}\n'
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is the capital of France?", "engine": null}\n')
    for path, keys in ((trace, "timestamp, input_length, output_length, hash_ids"), (prompts, "prompt, engine")):
        before = path.read_bytes()
        with pytest.raises(LabError) as err:
            sweep.side_by_side(model, engines=["llama.cpp"], max_new_tokens=2, reps=1, progress=False, out=path)
        assert str(err.value) == (
            f"results file {path} is not one the lab wrote (its first line is a JSON object of {keys}: no engine or "
            "server named); expected lab rows to add to: write to a new results file"
        )
        assert path.read_bytes() == before
    summary = tmp_path / "rates.jsonl"
    summary.write_text('{"server": "vllm", "rate": 1.0}\n')
    ResultsWriter(summary).append({"server": "llama-server", "rate": 2.0})
    assert list(load_results(summary)["server"]) == ["vllm", "llama-server"]


def test_a_foreign_file_of_one_line_without_its_newline_or_of_a_long_first_line_is_refused_too(tmp_path):
    """The two shapes the first check let through (found by a helper): the trace's one line without a final
    newline (a replay with --out the trace appended to it), and a first line longer than the 1 MiB read first.
    A lab row of one line without its newline, or longer than 1 MiB, is still added to."""
    one = tmp_path / "one.jsonl"
    one.write_text('{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}')
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "x" * (2 << 20)}) + "\n")
    for path in (one, long):
        before = path.read_bytes()
        with pytest.raises(LabError, match=r"is not one the lab wrote \(its first line is a JSON object of "):
            ResultsWriter(path)
        assert path.read_bytes() == before
    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n" + json.dumps({"engine": "llama.cpp", "text": "x" * (2 << 20)}))
    ResultsWriter(mine).append({"engine": "transformers"})
    assert list(load_results(mine)["engine"]) == ["llama.cpp", "transformers"]


def test_a_companion_name_is_refused_as_a_results_file(tmp_path):
    """lablib report and merge leave a run's records (.runs.jsonl) and samples (.server.jsonl) out: rows written
    to such a name could not be read back by them."""
    for name, plain in (("a.runs.jsonl", "a.jsonl"), ("b.server.jsonl", "b.jsonl")):
        with pytest.raises(LabError) as err:
            ResultsWriter(tmp_path / name)
        assert f"expected a results file name, such as {plain}" in str(err.value)
        assert not (tmp_path / name).exists()


def test_a_parquet_results_file_through_a_link_adds_to_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "data" / "t.parquet"
    target.parent.mkdir()
    ResultsWriter(target).append({"engine": "a", "e2e_s": 1.0})
    link = tmp_path / "link.parquet"
    link.symlink_to(target)
    ResultsWriter(link).append({"engine": "b", "e2e_s": 2.0})
    assert link.is_symlink() and list(load_results(target)["engine"]) == ["a", "b"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["t.parquet"]  # no .tmp left
