"""The first requests after a load (lablib.studies.first_requests, lab 01): real engines, each in a fresh process
of its own, its rows back in this one; the table and the figure of those rows; bad budgets refused before any
process starts."""

import os
import re

import pandas as pd
import pytest

from lablib.errors import LabError
from lablib.studies.first_requests import first_request_table, first_requests


@pytest.fixture(scope="module")
def rows(model):
    return first_requests(
        model,
        engines=["llama.cpp", "transformers"],
        loads=2,
        requests=3,
        prompt_tokens=8,
        max_new_tokens=3,
        load_kw={"threads": 1},
    )


def test_each_engine_is_loaded_twice_in_a_fresh_process_and_measured_from_its_first_request(rows):
    assert list(rows["engine"]) == ["llama.cpp"] * 6 + ["transformers"] * 6
    assert list(rows["load_number"]) == [1, 1, 1, 2, 2, 2] * 2
    assert list(rows["request_number"]) == [1, 2, 3] * 4
    assert set(rows["sweep"]) == {"first_requests"}
    assert set(rows["prompt_tokens"]) == {8} and set(rows["output_tokens"]) == {3}
    # one load time per load, the same on each of its requests; each engine's two loads timed apart
    loads = rows.groupby(["engine", "load_number"])["load_s"].nunique()
    assert (loads == 1).all() and (rows["load_s"] > 0).all()
    assert rows.groupby("engine")["load_s"].nunique().eq(2).all()
    # the requests ran in other processes: their clocks are CLOCK_MONOTONIC (one clock for the machine), so each
    # engine's requests come in order on this process's time line, llama.cpp's before transformers'
    t = rows["t_submit"].to_list()
    assert t == sorted(t)
    assert rows["ttft_s"].gt(0).all() and rows["e2e_s"].ge(rows["ttft_s"]).all()
    # the manifest of the engine that ran each row, loaded with the keywords given
    assert list(rows["engine_version"].map(bool)) == [True] * 12
    assert set(rows["threads"]) == {1}


def test_the_table_holds_each_loads_first_request_against_the_median_of_the_later_ones(rows):
    table = first_request_table(rows)
    assert list(zip(table["engine"], table["load_number"])) == [
        ("llama.cpp", 1),
        ("llama.cpp", 2),
        ("transformers", 1),
        ("transformers", 2),
    ]
    for _, t in table.iterrows():
        part = rows[(rows["engine"] == t["engine"]) & (rows["load_number"] == t["load_number"])]
        first, later = part[part["request_number"] == 1], part[part["request_number"] > 1]
        assert t["first_ttft_s"] == first["ttft_s"].iloc[0]
        assert t["steady_ttft_s"] == pytest.approx(later["ttft_s"].median())
        assert t["first_over_steady_ttft"] == pytest.approx(t["first_ttft_s"] / t["steady_ttft_s"])
        assert t["steady_tpot_s"] == pytest.approx(later["tpot_s"].median())
        assert t["load_s"] == part["load_s"].iloc[0]


def test_the_figure_draws_one_line_per_engine_and_load_in_milliseconds(rows):
    from lablib import plots

    fig = plots.first_request_lines(rows)
    assert [tr.name for tr in fig.data] == [
        "llama.cpp, load 1 (fresh process)",
        "llama.cpp, load 2",
        "transformers, load 1 (fresh process)",
        "transformers, load 2",
    ]
    first = rows[(rows["engine"] == "llama.cpp") & (rows["load_number"] == 1)]
    assert list(fig.data[0].x) == [1, 2, 3]
    assert list(fig.data[0].y) == pytest.approx(list(1000.0 * first["ttft_s"]))
    assert [tr.line.dash for tr in fig.data] == ["solid", "dash"] * 2
    assert fig.data[0].line.color == plots.color("llama.cpp") != fig.data[2].line.color
    assert fig.layout.yaxis.type == "log"


@pytest.mark.parametrize(
    "kw, said",
    [
        ({"requests": 1}, "requests=1: expected a whole number from 2 to 50"),
        ({"loads": 0}, "loads=0: expected a whole number from 1 to 10"),
        ({"prompt_tokens": 8190, "max_new_tokens": 16}, "= 8206 tokens: more than"),
        ({"engines": ["vllm"]}, "vllm"),
        ({"engines": [3]}, "engine 3: expected an engine's name"),
        ({"engines": ["http"]}, "engine http: first_requests loads an engine in a process of its own"),
        ({"model": 3}, "model=3: expected a model's name"),
        ({"loads": 11}, "loads=11: expected a whole number from 1 to 10"),
        ({"requests": 51}, "requests=51: expected a whole number from 2 to 50"),
        ({"loads": 10, "requests": 50}, "= 32000 tokens of distinct prompts, more than the lab's prose holds"),
        ({"load_kw": "cuda"}, "load_kw='cuda': expected a dict of load_engine's keywords"),
        ({"load_kw": {"device": "cpu"}}, "engine llama.cpp takes no device=: expected its own keywords, n_ctx,"),
        ({"load_kw": {"threads": 0}}, "threads=0"),
        ({"timeout_s": "10"}, "timeout_s='10': expected a positive number of seconds (None: no limit)"),
        ({"timeout_s": float("nan")}, "timeout_s=nan: expected a positive number"),
        ({"timeout_s": 0}, "timeout_s=0: expected a positive number"),
    ],
)
def test_a_bad_budget_is_refused_before_any_process_starts(model, kw, said):
    with pytest.raises(LabError, match=re.escape(said)):
        first_requests(**{"model": model, "engines": ["llama.cpp"], **kw}, progress=False)


def test_engines_that_fail_in_their_process_are_named_in_one_line_each(model):
    """A context too small for the request is refused inside each child (after its load): each engine's LabError
    comes back as one line naming it, not a traceback of the child, and with every engine failed, one LabError."""
    said = []
    with pytest.raises(LabError) as err:
        first_requests(
            model,
            engines=["llama.cpp", "transformers"],
            loads=1,
            requests=2,
            prompt_tokens=8,
            max_new_tokens=16,
            load_kw={"n_ctx": 20},
            progress=False,
            log=said.append,
        )
    msg = str(err.value)
    assert msg.startswith("every engine failed: llama.cpp: ") and "; transformers: " in msg, msg
    assert "Traceback" not in msg and "\n" not in msg and "the context holds 20" in msg, msg
    assert [line.split(":")[0] for line in said] == ["left out", "left out"] and "llama.cpp: " in said[0]


def test_an_engine_that_fails_leaves_the_rows_of_the_others(model, monkeypatch):
    """One engine's failure (here its process's launch, made to fail for transformers alone) no longer throws away
    the rows of the engines that finished: they come back, and the failure is said and kept in attrs["failed"]."""
    from lablib.studies import first_requests as study

    real = study._in_fresh_process

    def launch(name, *args):
        if name == "transformers":
            raise LabError("transformers: its process ended without its rows (exit code -9)")
        return real(name, *args)

    monkeypatch.setattr(study, "_in_fresh_process", launch)
    said = []
    got = first_requests(
        model, engines=["transformers", "llama.cpp"], loads=1, requests=2, prompt_tokens=8, max_new_tokens=2,
        progress=False, log=said.append,
    )  # fmt: skip
    assert list(got["engine"]) == ["llama.cpp", "llama.cpp"] and list(got["request_number"]) == [1, 2]
    assert got.attrs["failed"] == {"transformers": "transformers: its process ended without its rows (exit code -9)"}
    assert said == ["left out: transformers: its process ended without its rows (exit code -9)"]


def test_a_process_past_its_time_is_stopped_and_said(model):
    with pytest.raises(LabError, match=r"llama.cpp: its process gave no rows within 0.5 s"):
        first_requests(model, engines=["llama.cpp"], loads=1, requests=2, progress=False, timeout_s=0.5)
    # the child was killed, not left running (it would be this process's child, tied to it)
    import psutil

    left = [
        p for p in psutil.Process(os.getpid()).children(recursive=True) if "first_requests" in " ".join(p.cmdline())
    ]
    assert left == []


def test_rows_round_trip_through_a_results_file(rows, tmp_path):
    """The rows' columns are declared (lablib.results.schema) and read back as written."""
    from lablib.results.schema import COLUMNS
    from lablib.results.store import load_results

    assert set(rows.columns) - set(COLUMNS) == set()
    path = tmp_path / "first.jsonl"
    rows.to_json(path, orient="records", lines=True)
    back = load_results(path)
    assert list(back["load_number"]) == list(rows["load_number"])
    pd.testing.assert_series_equal(back["ttft_s"], rows["ttft_s"])


def test_the_view_a_learner_reads_has_the_tables_numbers_with_units(rows):
    from lablib.ui.tables import first_request_view

    table, view = first_request_table(rows), first_request_view(rows)
    shown = view.data
    assert list(shown.columns) == [
        "engine",
        "load",
        "load (s)",
        "first TTFT (ms)",
        "later TTFT (ms)",
        "first / later TTFT",
        "first / later TPOT",
    ]
    assert list(shown["first TTFT (ms)"]) == pytest.approx(list(1000.0 * table["first_ttft_s"]))
    assert list(shown["first / later TTFT"]) == pytest.approx(list(table["first_over_steady_ttft"]))
    assert "the median of the 2 requests after the first" in view.to_html()


def test_two_runs_put_together_are_refused_not_mixed(rows):
    """Two runs' rows concatenated: the table took the first TTFT of one run and the median of both for the later
    ones (a ratio of 0.21 where each run had its own), and the figure drew zig-zags; both now refuse them."""
    from lablib import plots

    both = pd.concat([rows, rows.assign(ttft_s=10 * rows["ttft_s"])], ignore_index=True)
    for what in (first_request_table, plots.first_request_lines):
        with pytest.raises(
            LabError, match=r"2 rows have engine='llama.cpp', load_number=1, request_number=1; expected"
        ):
            what(both)


def test_rows_without_a_first_or_a_later_request_are_refused_in_words(rows):
    from lablib.ui.tables import first_request_view

    firsts = rows[rows["request_number"] == 1]
    with pytest.raises(LabError, match=r"llama.cpp load 1 has no later request; .* has no later request"):
        first_request_table(firsts)
    with pytest.raises(LabError, match=r"llama.cpp load 1 has no first request"):
        first_request_view(rows[rows["request_number"] > 1])
    with pytest.raises(LabError, match=r"first_request_table: no rows"):
        first_request_table(rows.iloc[:0])
    # numbers read back from a file as text are numbers
    as_text = rows.assign(
        request_number=rows["request_number"].astype(str), load_number=rows["load_number"].astype(str)
    )
    pd.testing.assert_frame_equal(first_request_table(as_text), first_request_table(rows))


def test_the_views_caption_says_how_many_later_requests_each_load_had(rows):
    from lablib.ui.tables import first_request_view

    fewer = rows[~((rows["engine"] == "transformers") & (rows["request_number"] == 3))]
    assert "the median of the 1 to 2 requests after the first" in first_request_view(fewer).to_html()


def test_on_the_second_model_an_engine_that_cannot_read_it_is_left_out_without_a_process(monkeypatch):
    """Gemma 3 270M (the lab's second model): OpenVINO's GGUF reader cannot build gemma3, said in one line before any
    process of its own starts; llama.cpp measures it."""
    from lablib.model.resolve import prepare
    from lablib.studies import first_requests as study

    started = []
    real = study._in_fresh_process
    monkeypatch.setattr(study, "_in_fresh_process", lambda name, *a: started.append(name) or real(name, *a))
    said = []
    got = first_requests(
        prepare("gemma-3-270m", log=lambda *_: None), engines=["openvino", "llama.cpp"], loads=1, requests=2,
        prompt_tokens=8, max_new_tokens=2, progress=False, log=said.append,
    )  # fmt: skip
    assert started == ["llama.cpp"] and list(got["engine"]) == ["llama.cpp"] * 2
    assert set(got["model"]) == {"gemma-3-270m"}
    assert said == [f"left out: {got.attrs['failed']['openvino']}"] and "gemma3" in said[0]


def test_a_ctrl_c_keeps_the_rows_of_the_engines_that_finished_on_disk(model, tmp_path):
    """``out``: each engine's rows are appended as its process returns them. A real SIGINT to this process while
    the second engine's process runs (sent once the first engine's rows are on disk) stops the run with
    KeyboardInterrupt, stops that process, and leaves the first engine's rows in the file, whole."""
    import signal
    import threading
    import time

    import psutil

    from lablib.results.store import load_results
    from procs import ctrl_c_raises

    out = tmp_path / "first.jsonl"
    sent = threading.Event()

    def interrupt_once_the_first_engine_is_on_disk():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if out.is_file() and len(out.read_text().splitlines()) == 2:
                sent.set()
                signal.raise_signal(signal.SIGINT)  # what Ctrl-C (a notebook's interrupt) sends
                return
            time.sleep(0.05)

    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
        threading.Thread(target=interrupt_once_the_first_engine_is_on_disk, daemon=True).start()
        first_requests(
            model, engines=["llama.cpp", "transformers"], loads=1, requests=2, prompt_tokens=8, max_new_tokens=2,
            progress=False, out=out,
        )  # fmt: skip
    assert sent.is_set()
    back = load_results(out)
    assert list(back["engine"]) == ["llama.cpp"] * 2 and list(back["request_number"]) == [1, 2]
    assert set(back["output_tokens"]) == {2} and back["ttft_s"].gt(0).all()
    time.sleep(2)  # the interrupted engine's process: stopped with the run
    left = [
        p for p in psutil.Process(os.getpid()).children(recursive=True) if "first_requests" in " ".join(p.cmdline())
    ]
    assert left == []


def test_a_results_file_that_cannot_be_written_is_refused_before_any_process_starts(model, tmp_path, monkeypatch):
    from lablib.studies import first_requests as study

    monkeypatch.setattr(study, "_in_fresh_process", lambda *a: pytest.fail("a process started"))
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(LabError, match="is a folder; expected a file name ending in .jsonl or .parquet"):
        first_requests(model, engines=["llama.cpp"], progress=False, out=tmp_path / "folder.jsonl")


def test_a_file_of_two_runs_names_them_and_one_run_of_a_file_shared_with_another_study_reads(model, tmp_path):
    """Two runs into one results file (a notebook run twice): the table names the two runs by run_id and how to
    pick one (was: rows without a run_id, told apart only by the second of their manifest's time). A file that
    holds side_by_side's rows too: the table takes the first_requests rows (was: "0 rows have ... load_number=nan")."""
    from lablib.measure.sweep import side_by_side
    from lablib.results.store import load_results

    out = tmp_path / "first.jsonl"
    small = dict(engines=["llama.cpp"], loads=1, requests=2, prompt_tokens=8, max_new_tokens=2, progress=False)
    one = first_requests(model, **small, out=out)
    two = first_requests(model, **small, out=out)
    (a,), (b,) = set(one["run_id"]), set(two["run_id"])
    assert a != b
    both = load_results(out)
    with pytest.raises(LabError) as err:
        first_request_table(both)
    assert str(err.value).endswith(
        f"and these are of 2 runs (run_id {a}, {b}): give one run's rows at a time, such as rows[rows['run_id'] == '{a}']"
    )
    assert first_request_table(both[both["run_id"] == b])["first_ttft_s"].tolist() == [two["ttft_s"].iloc[0]]
    mixed = tmp_path / "mixed.jsonl"
    side_by_side(model, engines=["llama.cpp"], max_new_tokens=2, reps=2, progress=False, out=mixed)
    first_requests(model, **small, out=mixed)
    table = first_request_table(load_results(mixed))
    assert list(table["engine"]) == ["llama.cpp"] and list(table["load_number"]) == [1]
