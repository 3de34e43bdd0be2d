"""Every column a row can carry is declared in lablib.results.schema, and every table is checked by the one
column check (lablib.results.tables.need).

The rows are made the way the lab makes them: an HTTP trace built by hand (a few token stamps, chunks, usage,
server timings) through its ``metrics()`` and the results writer's ``trace_row``; ``run_load``'s rows of a
closed and an open loop against the scripted SSE server (tests/sse_server.py), failed and unsent requests
included; the ladder's rows from the dict literals of the code that builds them (lablib.studies.ladder) and
the quality statistics from ``quality.summarize``; the run summary and the bench's summaries. A failure
names the undeclared columns and who writes them.
"""

import ast
import inspect
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lablib
from lablib.errors import LabError
from lablib.results import schema
from lablib.results.schema import COLUMNS, KNOWN, SUMMARY, TABLE_COLUMNS
from lablib.results.store import trace_row
from lablib.results.tables import need, run_summary, run_table

PKG = Path(lablib.__file__).resolve().parent
MANIFEST = {
    "engine": {"name": "http", "version": "scripted 1.0", "dtype": "unknown", "threads": None},
    "model": {"id": "m", "format": "gguf", "quantization": "Q4_1", "file_sha256": "0" * 64},
    "hardware": {"cpu_model": "cpu", "cores_physical": 2, "hostname": "labhost", "measured_bandwidth_gbps": 10.0},
    "lablib_version": "0",
    "time": "2025-01-01T00:00:00Z",
}


def undeclared(keys, who: str) -> None:
    extra = sorted(set(keys) - set(COLUMNS))
    assert not extra, f"{who} writes columns not declared in lablib.results.schema.COLUMNS: {extra}"


def dict_keys(fn) -> set[str]:
    """The string keys of every dict literal in ``fn`` (a function or its parsed node)."""
    node = ast.parse(inspect.getsource(fn)) if not isinstance(fn, ast.AST) else fn
    keys = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            keys |= {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys


def updated_keys(fn) -> set[str]:
    """The keyword names of every ``row.update(name=...)`` call in ``fn``."""
    keys = set()
    for n in ast.walk(ast.parse(inspect.getsource(fn))):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "update":
            keys |= {k.arg for k in n.keywords if k.arg}
    return keys


def test_each_column_is_declared_once():
    names = COLUMNS + TABLE_COLUMNS
    twice = sorted({c for c in names if names.count(c) > 1})
    assert not twice, f"declared more than once in lablib.results.schema: {twice}"
    assert KNOWN == set(names)
    assert all(c in COLUMNS + TABLE_COLUMNS for c in SUMMARY)


def test_the_measured_machine_columns_have_one_spelling(monkeypatch):
    from lablib.machine import ceilings

    cols = [schema.MEASURED_BANDWIDTH, *schema.MEASURED_PEAKS.values()]
    assert all(schema.MANIFEST_FIELDS[c] == ("hardware", c) for c in cols)
    m = {"bytes_per_s": 20e9, "flop_per_s": {"float32": 80e9, "bfloat16": 90e9, "int8": 200e9}}
    monkeypatch.setattr(ceilings, "cached_measurement", lambda: m)
    assert ceilings.measured_summary() == dict(zip(cols, (20.0, 80.0, 90.0, 200.0)))


# --- rows of an HTTP request ------------------------------------------------------------------------
def http_trace():
    from lablib.engines.http.trace import HTTPTrace

    t = HTTPTrace(prompt_tokens=4, t_submit=0.0, server="llama-server", api="completions", max_new_tokens=3)
    t.start(0.01)
    for i, s in enumerate((0.05, 0.07, 0.09)):
        t.token(10 + i, s)
    t.chunk_arrivals, t.chunk_tokens = [0.05, 0.07, 0.09], [1, 1, 1]
    t.count_method, t.fixed_length, t.finish_reason = "logprobs", "ignore_eos", "length"
    t.reads, t.events, t.max_events_per_read, t.pings = 3, 4, 2, 1
    t.usage_prompt_tokens, t.usage_completion_tokens, t.usage_cached_tokens = 4, 3, 0
    t.server_timings = {"prompt_ms": 20.0, "predicted_per_second": 50.0}
    t.text, t.threads = "abc", 2
    return t


def test_an_http_trace_writes_declared_columns_only():
    t = http_trace()
    m = t.metrics()
    assert m["server_prompt_s"] == 0.02 and m["usage_mismatch"] is False and len(m["chunk_gaps_s"]) == 2
    undeclared(m, "HTTPTrace.metrics()")
    undeclared(trace_row(t, MANIFEST, mode="closed", concurrency=1), "trace_row(HTTPTrace)")
    # and every column of the HTTP trace's metrics() is one that schema.HTTP (or the trace's own) declares
    from lablib.results.trace import RequestTrace

    plain = RequestTrace(prompt_tokens=1, t_submit=0.0, t_start=0.0)
    plain.token(1, 0.1)
    added = set(m) - set(plain.metrics())
    assert added <= set(schema.HTTP) | set(schema.OPTIONAL), sorted(added - set(schema.HTTP))


def test_an_http_request_row_without_tokens_writes_declared_columns_only():
    from lablib.engines.http.trace import HTTPTrace
    from lablib.measure.load import request_row

    t = HTTPTrace(prompt_tokens=4, t_submit=0.0, server="vllm", api="chat")
    t.start(0.01)
    undeclared(request_row(t, MANIFEST, "HTTP 500", mode="open", request_index=0), "request_row (failed)")
    undeclared(request_row(None, MANIFEST, "not sent", mode="open", prompt_tokens=4), "request_row (not sent)")
    undeclared(request_row(http_trace(), MANIFEST, None, mode="closed", client=0), "request_row")


# --- rows of run_load (closed and open loops over HTTP) -----------------------------------------------
@pytest.fixture
def engine(server, model):
    from lablib.engines import load_engine

    server.script, server.queue = [], []
    server.requests.clear()
    e = load_engine("http", model, base_url=server.base_url, server="vllm", read_timeout_s=5)
    yield e
    e.close()


def test_run_load_writes_declared_columns_only(engine, server):
    from lablib.engines.base import GenerationConfig
    from lablib.measure.load import run_load
    from sse_server import cmpl, sse

    ok = [
        sse(cmpl("a", [1])),
        sse(cmpl("b", [2], finish="length")),
        sse(cmpl(usage={"prompt_tokens": 2, "completion_tokens": 2})),
        sse("[DONE]"),
    ]
    cfg = GenerationConfig(max_new_tokens=2)
    server.script, server.queue = ok, [ok, [("status", 500, "boom")]]
    closed = run_load(engine, [[5, 6]] * 3, "closed", concurrency=2, cfg=cfg, max_duration_s=30, run_id="r1")
    assert sum(bool(r["error"]) for r in closed) == 1
    server.script, server.queue = [sse(cmpl("a", [1])), "hang"], []
    cut = run_load(engine, [[5]] * 3, "open", rate=math.inf, concurrency=2, cfg=cfg, max_duration_s=0.5)
    assert sum("not sent" in r["error"] for r in cut) == 1 and sum("cancelled" in r["error"] for r in cut) == 2
    server.script = ok
    opened = run_load(engine, [[5, 6]] * 2, "open", rate=100.0, arrival="gamma", burstiness=0.5, cfg=cfg)
    for what, rows in (("closed", closed), ("open, cut at its time limit", cut), ("open", opened)):
        for r in rows:
            undeclared(r, f"run_load ({what})")
    assert {"t_scheduled", "schedule_lag_s", "rate", "arrival", "burstiness"} <= set(opened[0])
    # the run summary of such rows: its own declared names, the same from a DataFrame
    s = run_summary(closed + opened)
    assert list(s) == list(SUMMARY) and s["errors"] == 1 and s["chunk_gaps_p50_s"] is not None
    assert run_summary(pd.DataFrame(closed + opened)) == pytest.approx(s, nan_ok=True)


# --- rows of the quantization ladder ------------------------------------------------------------------
def test_the_ladder_writes_declared_columns_only():
    from lablib.studies import ladder, quality

    tree = ast.parse(Path(ladder.__file__).read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    functions += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
    display = {"format_table"}  # lab 06's table of formats, shown, never written (MiB, "how it is read")
    rows = [f for f in functions if f.name not in display and dict_keys(f)]
    assert {"base_row", "llama_row", "engine_row", "measure_speed"} <= {f.name for f in rows}
    for f in rows:
        undeclared(dict_keys(f), f"lablib.studies.ladder.{f.name}")
    # the quality figures a ladder row carries (Ladder.measure: quality.compare_to_reference)
    rng = np.random.default_rng(0)
    ref = np.log(rng.dirichlet(np.ones(8), size=5))
    q = np.log(rng.dirichlet(np.ones(8), size=5))
    stats = quality.summarize([quality.token_stats(ref, q, rng.integers(0, 8, size=5))])
    assert tuple(stats) == quality.STATS == schema.QUALITY
    undeclared(stats, "lablib.studies.quality.summarize")


def test_the_bound_columns_are_declared():
    from lablib.studies import roofline

    added = updated_keys(roofline.add_bound_columns)  # row.update(compute_dtype=..., bound_bytes_per_s=...)
    assert set(schema.BOUND_COLUMNS) <= added
    undeclared(added, "lablib.studies.roofline.add_bound_columns")


# --- tables ---------------------------------------------------------------------------------------------
def test_need_refuses_an_undeclared_column_and_names_what_is_missing():
    df = pd.DataFrame({"engine": ["x"], "output_tps": [1.0]})
    need(df, ["engine", "output_tps"], "t")  # a row column and a table column
    with pytest.raises(LabError, match=r"asks for \['outptu_tps'\], which are not columns"):
        need(df, ["outptu_tps"], "t")
    with pytest.raises(
        LabError, match=r"t needs the columns ttft_p50_s; the data has engine, output_tps; expected rows of x"
    ):
        need(df, ["ttft_p50_s"], "t", "x")


def test_run_table_and_the_bench_summaries_use_declared_names():
    rows = [
        {
            "run_id": "a",
            "engine": "e",
            "mode": "serial",
            "concurrency": 1,
            "sweep": "concurrency",
            "output_tokens": 2,
            "ttft_s": 0.1,
            "tpot_s": 0.1,
            "e2e_s": 0.2,
            "queue_s": 0.0,
            "t_submit": 0.0,
            "t_last_token": 0.2,
            "itl_s": [0.1],
            "error": None,
        }
    ]
    table = run_table(pd.DataFrame(rows))
    assert set(table.columns) <= KNOWN, sorted(set(table.columns) - KNOWN)
    assert "chunk_gaps_p50_s" not in table.columns  # HTTP-only columns appear with HTTP rows only
    from lablib.measure import load

    labels = {"server", "mode", "rate", "concurrency"}  # what lablib.measure.load.bench adds to a run summary
    assert labels <= set(dict_keys(load.bench)) and labels <= KNOWN


def test_the_tables_of_the_studies_are_declared():
    from lablib.studies import anchors, prefix, roofline

    for fn in (roofline.batch_sweep, anchors.batched_rows, prefix.memory_table):
        keys = dict_keys(fn)
        assert keys and keys <= KNOWN, f"{fn.__module__}.{fn.__name__}: not declared: {sorted(keys - KNOWN)}"
