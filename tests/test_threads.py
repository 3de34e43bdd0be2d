"""Automatic threads: a busy neighbour takes its core, the engine uses the CPUs left."""

import subprocess
import sys
import time

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.machine.threads import BusyMeter, threads_beside_others

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_threads_beside_others_leaves_the_busy_cpus_and_keeps_one():
    assert threads_beside_others(2, 0.0) == 2
    assert threads_beside_others(2, 0.4) == 2  # a JupyterLab server's idle hum
    assert threads_beside_others(2, 0.5) == 1
    assert threads_beside_others(2, 1.0) == 1
    assert threads_beside_others(2, 7.0) == 1  # never fewer than one
    assert threads_beside_others(8, 2.6) == 5


def _spinner():
    p = subprocess.Popen([sys.executable, "-c", SPIN])
    time.sleep(0.3)
    return p


def test_busy_meter_sees_a_process_spinning_on_one_core():
    meter = BusyMeter(first_interval=0.05)
    p = _spinner()
    try:
        meter.others()  # from here on the spinner runs the whole interval
        time.sleep(0.5)
        others = meter.others()
    finally:
        p.kill()
        p.wait()
    assert 0.6 <= others <= 2.5, others  # one core, give or take what else runs on the machine


def test_requests_use_the_cpus_a_busy_neighbour_leaves(model, monkeypatch):
    monkeypatch.delenv("LABLIB_THREADS", raising=False)
    engine = load_engine("llama.cpp", model, n_ctx=256)
    try:
        assert engine.auto_threads and engine.info().flags["threads_auto"] is True
        ids = engine.tokenize("The capital of France is")
        p = _spinner()
        try:
            engine.adapt_threads()  # the interval that follows has the spinner in it
            time.sleep(0.3)
            trace = engine.generate(ids, GenerationConfig(max_new_tokens=4))
        finally:
            p.kill()
            p.wait()
        assert trace.threads == max(1, engine.max_threads - 1)
        from lablib.measure.sweep import engine_manifest
        from lablib.results.store import trace_row

        assert trace_row(trace, engine_manifest(engine))["threads"] == trace.threads
    finally:
        engine.close()


def test_threads_given_are_kept(model):
    engine = load_engine("llama.cpp", model, n_ctx=256, threads=2)
    try:
        p = _spinner()
        try:
            time.sleep(0.3)
            trace = engine.generate(engine.tokenize("Hello"), GenerationConfig(max_new_tokens=2))
        finally:
            p.kill()
            p.wait()
        assert not engine.auto_threads and trace.threads == 2
    finally:
        engine.close()
