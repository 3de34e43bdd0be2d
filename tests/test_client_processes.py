"""One load run from several client processes (lablib.measure.processes) on the scripted fast server
(benchmarks/fast_server.py, a process of its own that logs the true send time of every token):

- every request is sent once and gives one row, in one list and one results file, each row naming its process;
- the processes share one start on one clock: every token of every process is stamped after the server sent it,
  and the closed loop's first requests of every process are submitted at the same moment;
- the open loop keeps its one schedule: the requests of all processes are scheduled at the times one process
  would have used;
- a bench run says each process's share and headroom, and the results of several client processes (several
  machines) merge into one file whose rows keep their processes.
"""

import json
import sys
from pathlib import Path

import pytest

from benchmark_modules import load as _load
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.measure.load import arrival_schedule, bench, run_load_processes
from lablib.measure.processes import _plan, auto_processes, merged_headroom, share

fast_server = _load("fast_server")
capacity = _load("client_capacity")


@pytest.fixture(scope="module")
def paced():
    with fast_server.FastServer(itl_s=0.002) as srv:
        yield srv


def _kw(model, srv):
    return {"model": model, "base_url": srv.base_url, "server": "vllm"}


def test_shares_by_hand():
    assert share(5, 2) == [3, 2] and share(8, 3) == [3, 3, 2]
    plans = _plan(10, "closed", 5, 2)  # clients 0, 2, 4 in process 0; 1, 3 in process 1
    assert [p["clients"] for p in plans] == [[0, 2, 4], [1, 3]]
    assert plans[0]["requests"] == [0, 2, 4, 5, 7, 9] and plans[1]["requests"] == [1, 3, 6, 8]
    assert [p["requests"] for p in _plan(5, "open", None, 2)] == [[0, 2, 4], [1, 3]]
    assert [p["concurrency"] for p in _plan(5, "open", 3, 2)] == [2, 1]
    assert (
        auto_processes(64, cores=16) == 1 and auto_processes(1024, cores=16) == 8 and auto_processes(1024, cores=2) == 1
    )


def test_a_closed_loop_from_two_processes_on_one_clock(model, paced):
    n, c, requests = 12, 4, 10
    paced.sendlog(clear=True)
    got = []
    rows, per = run_load_processes(
        _kw(model, paced),
        [[1000 + i, 7, 7] for i in range(requests)],
        "closed",
        processes=2,
        concurrency=c,
        cfg=GenerationConfig(max_new_tokens=n, ignore_eos=True),
        max_duration_s=60,
        on_row=got.append,
    )
    log = {r["rid"]: r for r in paced.sendlog(clear=True)}
    assert got == rows and sorted(r["request_index"] for r in rows) == list(range(requests))
    assert not any(r["error"] for r in rows) and {r["concurrency"] for r in rows} == {c}
    assert {r["client"] for r in rows} == set(range(c)) and all(r["client"] % 2 == r["client_process"] for r in rows)
    assert [(p["streams"], p["requests"], p["rows"], p["error"]) for p in per] == [(2, 5, 5, None), (2, 5, 5, None)]
    assert len({p["pid"] for p in per}) == 2 and all(p["client_headroom"]["samples"] > 0 for p in per)
    # one start: the first request of each of the 4 clients was submitted at the same moment, in both processes
    firsts = {}
    for r in rows:
        firsts[r["client"]] = min(firsts.get(r["client"], r["t_submit"]), r["t_submit"])
    assert len(set(firsts.values())) == 1
    # one clock: every token, whichever process stamped it, after the server sent it
    pairs = [(capacity.lab_arrivals(r), log[int(capacity.TAG.match(r["text"]).group(1))]["t_send"]) for r in rows]
    m = capacity.compare(pairs)
    assert m["clock_ok"] and m["tokens_matched"] == requests * n and m["mismatched"] == 0
    assert merged_headroom(per)["processes"] == 2


def test_an_open_loop_keeps_its_one_schedule(model, paced):
    requests, rate = 9, 40.0
    rows, per = run_load_processes(
        _kw(model, paced),
        [[2000 + i, 7] for i in range(requests)],
        "open",
        processes=3,
        rate=rate,
        seed=3,
        cfg=GenerationConfig(max_new_tokens=4, ignore_eos=True),
        max_duration_s=60,
    )
    want = arrival_schedule(requests, rate, "poisson", 1.0, 3)
    got = {r["request_index"]: r["t_scheduled"] for r in rows}
    assert sorted(got) == list(range(requests)) and all(got[i] == pytest.approx(want[i], abs=1e-9) for i in got)
    assert {(r["rate"], r["arrival"]) for r in rows} == {(rate, "poisson")}
    assert {r["client_process"] for r in rows} == {0, 1, 2} and [p["requests"] for p in per] == [3, 3, 3]


def test_a_server_that_is_not_there_fails_before_the_run(model):
    with pytest.raises(LabError, match="client process 0 could not start: .*no OpenAI-compatible server"):
        run_load_processes(
            {"model": model, "base_url": "http://127.0.0.1:9/v1"}, [[1, 2]], "closed", processes=1, concurrency=1
        )


def test_bench_from_two_processes_and_a_merge_of_two_clients_files(model, paced, tmp_path, capsys):
    """Two bench runs, as two client machines would run them, each from two processes: each file holds its
    rows with their processes; lablib merge makes one file of both, every row kept."""
    from lablib.cli import main

    files = []
    for k in range(2):
        out = tmp_path / f"client{k}.jsonl"
        (s,) = bench(
            base_url=paced.base_url,
            out=out,
            requests=6,
            prompt_tokens=8,
            max_new_tokens=5,
            concurrency=4,
            model=model,
            server="vllm",
            warmup=0,
            client_processes=2,
            log=lambda *_: None,
        )
        assert s["requests"] == 6 and s["errors"] == 0 and s["client_headroom"]["processes"] == 2
        assert [p["rows"] for p in s["client_processes"]] == [3, 3]
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert sorted(r["request_index"] for r in rows) == list(range(6))
        assert sorted(r["client_process"] for r in rows) == [0, 0, 0, 1, 1, 1]
        run = json.loads(out.with_name(f"client{k}.runs.jsonl").read_text().splitlines()[-1])
        assert [p["streams"] for p in run["client_processes"]] == [2, 2]
        files.append(str(out))
    merged = tmp_path / "all.jsonl"
    assert main(["merge", *files, "--out", str(merged)]) == 0
    rows = [json.loads(x) for x in merged.read_text().splitlines()]
    assert len(rows) == 12 and sorted(r["client_process"] for r in rows) == [0] * 6 + [1] * 6


def test_client_machines_on_one_start_merge_onto_one_time_line(model, paced, tmp_path):
    """lablib bench --start-at on each client machine, then lablib merge --one-clock: every machine's first
    requests were submitted at the start it was given, and the merged rows hold that moment on the Unix time
    line (here two clients of one machine, one of them from two processes, given starts 1 s apart)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from lablib.cli import main
    from lablib.model.tokenizer import lab_tokenizer

    lab_tokenizer(model)  # transformers' lazy imports are not safe from two threads at once: done once here
    start = time.time() + 8.0  # the two "machines" load their engines meanwhile, at once (threads here)

    def machine(k: int) -> str:
        out = tmp_path / f"machine{k}.jsonl"
        bench(
            base_url=paced.base_url,
            out=out,
            requests=4,
            prompt_tokens=8,
            max_new_tokens=3,
            concurrency=2,
            model=model,
            server="vllm",
            warmup=0,
            client_processes=k + 1,
            start_at_unix=start + k,
            log=lambda *_: None,
        )
        return str(out)

    with ThreadPoolExecutor(2) as pool:
        files = list(pool.map(machine, (0, 1)))
    for k, f in enumerate(files):
        rows = [json.loads(x) for x in Path(f).read_text().splitlines()]
        first = min(r["t_submit"] + r["clock_unix_offset_s"] for r in rows)
        assert first == pytest.approx(start + k, abs=0.005)  # the machine's clock at the start it was given
    merged = tmp_path / "run.jsonl"
    assert main(["merge", *files, "--out", str(merged), "--one-clock"]) == 0
    rows = [json.loads(x) for x in merged.read_text().splitlines()]
    firsts = [min(r["t_submit"] for r in rows if r["source_file"] == f) for f in files]  # each machine's first
    assert len(rows) == 8 and all(r["clock_unix_offset_s"] == 0 for r in rows)
    assert firsts[0] == pytest.approx(start, abs=0.01) and firsts[-1] == pytest.approx(start + 1, abs=0.01)
    with pytest.raises(LabError, match="--start-at .*expected Unix seconds or an ISO 8601 time with its zone"):
        from lablib.cli.bench import _unix_time

        _unix_time("10:00")
    assert _unix_time("2026-12-05T10:00:00Z") == 1796464800.0
    with pytest.raises(LabError, match="that time has passed"):
        bench(
            base_url=paced.base_url,
            out=tmp_path / "late.jsonl",
            requests=1,
            prompt_tokens=8,
            max_new_tokens=2,
            concurrency=1,
            model=model,
            server="vllm",
            warmup=0,
            start_at_unix=time.time() - 1,
            log=lambda *_: None,
        )


def test_a_replay_from_two_processes_sends_each_request_once_on_its_one_schedule(model, paced, tmp_path, capsys):
    """lablib replay --client-processes 2 on the fast server: request i from process i % 2, every request sent
    once (the server's own log), each at its time on the trace's one schedule from one start (every row's
    t_submit - t_scheduled is that start, in both processes), the rows in one file, and the processes' line
    printed as bench prints it."""
    from lablib.cli import main
    from lablib.measure import replay as R

    arrivals = [0.0, 0.0, 0.04, 0.05, 0.1, 0.13, 0.2, 0.21]
    lines = [
        {"arrival_s": t, "prompt_tokens": 12 + 3 * i, "output_tokens": 3 + i % 4, "prefix_blocks": [1 + i % 2]}
        for i, t in enumerate(arrivals)
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "replay.jsonl"
    paced.sendlog(clear=True)
    argv = ["replay", "--base-url", paced.base_url, "--trace", str(trace), "--length-scale", "1", "--warmup", "0"]
    assert main([*argv, "--client-processes", "2", "--out", str(out)]) == 0
    sent = paced.sendlog(clear=True)
    printed = capsys.readouterr().out
    assert "replay requests=8/8 not_sent=0" in printed, printed
    line = next(x for x in printed.splitlines() if "client processes=" in x)
    assert line.startswith("  client processes=2: #0 streams=") and " | #1 " in line and "rows=4" in line, line
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 8 and not any(r["error"] for r in rows)
    assert sorted(r["request_index"] for r in rows) == list(range(8))
    assert all(r["client_process"] == r["request_index"] % 2 for r in rows)
    plan = R.scale(R.read_trace(trace), length_scale=1)
    for r in rows:
        req = plan.requests[r["request_index"]]
        assert r["trace_index"] == req.trace_index and r["output_tokens"] == r["max_new_tokens"] == req.max_new_tokens
        assert r["t_scheduled"] == pytest.approx(req.t_s, abs=1e-9)  # the trace's schedule, whichever process
    starts = [r["t_submit"] - r["t_scheduled"] for r in rows]
    assert max(starts) - min(starts) < 1e-6  # one start on one clock for both processes
    # every request sent once: one stream per row (its tag in the text names it), besides the two processes'
    # unrecorded 2-token requests before the start
    by_rid = {s["rid"]: s for s in sent}
    for r in rows:
        assert by_rid.pop(int(capacity.TAG.match(r["text"]).group(1)))["n"] == r["max_new_tokens"]
    assert sorted(s["n"] for s in by_rid.values()) == [2, 2]  # the processes' own, before the start; nothing else
    assert main([*argv, "--client-processes", "none", "--out", str(out)]) == 2
    assert "lablib: --client-processes 'none': expected a whole number of client processes" in capsys.readouterr().err


def _ctrl_c_as_the_second_process_starts(model, paced, monkeypatch, before=None) -> list:
    """run_load_processes from two client processes on ``paced``, Ctrl-C raised in this process the moment the
    second one is started (after ``before(pids)``, when given): it must raise KeyboardInterrupt and leave no
    process running. Returns the two processes (multiprocessing's, ended)."""
    import signal
    from multiprocessing.context import SpawnProcess

    import psutil

    started, procs, real_start = [], [], SpawnProcess.start

    def start_then_ctrl_c(self):
        real_start(self)
        started.append(self.pid)
        procs.append(self)
        if len(started) == 2:
            if before is not None:
                before(started)
            signal.raise_signal(signal.SIGINT)  # its handler runs here, inside what starts the process

    monkeypatch.setattr(SpawnProcess, "start", start_then_ctrl_c)
    prior = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (CI) inherits it ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            run_load_processes(_kw(model, paced), [[1, 2, 3]] * 4, "closed", processes=2, concurrency=2)
    finally:
        signal.signal(signal.SIGINT, prior)
    alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert len(started) == 2 and alive == []
    return procs


def test_a_ctrl_c_while_the_second_process_starts_leaves_no_process(model, paced, monkeypatch):
    """A Ctrl-C while the client processes were started (spawn: a second or so each) came before the run's try: the
    processes already started waited for their start for ever, out of sight (daemons, ended only with the lab's
    process). Here it comes the moment the second one is started: every started process ends with the run."""
    _ctrl_c_as_the_second_process_starts(model, paced, monkeypatch)


def _catches_ctrl_c(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGINT (Linux: /proc/PID/status, SigCgt): a new Python sets its
    own at its start, before it imports anything."""
    import signal

    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_a_ctrl_c_while_the_client_processes_import_prints_no_traceback(model, paced, monkeypatch, capfd):
    """`lablib bench --client-processes 2` sent Ctrl-C or SIGTERM while its processes started (the terminal's Ctrl-C
    reaches them too): the lab passed SIGINT on to each one, which was still importing (spawn: a second or more), so
    each printed a KeyboardInterrupt traceback from the middle of its imports, or "Fatal Python error:
    init_import_site" (a fuzz of `kill -INT` / `kill -TERM` on bench: 2 in 30 tries). Here the Ctrl-C comes, every
    time, once both processes run Python (it has set its Ctrl-C handler) and before either runs the lab's worker."""
    import time

    def both_importing(pids):
        deadline = time.monotonic() + 60
        while not all(_catches_ctrl_c(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.001)

    _ctrl_c_as_the_second_process_starts(model, paced, monkeypatch, before=both_importing)
    err = capfd.readouterr().err  # the processes' own stderr is this one's
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Fatal Python error" not in err, err


# a client process's sitecustomize: its Ctrl-C handler's KeyboardInterrupt dropped, as Python drops one raised
# inside a finalizer ("Exception ignored in ..."); its handler still counts the Ctrl-C as come
_LOSES_CTRL_C = """\
import signal
_signal = signal.signal
def _dropped(handler):
    def lost(signum, frame):
        try:
            handler(signum, frame)
        except KeyboardInterrupt:
            pass
    return lost
def _signal_lost(sig, handler):
    if sig == signal.SIGINT and getattr(handler, "__qualname__", "") == "first_interrupt_handler.<locals>.first_only":
        handler = _dropped(handler)
        import os
        open(os.path.join(os.environ["LABLIB_TEST_LOST"], str(os.getpid())), "w").close()
    return _signal(sig, handler)
signal.signal = _signal_lost
"""


def test_a_client_process_that_lost_its_ctrl_c_does_not_keep_the_run_waiting(model, paced, monkeypatch, tmp_path):
    """A Ctrl-C that lands in a finalizer in a client process (regex objects freed as it imports: "Exception ignored
    in: <function SetBase.__del__>", 3 in 62 tries of a fuzz of `lablib bench --client-processes 2`) is dropped
    there: the process went on, got ready and waited for its start, and the interrupted run waited DONE_GRACE_S for
    it, then 5 s more before killing it (`lablib bench` exited 41 s after the Ctrl-C). Here every client process
    drops its Ctrl-C so, the Ctrl-C coming as the second one starts: each must end by itself (exit code 0), told
    that no start is coming, not be killed by the run's last resort (SIGKILL, exit code -9, after DONE_GRACE_S
    and 5 s more)."""
    (tmp_path / "sitecustomize.py").write_text(_LOSES_CTRL_C)
    (tmp_path / "lost").mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the spawned processes' (spawn: a new interpreter)
    monkeypatch.setenv("LABLIB_TEST_LOST", str(tmp_path / "lost"))
    procs = _ctrl_c_as_the_second_process_starts(model, paced, monkeypatch)
    # both processes set the lab's handler and had it wrapped to drop its Ctrl-C (else this test tests nothing)
    assert sorted(int(f.name) for f in (tmp_path / "lost").iterdir()) == sorted(p.pid for p in procs)
    assert [p.exitcode for p in procs] == [0, 0]


UNGUARDED = """\
from lablib.errors import LabError
from lablib.measure.load import run_load_processes
from lablib.model import prepare

try:
    run_load_processes({"model": prepare(), "base_url": "http://127.0.0.1:9/v1"}, [[1, 2], [3, 4]], "closed",
                       processes=2, concurrency=2)
except LabError as e:
    print("LabError:", e)
"""


def test_a_script_without_a_main_guard_gets_one_clear_error(tmp_path):
    """spawn runs the calling script again in each client process; an unguarded script starts the run there again.
    Python's own answer is a RuntimeError traceback from every process and "client process 0 exited"."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("LabError: client process ") and 'if __name__ == "__main__":' in done.stdout
    assert "RuntimeError" not in done.stderr and "Traceback" not in done.stderr


UNGUARDED_BENCH = """\
import sys
from lablib.errors import LabError
from lablib.measure.load import bench
from lablib.measure.replay import run_replay

try:
    if sys.argv[2] == "bench":
        bench(base_url=sys.argv[1], out="b.jsonl", requests=4, prompt_tokens=8, max_new_tokens=4, concurrency=2,
              server="vllm", warmup=1, client_processes=2, log=lambda m: None)
    else:
        run_replay(out="r.jsonl", base_url=sys.argv[1], count=4, warmup=1, client_processes=2, log=lambda m: None)
except LabError as e:
    print("LabError:", e)
"""


@pytest.mark.parametrize("entry", ["bench", "replay"])
def test_an_unguarded_bench_or_replay_script_is_stopped_before_its_client_processes_send_a_request(
    entry, paced, tmp_path
):
    """bench and run_replay prepare a run (its server, its warm-up requests) before its client processes start:
    each client process re-running an unguarded script did all that again before run_load_processes refused it
    (here: 3 warm-up requests, not the caller's 1; with run_replay(server=...), a server started per process)."""
    import subprocess

    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_BENCH)
    paced.sendlog(clear=True)
    done = subprocess.run(
        [sys.executable, str(script), paced.base_url, entry], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("LabError: client process ") and 'if __name__ == "__main__":' in done.stdout
    assert len(paced.sendlog(clear=True)) == 1  # the caller's own warm-up only
