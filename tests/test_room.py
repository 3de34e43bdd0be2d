"""A workshop room's results: every row names its machine by the machine's own id, and the room's figure, table
and merge tell apart machines that share a hostname (two laptops both "MacBook-Pro.local", cloud VMs all "vm")."""

from __future__ import annotations

import hashlib
import hmac
import re
import subprocess
import sys

import machineid
import pandas as pd
import pytest

from lablib.cli import main
from lablib.machine.identity import machine_id
from lablib.results.schema import flatten_manifest
from lablib.results.store import ResultsWriter, load_results, run_manifest
from lablib.results.tables import machine_names, manifest_table, shared_hostnames
from lablib.ui import report
from tests.test_plots import _figures, concurrency_df


def test_every_row_names_this_machine_by_its_hashed_id():
    mid = machine_id()
    assert re.fullmatch(r"[0-9a-f]{12}", mid), mid
    raw = machineid.id()  # the OS's own id: /etc/machine-id here
    assert mid == hmac.new(raw.encode(), b"lablib", hashlib.sha256).hexdigest()[:12]
    assert mid not in raw.lower()  # not the OS's id itself, which a learner's handed-in file would carry
    child = subprocess.run(
        [sys.executable, "-c", "from lablib.machine.identity import machine_id; print(machine_id())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == mid  # the same in every process: one machine's runs group together
    row = flatten_manifest(run_manifest({"name": "transformers", "device": "cpu"}, {"id": "m"}))
    assert row["machine_id"] == mid and row["hostname"]


def _write(path, machine, hostname="vm", decode=1.0):
    """A machine's concurrency rows (llama.cpp and MLX at 1 and 2 clients, 4 requests of 11 tokens each, every
    decode ``decode`` seconds) in ``path``; ``machine``: its machine_id, or None for rows written before the lab
    recorded one. Run ids are the machine's own (the lab's are random)."""
    df = concurrency_df(hostname=hostname, cpu_model="AMD EPYC", levels=(1, 2), decode=decode)
    df["run_id"] = f"{path.stem}-" + df["run_id"]
    if machine is not None:
        df["machine_id"] = machine
    w = ResultsWriter(path)
    for r in df.to_dict("records"):
        w.append(r)


def _batched_tps(fig, facet_row: int) -> float:
    """MLX's batched output tokens/s at one client in the room figure's ``facet_row`` (1-based): the first panel of
    that row."""
    axis = "y" if facet_row == 1 else f"y{3 * (facet_row - 1) + 1}"
    return [t for t in fig.data if t.name == "mlx · batched" and t.yaxis == axis][0].y[0]


def test_a_room_of_machines_that_share_a_hostname_shows_each_machine(tmp_path, capsys):
    """Three files handed in by three cloud VMs, all "vm" with the same CPU: two record their machine ids, one
    was written before the lab recorded them. The merge, the room's figure and its table show three machines,
    named by their files (the participants' names), each with its own numbers; with the hostname alone the
    figure drew one machine's lines from all three."""
    _write(tmp_path / "anna.jsonl", "aaaaaa111111", decode=1.0)
    _write(tmp_path / "ben.jsonl", "bbbbbb222222", decode=0.5)
    _write(tmp_path / "old.jsonl", None, decode=0.25)
    files = [str(tmp_path / f) for f in ("anna.jsonl", "ben.jsonl", "old.jsonl")]
    assert main(["merge", *files, "--out", str(tmp_path / "room.jsonl")]) == 0
    said = capsys.readouterr().out
    assert "3 machine(s)" in said
    assert "3 machines share the hostname 'vm'; the report names them ['vm · anna.jsonl', 'vm · ben" in said

    df = load_results(tmp_path / "room.jsonl")
    names = machine_names(df)
    assert sorted(set(names)) == ["vm · anna.jsonl", "vm · ben.jsonl", "vm · old.jsonl"]
    assert shared_hostnames(df) == {"vm": ["vm · anna.jsonl", "vm · ben.jsonl", "vm · old.jsonl"]}

    conc = [f for f in report.report_figures(df) if "Output tokens/s of the run" in str(f.layout.annotations)][0]
    rows = {a.text: a for a in conc.layout.annotations if a.textangle == 90}  # plotly's row titles
    assert set(rows) == set(names)
    # each machine's own throughput: 4 requests x 11 tokens, one after another at one client: 4 x (0.5 s prefill
    # + the decode) of makespan
    order = list(dict.fromkeys(names))
    for name, decode in (("vm · anna.jsonl", 1.0), ("vm · ben.jsonl", 0.5), ("vm · old.jsonl", 0.25)):
        assert _batched_tps(conc, order.index(name) + 1) == pytest.approx(44 / (4 * (0.5 + decode)))

    table = manifest_table(df)
    assert list(table.columns[:3]) == ["machine", "hostname", "engine"]
    assert sorted(table["machine"].unique()) == sorted(set(names)) and len(table) == 6  # 3 machines x 2 engines
    assert _figures(report.report_html(df, tmp_path / "room.html").read_text()) == 2


def test_one_machines_files_are_one_machine_and_distinct_hostnames_name_theirs(tmp_path, capsys):
    """A learner hands in two files of one laptop (lab 03's and the room's): one machine, named by its hostname;
    beside another machine of that hostname, by its id (two files name it), the other by its file.
    A room whose hostnames differ: each machine is its hostname, as before, and no table gains a column."""
    _write(tmp_path / "lab03.jsonl", "aaaaaa111111")
    _write(tmp_path / "room.jsonl", "aaaaaa111111")
    one = load_results(tmp_path / "lab03.jsonl", tmp_path / "room.jsonl")
    assert set(machine_names(one)) == {"vm"} and shared_hostnames(one) == {}
    _write(tmp_path / "ben.jsonl", "bbbbbb222222", decode=0.5)
    files = [str(tmp_path / f) for f in ("lab03.jsonl", "room.jsonl", "ben.jsonl")]
    assert main(["merge", *files, "--out", str(tmp_path / "all.jsonl")]) == 0
    assert "2 machines share the hostname 'vm'; the report names them" in capsys.readouterr().out
    both = load_results(tmp_path / "all.jsonl")  # a merged file keeps each row's first file
    assert shared_hostnames(both) == {"vm": ["vm · ben.jsonl", "vm · id aaaaaa"]}
    assert (machine_names(both)[both["machine_id"] == "aaaaaa111111"] == "vm · id aaaaaa").all()

    _write(tmp_path / "a.jsonl", "aaaaaa111111", hostname="anna-laptop")
    _write(tmp_path / "b.jsonl", None, hostname="ben-laptop")
    two = load_results(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert list(dict.fromkeys(machine_names(two))) == ["anna-laptop", "ben-laptop"]
    assert "machine" not in manifest_table(two).columns
    assert machine_names(pd.DataFrame({"engine": ["x"]})).tolist() == ["unknown machine"]


def test_what_a_room_hands_in_does_not_fool_the_names(tmp_path):
    """Found by a helper trying to break the names: one file name in two folders without ids (was one machine,
    named by a path fragment as an "id"); ids on some rows of a file only (was two machines); a hostname missing
    on some rows of a machine (was a second machine named by its CPU); two ids alike in their first six digits
    (was one name); a merged .parquet merged again with a file it holds (was that file's rows twice); a
    ``machine`` column already there (the manifest table replaced it)."""
    from lablib.results.store import merge_results

    for who in ("anna", "ben"):
        (tmp_path / who).mkdir()
        _write(tmp_path / who / "room.jsonl", None, decode=1.0 if who == "anna" else 0.5)
    two = load_results(tmp_path / "anna" / "room.jsonl", tmp_path / "ben" / "room.jsonl")
    assert sorted(set(machine_names(two))) == ["vm · anna/room.jsonl", "vm · ben/room.jsonl"]

    _write(tmp_path / "mixed.jsonl", "aaaaaa111111")
    mixed = load_results(tmp_path / "mixed.jsonl", tmp_path / "anna" / "room.jsonl")
    mixed.loc[mixed["engine"] == "mlx", "machine_id"] = None  # older runs appended to the same file
    assert mixed.loc[mixed["engine"] == "mlx", "source_file"].nunique() == 2
    names = machine_names(mixed)
    assert sorted(set(names)) == ["vm · mixed.jsonl", "vm · room.jsonl"]  # two machines, not three

    nohost = load_results(tmp_path / "mixed.jsonl")
    nohost.loc[nohost["engine"] == "mlx", "hostname"] = None
    assert set(machine_names(nohost)) == {"vm"}

    _write(tmp_path / "c1.jsonl", "abcdef111111")
    _write(tmp_path / "c2.jsonl", "abcdef111111")
    _write(tmp_path / "d1.jsonl", "abcdef222222")
    _write(tmp_path / "d2.jsonl", "abcdef222222")
    alike = load_results(*(tmp_path / f"{n}.jsonl" for n in ("c1", "c2", "d1", "d2")))
    assert sorted(set(machine_names(alike))) == ["vm · id abcdef111111", "vm · id abcdef222222"]

    merge_results([tmp_path / "c1.jsonl", tmp_path / "d1.jsonl"], tmp_path / "m.parquet")
    again = merge_results([tmp_path / "m.parquet", tmp_path / "c1.jsonl"], tmp_path / "m2.jsonl")
    assert len(again) == len(load_results(tmp_path / "c1.jsonl", tmp_path / "d1.jsonl"))

    beside = pd.concat([two.assign(machine="this machine: mine"), alike.assign(machine="reference: theirs")])
    assert sorted(manifest_table(beside)["machine"].unique()) == ["reference: theirs", "this machine: mine"]


def test_a_room_that_hands_in_only_context_rows_draws_each_machine_apart(tmp_path):
    """Two VMs of hostname "vm" hand in context sweeps only; ben's prefill takes twice anna's. The report draws
    each machine's split in its own figure, titled by its name, and the context lines a row per machine, each
    with its own prefill speed; before, both machines' rows went into one median."""
    from tests.test_plots import context_df

    for who, slow in (("anna", 1.0), ("ben", 2.0)):
        df = context_df(engines=("llama.cpp",), lengths=(64, 256), reps=3).assign(hostname="vm")
        df["prefill_s"] *= slow
        df["prefill_tps"] /= slow
        df["machine_id"] = f"{who[0] * 6}{'1' * 6}"
        w = ResultsWriter(tmp_path / f"{who}.jsonl")
        for r in df.to_dict("records"):
            w.append(r)
    rows = load_results(tmp_path / "anna.jsonl", tmp_path / "ben.jsonl")
    figs = report.report_figures(rows)
    titles = [f.layout.title.text.split(":")[0] for f in figs[:2]]
    assert titles == ["vm · anna.jsonl", "vm · ben.jsonl"]
    lines = figs[2]
    assert [a.text for a in lines.layout.annotations if a.text.startswith("vm")] == titles  # a row each
    prefill = {t.yaxis: dict(zip(t.x, t.y)) for t in lines.data if t.name == "llama.cpp" and t.xaxis in ("x", "x3")}
    anna, ben = prefill["y"], prefill["y3"]
    assert anna[64] == pytest.approx(1000.0 / 1.1, rel=1e-9)  # context_df: the median of 1000 tok/s / (1 + rep/10)
    assert ben[64] == pytest.approx(anna[64] / 2, rel=1e-9)
    assert len(figs) == 3  # no concurrency rows: no concurrency figure


def test_another_machines_rows_without_its_ceilings_are_not_held_to_this_machines(model, tmp_path):
    """A room's rows of ben's laptop, which never measured its ceilings (the room's run comes before lab 07), carry
    no measured_* columns. The bound on the instructor's machine was this machine's ceilings for every row: ben's
    rows were held against a machine they never ran on. Now only this machine's rows get a bound; ben's stay empty,
    and the result says why."""
    from lablib.machine.identity import hardware_info, machine_key
    from lablib.studies.roofline import add_bound_columns, of_this_machine
    from tests.test_plots import context_df

    here = context_df(engines=("llama.cpp",), lengths=(64,), reps=1).assign(
        hostname=hardware_info()["hostname"], machine_key=machine_key(), machine_id=machine_id(), device="cpu"
    )
    ben = here.assign(hostname="vm", machine_key="0123456789abcdef", machine_id="bbbbbb222222")
    rows = pd.concat([here, ben], ignore_index=True).assign(model_sha256=model.sha256)
    assert [of_this_machine(r) for r in rows.to_dict("records")] == [True, False]
    bound = add_bound_columns(rows, model)
    assert bound["prefill_bound_tps"].notna().tolist() == [True, False]
    assert bound["decode_pct_of_bound"].notna().tolist() == [True, False]
    assert bound.attrs["unbounded"] == [
        "rows computed on another machine's CPU (vm) carry no ceilings of it (measured_* columns), and this "
        "machine's are not its: their bound columns stay empty; run `lablib roofline` on that machine, and the rows "
        "it writes after carry its ceilings"
    ]
    # the room's report says it under its bound table (this machine's ceilings are cached by add_bound_columns now)
    page = report.report_html(rows.assign(sweep="context"), tmp_path / "room.html").read_text()
    assert "rows computed on another machine&#x27;s CPU (vm) carry no ceilings of it" in page
    # this machine's key with another machine's id (a VM cloned with its disk: one hostname, CPU and key) is not it
    assert not of_this_machine({"machine_key": machine_key(), "machine_id": "bbbbbb222222"})
    # this machine's id under another key (a Mac renamed by its network, new CPU flags, another CPU quota) is it
    if machine_id() is not None:
        assert of_this_machine({"machine_key": "fffffffffffffff0", "machine_id": machine_id(), "hostname": "x"})
    # rows written before the key was recorded: by their hostname and CPU; rows that name nothing: this machine's
    hw = hardware_info()
    assert of_this_machine({"hostname": hw["hostname"], "cpu_model": hw["cpu_model"]})
    assert not of_this_machine({"hostname": "vm-x"})
    assert not of_this_machine({"hostname": hw["hostname"], "cpu_model": "AMD EPYC" + hw["cpu_model"]})
    assert of_this_machine({})


def test_another_machines_rows_are_held_to_what_they_carry_or_to_their_own_gpus_published_peaks(model, monkeypatch):
    """Found by a helper: (1) another machine whose torch ran no int8 product records bandwidth and float32 only; its
    llama.cpp rows (int8) got no bound, where peak_flops takes float32's; (2) another machine's GPU row was held to
    this machine's GPU, measured through torch (here a stand-in H100 for the measurement only)."""
    import lablib.machine.device_ceilings as dc
    from lablib.studies.roofline import add_bound_columns
    from tests.test_plots import context_df

    other = dict(hostname="bens-pc", machine_key="0123456789abcdef", machine_id="bbbbbb222222")
    rows = context_df(engines=("llama.cpp",), lengths=(64,), reps=1).assign(model_sha256=model.sha256, **other)
    own = add_bound_columns(
        rows.assign(device="cpu", measured_bandwidth_gbps=50.0, measured_float32_gflops=500.0), model
    )
    assert own["bound_bytes_per_s"].tolist() == [50e9] and own["bound_flop_per_s"].tolist() == [500e9]
    assert own.attrs["unbounded"] == []

    h100 = {"name": "H100", "bytes_per_s": 3.0e12, "flop_per_s": {"float32": 5e13, "int8": 1.4e15}, "time": "now"}
    monkeypatch.setattr(dc, "measure_device", lambda kind, *a, **k: h100)
    gpu = add_bound_columns(rows.assign(device="cuda offload", accelerator="NVIDIA GeForce RTX 4090"), model)
    assert gpu["bound_bytes_per_s"].tolist() == [dc.published_peaks_for("NVIDIA GeForce RTX 4090")["bytes_per_s"]]
    assert gpu["bound_bytes_per_s"].tolist() == [1.008e12]  # the RTX 4090's, not this machine's H100
