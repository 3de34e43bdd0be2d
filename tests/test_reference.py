"""Reference results beside a learner's own (lablib.results.reference; labs 02, 03, 07): which files are a kind's,
what each row ran on in words, the learner's rows and the references in one frame, and the figures that draw
them one machine per row of panels, each against its own machine. The shipped CPU reference
(data/reference/concurrency-ci-2cpu-amd-epyc.jsonl) is real; a real llama.cpp sweep is drawn beside it."""

import json
from pathlib import Path

import pandas as pd
import pytest

from lablib import plots
from lablib.errors import LabError
from lablib.plots import roofline as roofline_plots
from lablib.results import reference
from lablib.results.tables import bound_table, concurrency_summary, context_medians
from tests.test_plots_readable import concurrency_rows, context_rows

SHIPPED = "concurrency-ci-2cpu-amd-epyc.jsonl"


@pytest.fixture
def ref_dir(tmp_path, monkeypatch):
    """An empty data/ folder with its reference/ (LABLIB_DATA)."""
    monkeypatch.setenv("LABLIB_DATA", str(tmp_path))
    (tmp_path / "reference").mkdir()
    return tmp_path / "reference"


def write_rows(path, df):
    path.write_text("".join(json.dumps(r) + "\n" for r in df.to_dict("records")))


def test_machine_label_names_the_device_a_row_computed_on():
    gpu_box = {"cpu_model": "Intel Xeon Platinum 8480+", "cores": 16, "gpu_name": "NVIDIA H200", "hostname": "h"}
    assert reference.machine_label({**gpu_box, "device": "cuda"}) == "NVIDIA H200"
    # the same machine's CPU row: its CPU, not the GPU beside it
    assert reference.machine_label({**gpu_box, "device": "cpu"}) == "Intel Xeon Platinum 8480+, 16 cores"
    # a GPU row is never labelled with the CPU alone: without NVML (no gpu_name) the accelerator nvidia-smi or the
    # OS lists, else the device on that CPU
    no_nvml = {**gpu_box, "gpu_name": None, "accelerator": "NVIDIA H200"}
    assert reference.machine_label({**no_nvml, "device": "cuda"}) == "NVIDIA H200"
    assert reference.machine_label({**no_nvml, "device": "metal", "accelerator": "Apple M2 (Metal)"}) == (
        "Apple M2 (Metal)"
    )
    assert reference.machine_label({**no_nvml, "device": "cuda", "accelerator": None}) == (
        "cuda on Intel Xeon Platinum 8480+, 16 cores"
    )
    # a server's row: the server's device as the lab read it, not the client's; a server at any URL: unknown
    server = {**gpu_box, "device": "cuda", "server_device": "NVIDIA L4, 22 GiB, 31/31 layers"}
    assert reference.machine_label(server) == "NVIDIA L4, 22 GiB, 31/31 layers"
    assert reference.machine_label({**server, "device": "unknown", "server_device": "unknown"}) == (
        "a server (device unknown)"
    )
    # a CPU machine's row (no GPU column, or NaN where other rows have one); the hostname when nothing else is known
    assert reference.machine_label({"cpu_model": "AMD EPYC", "cores": 2.0, "gpu_name": float("nan")}) == (
        "AMD EPYC, 2 cores"
    )
    assert reference.machine_label({"cpu_model": "AMD EPYC"}) == "AMD EPYC"
    assert reference.machine_label({"hostname": "laptop"}) == "laptop"
    assert reference.machine_label({}) == "unknown machine"


def test_file_names_are_a_kinds_and_only_its():
    assert reference.file_name("roofline", "NVIDIA H200") == "roofline-nvidia-h200.jsonl"
    assert reference.file_name("context", "cpu dry run") == "context-cpu-dry-run.jsonl"
    with pytest.raises(LabError, match=r"kind='speed': expected one of 'context', 'concurrency'"):
        reference.file_name("speed", "x")
    with pytest.raises(LabError, match=r"machine='--': expected a name with letters or digits"):
        reference.file_name("context", "--")
    # the shipped folder: lab 03's CPU reference is a concurrency file, not a context one
    assert [p.name for p in reference.files("concurrency")] == [SHIPPED]
    assert all(p.name.startswith("serving-rates-") for p in reference.files("serving-rates"))
    assert SHIPPED not in [p.name for p in reference.files("context")]


def test_a_kinds_files_are_its_rows_only(ref_dir):
    """Files as gpu_check and a sweep's --out leave them: a kind's rows, its run records beside them (not rows),
    another kind's files; a machine named as free text finds its file."""
    for name in (
        "context-nvidia-h200.jsonl",
        "context-nvidia-h200.runs.jsonl",
        "context-a.jsonl",
        "concurrency-nvidia-h200.jsonl",
        "contextual-x.jsonl",
        "roofline-nvidia-h200.jsonl",
    ):
        (ref_dir / name).write_text("")
    assert [p.name for p in reference.files("context")] == ["context-a.jsonl", "context-nvidia-h200.jsonl"]
    assert [p.name for p in reference.files("context", "NVIDIA H200")] == ["context-nvidia-h200.jsonl"]
    assert reference.files("context", "NVIDIA H100") == []
    assert [p.name for p in reference.files("concurrency")] == ["concurrency-nvidia-h200.jsonl"]
    with pytest.raises(LabError, match=r"no context reference of 'NVIDIA H100' .*expected context-nvidia-h100.jsonl"):
        reference.reference_rows("context", "NVIDIA H100")


def test_no_reference_says_so_and_draws_this_machine_alone(ref_dir):
    said = []
    own = context_rows(lengths=(64,), reps=2)
    both = reference.beside(own, "context", log=said.append)
    assert len(both) == len(own) and set(both["machine"]) == {"this machine: unknown machine"}
    assert said == [
        f"no context reference in {ref_dir} (context-<machine>.jsonl, written by benchmarks/gpu_check.py, or "
        "lablib sweep context --out data/reference/context-<machine>.jsonl): only this machine is drawn"
    ]
    with pytest.raises(LabError, match=r"no roofline reference in .*\(there: none\); expected roofline-<machine>"):
        reference.reference_rows("roofline")
    assert reference.reference_rows("roofline", missing_ok=True).empty
    with pytest.raises(LabError, match="df has no rows"):
        reference.beside(own.iloc[0:0], "context")


def test_context_lines_draw_a_reference_on_its_own_row_on_the_same_scales(ref_dir):
    """A GPU's context rows (as benchmarks/gpu_check.py writes them: device cuda, gpu_name) under a learner's: one
    row of panels per machine, each drawing its own machine's medians, each metric on one y scale."""
    own = context_rows(lengths=(64, 256)).assign(cpu_model="AMD EPYC", cores=2, device="cpu")
    gpu = context_rows(lengths=(128, 1024)).assign(cpu_model="Intel Xeon", cores=16, device="cuda", gpu_name="H200")
    gpu = gpu[gpu.engine == "transformers"]
    write_rows(ref_dir / reference.file_name("context", "H200"), gpu)
    said = []
    both = reference.beside(own, "context", log=said.append)
    assert said == ["reference: 6 rows from context-h200.jsonl (reference: H200)"]
    # a reference without a column its figure draws is said, not drawn as an empty row of panels without a word
    write_rows(ref_dir / "context-old.jsonl", gpu.drop(columns=["prefill_tps"]).assign(tpot_s=None))
    said.clear()
    reference.beside(own, "context", log=said.append)
    assert said[-1] == (
        "  context-old.jsonl has no values of prefill_tps, tpot_s: its panels stay empty (expected rows as "
        f"{reference.KINDS['context']} writes them)"
    )
    (ref_dir / "context-old.jsonl").unlink()
    assert list(dict.fromkeys(both["machine"])) == ["this machine: AMD EPYC, 2 cores", "reference: H200"]
    fig = plots.context_lines(both, facet_by="machine")
    assert [a.text for a in fig.layout.annotations if a.text.startswith(("this", "reference"))] == [
        "this machine: AMD EPYC, 2 cores",
        "reference: H200",
    ]
    med = context_medians(both, "machine").set_index(["machine", "engine", "prompt_tokens"])
    for t in fig.data:
        machine = "this machine: AMD EPYC, 2 cores" if t.yaxis in ("y", "y2") else "reference: H200"
        key = "prefill_tps" if t.yaxis in ("y", "y3") else "tpot_ms"
        assert list(t.y) == [med.loc[(machine, t.name, n), key] for n in t.x], (t.name, t.yaxis)
    assert {t.yaxis for t in fig.data if t.name == "transformers"} == {"y", "y2", "y3", "y4"}
    assert {t.yaxis for t in fig.data if t.name == "mlx"} == {"y", "y2"}  # the reference has transformers only
    assert [t.showlegend for t in fig.data].count(True) == 3  # one legend entry per engine
    assert fig.layout.yaxis3.matches == "y" and fig.layout.yaxis4.matches == "y2"  # one scale per metric
    with pytest.raises(LabError, match=r"facet_by='engine': expected None or one of 'hostname', 'cpu_model'"):
        plots.context_lines(both, facet_by="engine")
    # rows not put beside a reference: one row of panels per machine they came from (a room's: its hostnames)
    room = pd.concat([own.assign(hostname="anna-laptop"), own.assign(hostname="ben-laptop")])
    fig = plots.context_lines(room, facet_by="machine")
    assert [a.text for a in fig.layout.annotations if a.textangle == 90] == ["anna-laptop", "ben-laptop"]
    with pytest.raises(LabError, match=r"needs the columns hostname"):
        plots.context_lines(own.drop(columns="hostname", errors="ignore"), facet_by="hostname")
    # the learner's machine on top whatever its prompt lengths: the rows' order, not the medians' sort
    later = reference.beside(context_rows(lengths=(512, 2048)).assign(cpu_model="AMD EPYC", cores=2), "context")
    fig = plots.context_lines(later, facet_by="machine")
    assert [a.text for a in fig.layout.annotations if a.text.startswith(("this", "reference"))] == [
        "this machine: AMD EPYC, 2 cores",
        "reference: H200",
    ]


def test_a_real_sweep_beside_the_shipped_cpu_reference(model):
    """Lab 03's cell: a real llama.cpp closed loop here, the shipped two-core reference under it; each machine's
    row of panels draws that machine's runs (the reference's, as concurrency_summary reads its file alone)."""
    from lablib.measure.sweep import concurrency_sweep

    own = concurrency_sweep(
        model, engines=["llama.cpp"], concurrency=[1, 2], prompt_tokens=16, max_new_tokens=3, progress=False
    )
    said = []
    both = reference.beside(own, "concurrency", log=said.append)
    shipped = reference.reference_rows("concurrency")
    assert len(shipped) == 180 and len(both) == len(own) + 180
    assert said == [f"reference: 180 rows from {SHIPPED} (reference: AMD EPYC, 2 cores)"]
    mine = both.loc[: len(own) - 1, "machine"].unique()
    assert len(mine) == 1 and mine[0].startswith("this machine: ")
    fig = plots.concurrency_lines(both, facet_by="machine")
    rows = {a.text for a in fig.layout.annotations}
    assert {mine[0], "reference: AMD EPYC, 2 cores"} <= rows
    want = concurrency_summary(shipped.assign(machine="r"), "machine").set_index(["engine", "mode", "concurrency"])
    drawn = [t for t in fig.data if t.yaxis == "y4"]  # the reference's output tokens/s panel
    assert {t.name for t in drawn} == {
        f"{e} · {m}"
        for e in ("llama.cpp", "transformers", "mlx")
        for m in (
            "serial",
            "batched",
        )
    }
    for t in drawn:
        engine, mode = t.name.split(" · ")
        assert list(t.y) == [want.loc[(engine, mode, c), "output_tps"] for c in t.x]


def test_step_figure_and_bound_table_hold_each_machine_against_its_own_lines():
    """Rows of two machines: one bar group per engine and machine, each with its own machine's roof and floor;
    the bound table per machine; the roofline refuses to draw two machines' ceilings as one."""
    rows = []
    for machine, (tpot, roof, floor) in {
        "this machine: CPU": (0.009, 0.006, 0.002),
        "reference: GPU": (
            0.018,
            0.0001,
            0.017,
        ),
    }.items():
        for engine in ("llama.cpp", "transformers"):
            for f in (1.0, 1.1, 1.2):
                rows.append(
                    dict(
                        machine=machine,
                        engine=engine,
                        prompt_tokens=64,
                        tpot_s=tpot * f,
                        decode_roof_s=roof,
                        launch_floor_s=floor,
                        prefill_tps=1000.0 * f,
                        prefill_bound_tps=5000.0,
                        prefill_pct_of_bound=20.0 * f,
                        decode_tps=1 / (tpot * f),
                        decode_bound_tps=1 / roof,
                        decode_pct_of_bound=100 * roof / (tpot * f),
                    )
                )
    df = pd.DataFrame(rows)
    fig = roofline_plots.step_figure(df)
    measured = next(t for t in fig.data if t.name.startswith("measured"))
    assert list(measured.y) == [
        "transformers<br>reference: GPU",
        "llama.cpp<br>reference: GPU",
        "transformers<br>this machine: CPU",
        "llama.cpp<br>this machine: CPU",
    ]  # the first on top
    assert [round(x, 3) for x in measured.x] == [19.8, 19.8, 9.9, 9.9]  # medians, ms
    floor = next(t for t in fig.data if t.name.startswith("launch floor"))
    assert [round(x, 3) for x in floor.x] == [17.0, 17.0, 2.0, 2.0]
    one = roofline_plots.step_figure(df[df.machine == "reference: GPU"])
    assert list(next(iter(one.data)).y) == ["transformers", "llama.cpp"]
    table = bound_table(df)
    assert list(table.columns[:3]) == ["machine", "engine", "prompt_tokens"]
    # rows that record a weights choice (transformers') and rows of an engine with one (llama.cpp's: none)
    chosen = df.assign(weights=df.engine.map({"transformers": "bfloat16"}), dtype=df.engine.map({"llama.cpp": "Q4_1"}))
    assert bound_table(chosen).groupby("engine")["weights"].unique().map(list).to_dict() == {
        "llama.cpp": ["Q4_1"],  # the type it computes its weights in: was an empty cell
        "transformers": ["bfloat16"],
    }
    assert table.set_index(["machine", "engine"])["decode_pct_of_bound"].round(3).to_dict() == {
        ("this machine: CPU", "llama.cpp"): round(100 * 0.006 / 0.0099, 3),
        ("this machine: CPU", "transformers"): round(100 * 0.006 / 0.0099, 3),
        ("reference: GPU", "llama.cpp"): round(100 * 0.0001 / 0.0198, 3),
        ("reference: GPU", "transformers"): round(100 * 0.0001 / 0.0198, 3),
    }
    with pytest.raises(LabError, match=r"roofline: rows of 2 machines .*give one machine's rows"):
        roofline_plots.roofline(
            df.assign(
                compute_dtype="float32",
                bound_bytes_per_s=1e10,
                bound_flop_per_s=1e11,
                prefill_intensity=50.0,
                prefill_flop_per_s=1e10,
                decode_intensity=1.0,
                decode_flop_per_s=1e9,
            )
        )


def test_concurrency_facets_by_machine_with_hand_built_rows(ref_dir):
    """The reference's own rows, not this machine's, fill its row of panels (concurrency_rows: mlx 100x slower)."""
    own = concurrency_rows(levels=(1, 2)).assign(cpu_model="AMD EPYC", cores=2)
    gpu = concurrency_rows(levels=(1, 4)).assign(cpu_model="Xeon", cores=16, device="cuda", gpu_name="NVIDIA H200")
    gpu = gpu.assign(run_id="gpu-" + gpu["run_id"])
    write_rows(ref_dir / reference.file_name("concurrency", "NVIDIA H200"), gpu)
    fig = plots.concurrency_lines(reference.beside(own, "concurrency", log=lambda *_: None), facet_by="machine")
    by_row = {}
    for t in fig.data:
        by_row.setdefault(t.yaxis, set()).update(int(x) for x in t.x)
    assert by_row["y"] == {1, 2} and by_row["y4"] == {1, 4}
    assert fig.layout.yaxis4.matches == "y"


def test_machines_of_one_label_stay_apart_and_a_cpu_file_beside_a_gpu_one_keeps_its_label(ref_dir):
    """The shipped two-core file beside a GPU's (NaN gpu_name in the CPU rows once concatenated) and beside another
    two-core EPYC's: three machines, three labels, each file's rows under its own."""
    shipped = pd.read_json(Path(__file__).resolve().parents[1] / "data" / "reference" / SHIPPED, lines=True)
    write_rows(ref_dir / SHIPPED, shipped)
    write_rows(ref_dir / "concurrency-other-epyc.jsonl", shipped.assign(hostname="other"))
    gpu = concurrency_rows(levels=(1, 4)).assign(cpu_model="Xeon", cores=16, device="cuda", gpu_name="NVIDIA H200")
    write_rows(ref_dir / "concurrency-nvidia-h200.jsonl", gpu)
    rows = reference.reference_rows("concurrency")
    assert rows.groupby("machine", sort=False).size().to_dict() == {
        "reference: AMD EPYC, 2 cores (ci-2cpu-amd-epyc)": 180,
        "reference: NVIDIA H200": len(gpu),
        "reference: AMD EPYC, 2 cores (other-epyc)": 180,
    }
    assert set(rows.loc[rows.hostname == "other", "machine"]) == {"reference: AMD EPYC, 2 cores (other-epyc)"}
