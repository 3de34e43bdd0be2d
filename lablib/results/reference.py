"""Reference results: rows measured on other machines, shipped in ``data/reference/``, drawn beside a learner's own.

A reference file is ``data/reference/<kind>-<machine>.jsonl``: the rows of one sweep on one real machine, each with
its manifest (the engine and its device, the CPU, the GPU where there was one). Kinds, and what writes them:

- ``context``: a context sweep (lab 02), written by ``benchmarks/gpu_check.py`` on an NVIDIA GPU or by ``lablib sweep
  context --out data/reference/context-<machine>.jsonl``;
- ``concurrency``: a concurrency sweep (lab 03), by ``benchmarks/concurrency.py`` on a CPU or by
  ``benchmarks/gpu_check.py`` on an NVIDIA GPU;
- ``roofline``: single-stream context rows with their bound columns (lab 07), by ``benchmarks/gpu_check.py``;
- ``serving-rates``: lab 05's rate sweep, by ``benchmarks/serving_reference.py``.

:func:`beside` puts a learner's rows and every reference of a kind in one frame with a ``machine`` column, for a
figure's ``facet_by="machine"``: one row of panels per machine, on matched axes. :func:`reference_rows` loads the
references alone. Nothing here measures; the rows are as their machines wrote them.
"""

from __future__ import annotations

import re
from pathlib import Path

from lablib.errors import LabError

# kind -> what writes its files (named in the message when none is there)
KINDS = {
    "context": "benchmarks/gpu_check.py, or lablib sweep context --out data/reference/context-<machine>.jsonl",
    "concurrency": "benchmarks/concurrency.py or benchmarks/gpu_check.py",
    "roofline": "benchmarks/gpu_check.py",
    "serving-rates": "benchmarks/serving_reference.py",
}
THIS_MACHINE = "this machine"
# kind -> the columns its figures draw (a reference without one draws an empty row of panels: beside() says so)
DRAWN = {
    "context": ("engine", "prompt_tokens", "prefill_tps", "tpot_s"),
    "concurrency": ("engine", "mode", "concurrency", "run_id", "t_submit", "t_last_token", "ttft_s"),
    "roofline": ("engine", "tpot_s", "decode_roof_s", "launch_floor_s"),
}


def folder() -> Path:
    """``data/reference/`` of the project (``$LABLIB_DATA/reference`` where set)."""
    from lablib.config import data_dir

    return data_dir() / "reference"


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise LabError(f"kind={kind!r}: expected one of {', '.join(map(repr, KINDS))}")
    return kind


def files(kind: str, machine: str | None = None) -> list[Path]:
    """The reference files of ``kind`` (``<kind>-*.jsonl``), sorted by name; only :func:`file_name` of ``machine``
    when it is given. A kind's name never matches another's files (``context-`` is not ``concurrency-``), and a
    run's records beside its rows (``<kind>-<machine>.runs.jsonl``, ``.server.jsonl``:
    :data:`lablib.results.store.COMPANIONS`) are not rows."""
    if machine is not None:
        p = folder() / file_name(kind, machine)
        return [p] if p.is_file() else []
    from lablib.results.store import COMPANIONS

    return sorted(p for p in folder().glob(f"{_kind(kind)}-*.jsonl") if not p.name.endswith(COMPANIONS))


def file_name(kind: str, machine: str) -> str:
    """``<kind>-<slug>.jsonl``: where a reference of ``machine`` (free text: "NVIDIA H200", "gpu NVIDIA H200")
    goes in ``data/reference/``; the slug is its words in lower case joined by dashes."""
    slug = "-".join(re.findall(r"[a-z0-9]+", machine.lower()))
    if not slug:
        raise LabError(f"machine={machine!r}: expected a name with letters or digits (a GPU's or a CPU's)")
    return f"{_kind(kind)}-{slug}.jsonl"


def machine_label(row) -> str:
    """What a row computed on, in a few words. A server's row: the server's device as the lab read it
    (``server_device``: "NVIDIA H200, 140 GiB, 31/31 layers"), or "a server (device unknown)" for one at any
    URL. A row computed on a GPU (``device`` other than ``cpu``): the GPU's name (NVML's ``gpu_name``, else the
    ``accelerator`` the machine lists), else "<device> on <CPU>"; never the CPU alone. Else the CPU's model
    and physical cores, the ``hostname`` where no CPU is recorded. ``row``: a mapping (a DataFrame row, a dict)."""

    def get(key):
        v = row.get(key)
        return None if v is None or v != v else v  # NaN: a column other rows have

    cpu, cores = get("cpu_model"), get("cores")
    on_cpu = f"{cpu}, {int(cores)} cores" if cpu and cores else cpu
    server, device = get("server_device"), get("device")
    if server:
        return "a server (device unknown)" if str(server).lower() == "unknown" else str(server)
    if device and str(device).lower() != "cpu":
        found = get("gpu_name") or get("accelerator")
        return str(found) if found else f"{device} on {on_cpu or get('hostname') or 'an unknown machine'}"
    return str(on_cpu or get("hostname") or "unknown machine")


def reference_rows(kind: str, machine: str | None = None, missing_ok: bool = False):
    """The rows of every reference file of ``kind`` (or of ``machine``'s only), in one DataFrame
    (:func:`lablib.results.store.load_results`), with a ``machine`` column: "reference: " and the row's
    :func:`machine_label`. LabError naming the folder, what is there and what writes such a file when none is
    there; an empty DataFrame instead with ``missing_ok``."""
    import pandas as pd

    from lablib.results.store import load_results

    found = files(kind, machine)
    if not found:
        if missing_ok:
            return pd.DataFrame()
        there = ", ".join(p.name for p in sorted(folder().glob("*.jsonl"))) or "none"
        want = file_name(kind, machine) if machine is not None else f"{kind}-<machine>.jsonl"
        raise LabError(
            f"no {kind} reference {'of ' + repr(machine) + ' ' if machine else ''}in {folder()} (there: {there}); "
            f"expected {want}, written by {KINDS[kind]}"
        )
    rows = load_results(*found)
    labels = ["reference: " + machine_label(r) for r in rows.to_dict("records")]
    # two files of one label (two 2-core EPYCs, two H200 hosts) stay two machines: the file's <machine> added
    files_of = {}
    for label, name in zip(labels, rows["source_file"]):
        files_of.setdefault(label, set()).add(name)
    rows["machine"] = [
        f"{label} ({Path(name).name[len(kind) + 1 : -len('.jsonl')]})" if len(files_of[label]) > 1 else label
        for label, name in zip(labels, rows["source_file"])
    ]
    return rows


def beside(df, kind: str, log=print):
    """``df`` (a learner's rows) and every reference of ``kind`` under it, in one DataFrame with a ``machine``
    column: "this machine: <its label>" for ``df``'s rows, "reference: <label>" for the others. For
    ``facet_by="machine"`` (:func:`lablib.plots.context_lines`, :func:`lablib.plots.concurrency_lines`). Says
    through ``log`` which references it added, or that there are none (then the frame is ``df``'s rows alone)."""
    import pandas as pd

    if not len(df):
        raise LabError("beside(df, ...): df has no rows; run the sweep first")
    own = df.assign(machine=[f"{THIS_MACHINE}: {machine_label(r)}" for r in df.to_dict("records")])
    ref = reference_rows(kind, missing_ok=True)
    if not len(ref):
        log(
            f"no {kind} reference in {folder()} ({kind}-<machine>.jsonl, written by {KINDS[kind]}): "
            "only this machine is drawn"
        )
        return own
    for name, rows in ref.groupby("source_file", sort=False):
        log(f"reference: {len(rows)} rows from {Path(name).name} ({', '.join(rows['machine'].unique())})")
        lacking = [c for c in DRAWN.get(kind, ()) if c not in rows.columns or rows[c].isna().all()]
        if lacking:
            log(
                f"  {Path(name).name} has no values of {', '.join(lacking)}: its panels stay empty (expected rows "
                f"as {KINDS[kind]} writes them)"
            )
    return pd.concat([own, ref], ignore_index=True)
