"""Rows to tables: medians, percentiles and per-run numbers, as pandas DataFrames.

Every function is a pure function of tidy rows (one row per measured request, the
columns of :mod:`lablib.results.schema`); the figures in :mod:`lablib.plots` draw these
tables. Rows with an ``error`` are left out (a run summary counts them: ``errors``). Seconds unless a
name says otherwise. One run in numbers is :func:`run_summary` (:data:`PERCENTILES`, the one naming
``<metric>_p<q>_s``); :func:`need` is the one column check of every table and figure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from lablib.errors import LabError, shown
from lablib.results.schema import (
    CLOCKS,
    DISTRIBUTIONS,
    KNOWN,
    MANIFEST_SUMMARY,
    PERCENTILES,
    SUMMARY,
    percentile_column,
)

if TYPE_CHECKING:
    import pandas as pd


# --- selecting rows -----------------------------------------------------------------------------
def rows_given(df, what: str):
    """``df`` when it is a table of rows (a pandas DataFrame, or anything with ``columns``); else LabError naming
    what was given: a results file's path, a list, None (was: AttributeError "'str' object has no attribute
    'columns'" from the table or figure)."""
    if hasattr(df, "columns"):
        return df
    load = (
        f" (a results file's path: read it first, lablib.load_results({df!r}))"
        if isinstance(df, (str, os.PathLike))
        else ""
    )
    raise LabError(f"{what} takes rows as a pandas DataFrame; it was given a {type(df).__name__}, {shown(df)}{load}")


def need(df, columns, what: str, source: str | None = None) -> None:
    """Raise LabError naming the columns of ``columns`` that ``df`` lacks (a DataFrame, or anything with
    ``columns``: else :func:`rows_given`'s LabError), and ``source`` (what makes such rows) when given; or naming
    those of ``columns`` that are declared nowhere (:data:`lablib.results.schema.COLUMNS` of rows,
    ``TABLE_COLUMNS`` of tables)."""
    rows_given(df, what)
    unknown = [c for c in columns if c not in KNOWN]
    if unknown:  # a figure or table asking for a column the lab never writes
        raise LabError(
            f"{what} asks for {unknown}, which are not columns of a result row or table (lablib.results.schema)"
        )
    missing = [c for c in columns if c not in df.columns]
    if missing:
        has = ", ".join(map(str, df.columns)) or "no columns"
        hint = f"; expected rows of {source}" if source else ""
        raise LabError(f"{what} needs the columns {', '.join(missing)}; the data has {has}{hint}")


def one_row_each(df, keys, what: str, source: str | None = None):
    """A copy of ``df`` (after :func:`need` of ``keys``), a key column of digit strings or of whole floats read as
    whole numbers (a file's "2" as 2; 2.0 where other rows of the file had no value); LabError naming the first
    combination of ``keys`` that two or more rows share: two runs' rows put together, which a table would mix and
    a line would draw as a zig-zag (the runs named by ``run_id`` where the rows have one)."""
    import pandas as pd

    need(df, list(keys), what, source)
    df = df.copy()
    for k in keys:
        digits = df[k].map(lambda v: isinstance(v, str) and v.strip().lstrip("-").isdigit())
        if len(df) and (pd.api.types.is_string_dtype(df[k]) or df[k].dtype == object) and digits.all():
            df[k] = df[k].astype(int)
        elif len(df) and pd.api.types.is_float_dtype(df[k]) and df[k].notna().all() and (df[k] % 1 == 0).all():
            df[k] = df[k].astype(int)  # whole numbers a file read as floats (other rows of it had none)
    repeated = df[df.duplicated(list(keys), keep=False)]
    if len(repeated):
        first = repeated.iloc[0]
        plain = {k: first[k].item() if hasattr(first[k], "item") else first[k] for k in keys}  # 1, not np.int64(1)
        at = ", ".join(f"{k}={v!r}" for k, v in plain.items())
        same = pd.Series(True, index=repeated.index)
        for k in keys:  # a missing value is the same as another missing one here, as duplicated() took it
            same &= (repeated[k] == first[k]) | (repeated[k].isna() & pd.isna(first[k]))
        runs = list(dict.fromkeys(map(str, df["run_id"].dropna()))) if "run_id" in df.columns else []
        if len(runs) > 1:  # the runs named, and how to pick one
            shown = ", ".join(runs[:4]) + (", ..." if len(runs) > 4 else "")
            tail = (
                f"), and these are of {len(runs)} runs (run_id {shown}): give one run's rows at a time, such as "
                f"rows[rows['run_id'] == {runs[0]!r}]"
            )
        else:
            tail = "): give one run's rows at a time"
        of = f" of {source}" if source else ""
        raise LabError(
            f"{what}: {int(same.sum())} rows have {at}; expected one row each (the rows of one run{of}{tail}"
        )
    return df


def ok_rows(df):
    """Rows without an error (LabError for what is no table of rows: :func:`rows_given`)."""
    rows_given(df, "a table or figure of the lab")
    if "error" in df.columns:
        df = df[df["error"].isna()]
    return df


def sweep_rows(df, sweep: str):
    """The rows of one sweep kind ("context" or "concurrency"), errors left out.

    Rows without a ``sweep`` column (``side_by_side``) count as context rows.
    """
    df = ok_rows(df)
    if "sweep" not in df.columns:
        return df if sweep == "context" else df.iloc[0:0]
    return df[df["sweep"] == sweep]


def nonempty(df, what: str, hint: str):
    """``df``, or LabError saying there is nothing to show and what to run (``hint``)."""
    if len(rows_given(df, what)) == 0:
        raise LabError(f"{what}: no rows to plot; {hint}")
    return df


def percentile(values, q: float) -> float:
    """Percentile ``q`` in [0, 100] with linear interpolation (numpy's default) of the values that
    are not None or NaN; NaN when there are none."""
    import numpy as np

    vals = [float(v) for v in values if v is not None and v == v]  # NaN != NaN
    return float(np.percentile(vals, q)) if vals else float("nan")


# --- one run in numbers: throughput, percentiles, goodput ------------------------------------------------
# PERCENTILES (50, 90, 95, 99) and the columns' one naming, <metric>_p<q>_s, are declared with the columns
# (lablib.results.schema): every summary (run_table, the HTTP bench, lablib.ui.text.summary_line) uses them


def _records(rows) -> list[dict]:
    """Rows as a list of dicts (a DataFrame's records, or the dicts as given)."""
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")
    return list(rows)


def _value(x):
    """``x``, or None for a missing value (None, NaN: a DataFrame's empty cell)."""
    return None if x is None or (isinstance(x, float) and x != x) else x


def _succeeded(row: dict) -> bool:
    """The request gave its tokens: no ``error`` (None, NaN or empty) and a TTFT."""
    return not _value(row.get("error")) and _value(row.get("ttft_s")) is not None


def makespan_s(rows) -> float:
    """A run's makespan: first ``t_submit`` to last token (``t_last_token``) over the successful rows
    (dicts or a DataFrame), seconds; 0 when none succeeded. The lab's one makespan: every throughput
    of a run (:func:`run_summary`) is over it."""
    ok = [r for r in _records(rows) if _succeeded(r) and _value(r.get("t_last_token")) is not None]
    if not ok:
        return 0.0
    return max(r["t_last_token"] for r in ok) - min(r["t_submit"] for r in ok)


def check_targets(ttft_s=None, tpot_s=None, e2e_s=None) -> None:
    """Goodput targets (seconds; None: no target): each a positive, finite number; LabError naming one that is not
    (a target of 0 or below made every run's goodput 0 without a word)."""
    import math
    import numbers

    for what, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("e2e_s", e2e_s)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
            raise LabError(
                f"{what}={v!r}: expected a positive number of seconds (a goodput target; None or left out: no target)"
            )


def goodput(
    rows,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
    duration_s: float | None = None,
) -> dict:
    """Requests that met every given target (seconds; None: no target), of ``rows`` (dicts or a
    DataFrame): DistServe's goodput, as ``vllm bench serve --goodput``. A failed request never counts;
    a one-token request has no TPOT and meets a TPOT target, and so does one whose tokens all came at one
    instant (``decode_unseen``: after its first token its user waited for no other; its TTFT, which holds the whole
    answer's time, meets the TTFT target or not). Returns ``good`` (count), ``fraction`` (of
    all rows) and ``rps`` (good / ``duration_s``, default the run's :func:`makespan_s`). LabError for a
    target that is not a positive number (:func:`check_targets`)."""
    check_targets(ttft_s, tpot_s, e2e_s)
    rows = _records(rows)
    good = 0
    for r in rows:
        if not _succeeded(r):
            continue
        tpot = _value(r.get("tpot_s"))
        good += bool(
            (ttft_s is None or r["ttft_s"] <= ttft_s)
            and (e2e_s is None or r["e2e_s"] <= e2e_s)
            and (tpot_s is None or tpot is None or tpot <= tpot_s)
        )
    dur = makespan_s(rows) if duration_s is None else duration_s
    return {"good": good, "fraction": good / len(rows) if rows else 0.0, "rps": good / dur if dur else 0.0}


def _series(row: dict, metric: str) -> list[float]:
    """The values ``row`` holds of ``metric``: one (a per-request metric) or a list (itl_s, chunk_gaps_s)."""
    v = row.get(metric)
    if v is None or isinstance(v, str):
        return []
    if not hasattr(v, "__len__"):  # one number (a numpy one too), or NaN: a DataFrame's empty cell
        return [] if v != v else [float(v)]
    return [float(x) for x in v if x is not None and x == x]  # a list, or an array read back from parquet


def run_summary(
    rows,
    percentiles=PERCENTILES,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
) -> dict:
    """One run in numbers, from its rows (dicts or a DataFrame, one per request, failed ones included):
    :data:`lablib.results.schema.SUMMARY`.

    ``requests`` (rows) and ``errors`` (failed: an ``error``, or no token); of the successful requests:
    ``output_tokens``, ``makespan_s`` (:func:`makespan_s`), ``output_tps`` (output tokens / makespan),
    ``requests_per_s``, ``goodput_rps`` and ``goodput_fraction`` against the targets ``ttft_s``,
    ``tpot_s``, ``e2e_s`` (seconds; None: no target; :func:`goodput`); ``<metric>_p<q>_s`` for each ``q``
    of ``percentiles`` and each metric of :data:`lablib.results.schema.DISTRIBUTIONS` (``ttft_p50_s``,
    ``itl_p99_s``: every inter-token gap of every request; ``chunk_gaps_p50_s``: every gap between
    content chunks; None without values, as chunk gaps without HTTP rows); ``schedule_lag_max_s``
    (an open loop's latest dispatch; None otherwise); and ``decode_unseen_requests``: the successful requests of two or
    more tokens without a TPOT, every token at one instant (a stream that came whole: buffered by a proxy or the
    server, or read late by a busy client; :attr:`lablib.results.trace.RequestTrace.decode_unseen`), so the TPOT
    percentiles are of the others only; ``first_bunched_requests``: those whose first token came with others, not
    all (an HTTP row's ``first_arrival_tokens`` above 1: a proxy that sends on in pieces, a client that read late),
    whose TTFT holds the decode of the ones that came with it and whose TPOT, over a shorter span, is low."""
    rows = _records(rows)
    ok = [r for r in rows if _succeeded(r)]
    dur = makespan_s(ok)
    tokens = sum(int(r["output_tokens"]) for r in ok)
    good = goodput(rows, ttft_s, tpot_s, e2e_s, dur)
    out = {
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "output_tokens": tokens,
        "makespan_s": dur,
        "output_tps": tokens / dur if dur > 0 else 0.0,
        "requests_per_s": len(ok) / dur if dur > 0 else 0.0,
        "goodput_rps": good["rps"],
        "goodput_fraction": good["fraction"],
    }
    for metric in DISTRIBUTIONS:
        vals = [x for r in ok for x in _series(r, metric)]
        for q in percentiles:
            out[percentile_column(metric, q)] = percentile(vals, q) if vals else None
    lags = [_value(r.get("schedule_lag_s")) for r in rows]
    lags = [x for x in lags if x is not None]
    out["schedule_lag_max_s"] = max(lags) if lags else None
    out["decode_unseen_requests"] = sum(int(r["output_tokens"]) >= 2 and _value(r.get("tpot_s")) is None for r in ok)
    out["first_bunched_requests"] = sum(
        1 < (_value(r.get("first_arrival_tokens")) or 0) < int(r["output_tokens"]) for r in ok
    )
    return out


# --- one engine run and the context sweep ----------------------------------------------------------
def table_with_rows(table, rows, server_rows=None) -> pd.DataFrame:
    """A study's table (a list of dicts, one per run) as a DataFrame that carries what it was made from:
    the request rows in ``attrs["rows"]`` and, where the server was sampled, its samples in
    ``attrs["server_rows"]`` (lab 05's rate sweep, lab 09's KV-capacity and knee tables)."""
    import pandas as pd

    df = pd.DataFrame(table)
    df.attrs["rows"] = rows
    if server_rows is not None:
        df.attrs["server_rows"] = server_rows
    return df


def _medians(*cols: str) -> dict:
    """Named aggregations for ``groupby(...).agg(**...)``: each of ``cols``' median, under its own name."""
    return {c: (c, "median") for c in cols}


def summary_table(df) -> pd.DataFrame:
    """Per engine and prompt length: medians of prefill, TTFT, prefill tokens/s, TPOT, decode tokens/s,
    e2e, and the e2e spread (min, max), seconds; the output tokens and repetitions behind them."""
    d = ok_rows(df)
    cols = ["engine", "prompt_tokens", "output_tokens", "prefill_s", "ttft_s", "prefill_tps", "tpot_s", "decode_tps"]
    need(d, [*cols, "e2e_s", "dtype"], "summary_table", "a context sweep (lablib.measure.sweep.context_sweep)")
    g = d.groupby(["engine", "prompt_tokens"], sort=False)
    return g.agg(
        output_tokens=("output_tokens", "first"),
        reps=("e2e_s", "size"),
        **_medians("prefill_s", "ttft_s", "prefill_tps", "tpot_s", "decode_tps", "e2e_s"),
        e2e_min_s=("e2e_s", "min"),
        e2e_max_s=("e2e_s", "max"),
        dtype=("dtype", "first"),
    )


# --- which rows came from which machine ----------------------------------------------------------------------
# A workshop room hands in one results file per laptop (lablib merge, lablib report, docs/workshop.md), and the
# room's figure puts each machine on its own row of panels. The hostname names a machine in most rooms, but not
# in all: two laptops can both be "MacBook-Pro.local", and a room of cloud VMs can all be "vm". The hardware does
# not tell them apart either (the same CPU, the same cores: one machine_key). What does is the machine's own id
# (machine_id: the operating system's, hashed; lablib.machine.identity.machine_id), in every row's manifest;
# rows written before it (or on a machine whose OS keeps none) are told apart by the file they were first
# written to (source_file): rows with neither, of one hostname, cannot be told apart.


def _present(v):
    return None if v is None or v != v or v == "" else v  # NaN: a column other rows have


def machine_names(df):
    """One name per row's machine (a pandas Series on ``df``'s index): its ``hostname``; where several machines
    share a hostname, the hostname and the file its rows came from, "vm · room-anna.jsonl" (a room's files carry
    the participant's name: docs/workshop.md), with as many of the file's folders as tell it from the others'
    ("vm · anna/room.jsonl"), or, where files do not tell the machines apart (one machine's rows in two files),
    "vm · id 3f2a9c": the first six digits of the ``machine_id`` (all twelve where six are not enough).

    A machine is its ``machine_id`` where the row records one (a file's rows without one take the one id its
    other rows record: older runs appended to the same file), else the file the row came from (``source_file``),
    else the hostname alone (rows with neither cannot be told apart). Rows without a hostname take the one their
    machine's other rows give, else their ``cpu_model``, else "unknown machine"."""
    import pandas as pd

    records = df[[c for c in ("hostname", "cpu_model", "machine_id", "source_file") if c in df.columns]].to_dict(
        "records"
    )
    ids = [_present(r.get("machine_id")) for r in records]
    srcs = [_present(r.get("source_file")) for r in records]
    ids_of_file: dict[str, set] = {}
    for i, src in zip(ids, srcs):
        if i and src:
            ids_of_file.setdefault(str(src), set()).add(str(i))
    ids = [
        str(i) if i else next(iter(ids_of_file[str(src)])) if src and len(ids_of_file.get(str(src), ())) == 1 else None
        for i, src in zip(ids, srcs)
    ]
    host_of_id: dict[str, str] = {}
    for r, i in zip(records, ids):
        if i and _present(r.get("hostname")):
            host_of_id.setdefault(i, str(r["hostname"]))
    hosts = [
        str(_present(r.get("hostname")) or host_of_id.get(i or "") or _present(r.get("cpu_model")) or "unknown machine")
        for r, i in zip(records, ids)
    ]
    idents = [("id", i) if i else ("file", str(src)) if src else ("host", "") for i, src in zip(ids, srcs)]
    machines_of: dict[str, set] = {}
    files_of: dict[tuple, set] = {}  # (host, machine) -> the files its rows came from
    for host, ident, src in zip(hosts, idents, srcs):
        machines_of.setdefault(host, set()).add(ident)
        files_of.setdefault((host, ident), set()).add(str(src) if src else None)

    def by_file(host, ident) -> str | None:
        """Its one file, by the fewest trailing parts of its path that no other machine of the host's files end
        with; None where it has several files (or none), or shares its file with another machine."""
        mine = files_of[(host, ident)]
        if len(mine) != 1 or None in mine:
            return None
        parts = Path(next(iter(mine))).parts
        others = [Path(f).parts for o in machines_of[host] if o != ident for f in files_of[(host, o)] if f]
        for k in range(1, len(parts) + 1):
            if all(p[-k:] != parts[-k:] for p in others):
                return "/".join(parts[-k:])
        return None

    named = {}  # (host, machine) -> its name
    for host, ident in set(zip(hosts, idents)):
        kind, value = ident
        if len(machines_of[host]) == 1 or kind == "host":
            named[(host, ident)] = host
        elif (file := by_file(host, ident)) is not None:
            named[(host, ident)] = f"{host} · {file}"
        else:
            named[(host, ident)] = f"{host} · id {value[:6]}" if kind == "id" else f"{host} · {value}"
    by_name: dict[str, list] = {}
    for machine, name in named.items():
        by_name.setdefault(name, []).append(machine)
    for machines in by_name.values():  # two machines of one name (ids alike in six digits): in full
        if len(machines) > 1:
            for host, (kind, value) in machines:
                if kind != "host":
                    named[(host, (kind, value))] = f"{host} · {'id ' if kind == 'id' else ''}{value}"
    return pd.Series([named[m] for m in zip(hosts, idents)], index=df.index, dtype=object)


def shared_hostnames(df) -> dict[str, list[str]]:
    """{hostname: the :func:`machine_names` of its machines} for every hostname that several machines share; empty
    when each hostname is one machine."""
    names = machine_names(df)
    hosts = df["hostname"] if "hostname" in df.columns else None
    if hosts is None:
        return {}
    shared: dict[str, list[str]] = {}
    for host, name in zip(hosts, names):
        if _present(host) and name != host and name not in shared.setdefault(str(host), []):
            shared[str(host)].append(name)
    return {h: sorted(n) for h, n in shared.items() if n}


def facet_rows(d, facet_by: str | None, who: str):
    """``d`` ready to be drawn by ``facet_by`` (a column of :data:`lablib.results.schema.FACETS`, or None): as it
    is, after checking the column is there; for "machine" where rows carry no such column (rows not put beside a
    reference by :func:`lablib.results.reference.beside`: a room's files), each row's :func:`machine_names`, one
    row of panels per machine. Was: a LabError asking for beside()'s column."""
    if facet_by is None:
        return d
    if facet_by == "machine" and "machine" not in d.columns:
        return d.assign(machine=machine_names(d))
    need(d, [facet_by], who)
    return d


def context_medians(df, facet_by: str | None = None) -> pd.DataFrame:
    """Per engine and prompt length of the context rows (per ``facet_by`` value first, a machine column of
    :data:`lablib.results.schema.FACETS`, where given): medians (and min, max) of prefill_s, decode_s,
    prefill_tps and TPOT in ms, the median output tokens, and ``n`` (repetitions); sorted by prompt length."""
    d = nonempty(
        sweep_rows(df, "context"),
        "context figure",
        "run lablib.measure.sweep.context_sweep(...) or load a results file with context rows",
    )
    need(
        d,
        ["engine", "prompt_tokens", "output_tokens", "prefill_s", "decode_s", "prefill_tps", "tpot_s"],
        "context figure",
    )
    d = facet_rows(d, facet_by, "context figure (facet_by=...)")
    d = d.assign(tpot_ms=d["tpot_s"].astype(float) * 1000.0)
    g = d.groupby(([facet_by] if facet_by else []) + ["engine", "prompt_tokens"], sort=False)
    med = g.agg(
        **_medians("prefill_s", "decode_s", "prefill_tps"),
        prefill_tps_min=("prefill_tps", "min"),
        prefill_tps_max=("prefill_tps", "max"),
        tpot_ms=("tpot_ms", "median"),
        tpot_ms_min=("tpot_ms", "min"),
        tpot_ms_max=("tpot_ms", "max"),
        output_tokens=("output_tokens", "median"),
        n=("prefill_s", "size"),
    ).reset_index()
    return med.sort_values("prompt_tokens", kind="stable")


def engine_medians(df) -> pd.DataFrame:
    """Per engine (first-seen order): median prefill_s, decode_s, prompt_tokens and output_tokens."""
    d = ok_rows(df)
    need(d, ["engine", "prefill_s", "decode_s", "prompt_tokens", "output_tokens"], "engine medians")
    return d.groupby("engine", sort=False)[["prefill_s", "decode_s", "prompt_tokens", "output_tokens"]].median()


# --- the concurrency sweep -------------------------------------------------------------------------
def run_table(df, ttft_s: float | None = None, tpot_s: float | None = None, e2e_s: float | None = None) -> pd.DataFrame:
    """One row per concurrency run (``run_id``): engine, mode, concurrency, then the run's
    :func:`run_summary` (requests, errors, output_tokens, makespan_s, output_tps: all output tokens /
    makespan, requests_per_s, goodput against the targets ``ttft_s``, ``tpot_s``, ``e2e_s``, and
    ``<metric>_p<q>_s`` at :data:`PERCENTILES` of queue_s, ttft_s, tpot_s, e2e_s and itl_s, seconds);
    hostname and cpu_model kept when present (to facet by machine). Failed requests count in
    ``requests`` and ``errors`` only. The HTTP-only columns (chunk gaps, schedule lag) are kept when a
    run has them."""
    import pandas as pd

    need(df, ["run_id", "engine"], "run_table", "a concurrency sweep (lablib.measure.sweep.concurrency_sweep)")
    d = df[df["sweep"] == "concurrency"] if "sweep" in df else df
    out = []
    for run_id, g in d.groupby("run_id", sort=False):
        rec = {
            "run_id": run_id,
            "engine": g["engine"].iloc[0],
            "mode": g["mode"].iloc[0],
            "concurrency": int(g["concurrency"].iloc[0]),
            **run_summary(g, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s),
        }
        for col in ("hostname", "cpu_model"):
            if col in g:
                rec[col] = g[col].iloc[0]
        out.append(rec)
    table = pd.DataFrame(out)
    if not len(table):
        return table
    numbers = [c for c in table.columns if c.endswith("_s") and c in SUMMARY]  # None (no values) as NaN
    table[numbers] = table[numbers].apply(pd.to_numeric)
    http_only = [c for c in table.columns if c.startswith("chunk_gaps_p") or c == "schedule_lag_max_s"]
    table = table.drop(columns=[c for c in http_only if table[c].isna().all()])
    # every run's decode seen, token by token (in process, always): no columns of zeros
    return table.drop(columns=[c for c in ("decode_unseen_requests", "first_bunched_requests") if not table[c].any()])


def concurrency_summary(df, facet_by: str | None = None) -> pd.DataFrame:
    """Per (facet, engine, mode, concurrency): median run output_tps over runs, and TTFT p50/p95 (s)
    over all requests of those runs. Needs the columns of :func:`run_table`."""
    import pandas as pd

    d = ok_rows(df)
    runs = run_table(d)
    keys = ([facet_by] if facet_by else []) + ["engine", "mode", "concurrency"]
    rows = []
    for key, r in d.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        sel = runs[runs["run_id"].isin(r["run_id"].unique())]
        s = run_summary(r, percentiles=(50, 95))  # over all requests of those runs
        rows.append(
            dict(
                zip(keys, key),
                runs=len(sel),
                requests=len(r),
                output_tps=float(sel["output_tps"].median()),
                **{c: float("nan") if s[c] is None else s[c] for c in ("ttft_p50_s", "ttft_p95_s")},
            )
        )
    return pd.DataFrame(rows)


def timeline_segments(run) -> pd.DataFrame:
    """Segments of one run, times relative to its first t_submit (s): a DataFrame with one row
    per request in arrival order: request_index, prompt_tokens, output_tokens, queue (start, end),
    prefill (start, end) and decode (start, end).

    Needs: t_submit, t_start, t_first_token, t_last_token (request_index when present)."""
    need(run, CLOCKS, "timeline")
    r = run.copy()
    if "request_index" not in r.columns:
        r["request_index"] = range(len(r))
    r = r.sort_values(["t_submit", "request_index"], kind="stable")
    t0 = r["t_submit"].min()
    out = r[["request_index"] + [c for c in ("prompt_tokens", "output_tokens") if c in r.columns]].copy()
    out["queue_start"], out["queue_end"] = r["t_submit"] - t0, r["t_start"] - t0
    out["prefill_start"], out["prefill_end"] = r["t_start"] - t0, r["t_first_token"] - t0
    out["decode_start"], out["decode_end"] = r["t_first_token"] - t0, r["t_last_token"] - t0
    return out.reset_index(drop=True)


def client_server_timeline(run, server, metrics=("running", "waiting", "kv_usage")):
    """One run seen by the client and by the server, on one time axis: seconds since the run's first
    t_submit. Returns (in_flight, ttft, samples): requests in flight, a step per change (t_s, in_flight:
    sent at t_start, until t_last_token); each request's first token (t_s, ttft_s, request_index); the
    server's samples of ``metrics`` (t_s, metric, value; lablib.engines.http.metrics.MetricsSampler rows).

    Both are on the lab's clock (the sampler stamps ``t_s`` with lablib.results.trace.now, the clock of
    the traces); LabError when the samples do not overlap the run (another run, or another clock).
    Needs: t_submit, t_start, t_first_token, t_last_token of ``run`` (failed rows left out); t_s, metric,
    value of ``server``."""
    import pandas as pd

    need(run, CLOCKS, "client_server_timeline", "a load run (lablib.measure.load.run_load)")
    need(server, ("t_s", "metric", "value"), "client_server_timeline", "lablib.engines.http.metrics.MetricsSampler")
    r = nonempty(ok_rows(run), "client_server_timeline", "expected successful requests of one run")
    t0, t1 = float(r["t_submit"].min()), float(r["t_last_token"].max())
    s = server[server["metric"].isin(list(metrics))]
    if s.empty or s["t_s"].max() < t0 or s["t_s"].min() > t1:
        span = "no samples" if s.empty else f"samples at {s['t_s'].min():.3f} to {s['t_s'].max():.3f} s"
        raise LabError(
            f"the server's {span} of {', '.join(metrics)} do not overlap the run ({t0:.3f} to {t1:.3f} s on the "
            "lab's clock): expected the samples of this run (lablib bench's <out>.server.jsonl rows with its "
            "rate and concurrency), taken in the process that sent the requests"
        )
    steps = pd.concat(
        [pd.DataFrame({"t": r["t_start"], "d": 1}), pd.DataFrame({"t": r["t_last_token"], "d": -1})]
    ).sort_values(["t", "d"], kind="stable")  # a finish before a start at the same instant
    flight = pd.DataFrame({"t_s": [0.0, *(steps["t"] - t0)], "in_flight": [0, *steps["d"].cumsum()]})
    ttft = pd.DataFrame(
        {
            "t_s": r["t_first_token"] - t0,
            "ttft_s": r["ttft_s"] if "ttft_s" in r.columns else r["t_first_token"] - r["t_submit"],
            "request_index": r["request_index"] if "request_index" in r.columns else range(len(r)),
        }
    ).sort_values("t_s")
    samples = s.assign(t_s=s["t_s"] - t0).sort_values("t_s", kind="stable")[["t_s", "metric", "value"]]
    return flight.reset_index(drop=True), ttft.reset_index(drop=True), samples.reset_index(drop=True)


# --- prefix caching (lab 08) -------------------------------------------------------------------------
PREFIX_AXES = {"prefix_shared": "shared_tokens", "prefix_chat": "turn"}


def prefix_medians(df, sweep: str = "prefix_shared") -> pd.DataFrame:
    """Per engine, ``reuse`` and step of a prefix-caching run (``shared_tokens`` for sweep
    "prefix_shared", ``turn`` for "prefix_chat"): medians of ttft_s and prefill_s, prompt_tokens,
    cached_tokens and evaluated_tokens, ``n`` (requests), and ``speedup`` on the reuse rows (median
    TTFT without reuse / with, at the same step). Sorted by engine order, step, reuse."""
    if sweep not in PREFIX_AXES:
        raise LabError(f"sweep={sweep!r}: expected one of {', '.join(PREFIX_AXES)}")
    axis = PREFIX_AXES[sweep]
    d = nonempty(
        sweep_rows(df, sweep),
        f"{sweep} table",
        "run lablib.studies.prefix.shared_prefix(...) or lablib.studies.prefix.chat(...)",
    )
    need(d, ["engine", "reuse", axis, "ttft_s", "prefill_s", "prompt_tokens", "cached_tokens"], f"{sweep} table")
    cols = ["ttft_s", "prefill_s", "prompt_tokens", "cached_tokens"]
    if "evaluated_tokens" in d.columns:
        cols.append("evaluated_tokens")
    d = d.assign(reuse=d["reuse"].astype(bool))
    med = d.groupby(["engine", axis, "reuse"], sort=False).agg(**_medians(*cols), n=("ttft_s", "size"))
    med = med.reset_index()
    base = med[~med["reuse"]].set_index(["engine", axis])["ttft_s"]
    key = list(zip(med["engine"], med[axis]))
    med["speedup"] = [
        base.get(k, float("nan")) / t if r else float("nan") for k, t, r in zip(key, med["ttft_s"], med["reuse"])
    ]
    order = {e: i for i, e in enumerate(dict.fromkeys(d["engine"]))}
    med = med.sort_values([axis, "reuse"], kind="stable").sort_values(
        "engine", key=lambda s: s.map(order), kind="stable"
    )
    return med.reset_index(drop=True)


# --- the manifest -----------------------------------------------------------------------------
def manifest_table(df) -> pd.DataFrame:
    """The manifest basics (:data:`lablib.results.schema.MANIFEST_SUMMARY`), one row per (hostname, engine):
    versions, dtype, threads, quantization, model, CPU, cores, RAM (GiB), accelerator, lablib
    version, first/last time, and row counts. Where machines share a hostname, one row per machine and engine,
    with a ``machine`` column first (:func:`machine_names`: "vm · room-anna.jsonl")."""
    d = rows_given(df, "manifest_table").copy()
    cols = [c for c in MANIFEST_SUMMARY if c in d.columns]
    if "ram_bytes" in cols:
        d["ram_gib"] = (d["ram_bytes"].astype(float) / 2**30).round(1)
        cols[cols.index("ram_bytes")] = "ram_gib"
    keys = [c for c in ("hostname", "engine") if c in cols]
    if not keys:
        return d.iloc[0:0]
    if "machine" in d.columns:  # named already (a learner's rows beside a reference's: reference.beside)
        keys = ["machine", *keys]
    elif "hostname" in keys:  # machines that share a hostname (a room's "vm"s): one row each, named apart
        names = machine_names(d)
        if not names.equals(d["hostname"].astype(object)):
            d["machine"], keys = names, ["machine", *keys]
    agg = {c: (c, "first") for c in cols if c not in keys}
    if "time" in d.columns:
        agg.update(first_time=("time", "min"), last_time=("time", "max"))
    agg["requests"] = (keys[0], "size")
    return d.groupby(keys, sort=False, dropna=False).agg(**agg).reset_index()


# --- measured against the roofline's bound ----------------------------------------------------------
def bound_table(df) -> pd.DataFrame:
    """Per engine (and weight choice, where rows record one: ``weights``) and prompt length: medians of
    measured and bound tokens/s and % of bound, prefill and decode, of rows that carry the bound columns
    (:func:`lablib.studies.roofline.add_bound_columns`), and which line binds decode (``decode_bound_by``:
    bandwidth, compute or the engine's launch floor) where the rows say. Per ``machine`` first where the rows
    have that column (a learner's beside a reference: :func:`lablib.results.reference.beside`). ``weights`` of an
    engine with one choice (llama.cpp, MLX: rows record none) is the type its weights are computed in, the rows'
    ``dtype`` ("Q4_1", "float32"): was an empty cell beside transformers' "float32" (lab 07)."""
    cols = [f"{phase}_{what}" for phase in ("prefill", "decode") for what in ("tps", "bound_tps", "pct_of_bound")]
    need(df, ["engine", "prompt_tokens", *cols], "bound_table", "lablib.studies.roofline.add_bound_columns(df, model)")
    keys = ["engine", "weights", "prompt_tokens"] if "weights" in df.columns else ["engine", "prompt_tokens"]
    if "weights" in df.columns and "dtype" in df.columns:
        chosen = df["weights"].notna() & (df["weights"] != "")
        df = df.assign(weights=df["weights"].where(chosen, df["dtype"]))
    if "machine" in df.columns:  # rows of several machines (lablib.results.reference.beside), each its own bound
        keys = ["machine", *keys]
    g = df.groupby(keys, sort=False, dropna=False)
    extra = {}
    if "decode_bound_by" in df.columns:  # which of the roofline's three lines binds decode (the launch floor's)
        extra["decode_bound_by"] = ("decode_bound_by", "first")
    return g.agg(**_medians(*cols), **extra).reset_index()
