"""A run of `lablib bench` against a real server that a thread SIGKILLs mid-stream, and the rows it leaves on
disk (tests/test_serving_faults.py on llama-server, tests/test_serving_study.py on vLLM)."""

import json
import os
import re
import signal
import socket
import threading
import time

from lablib.measure.load import bench

NEW = 64  # output tokens per request (EOS ignored): long enough that streams are in flight at the kill


def rows_on_disk(out) -> list[dict]:
    """The complete lines of a results file being written (a line still being written is left out)."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def wait_rows(out, n: int, proc=None, bound_s: float = 180.0) -> list[dict]:
    deadline = time.monotonic() + bound_s
    while len(rows := rows_on_disk(out)) < n:
        assert proc is None or proc.poll() is None, f"the lab process exited ({proc.returncode}) with {len(rows)} rows"
        assert time.monotonic() < deadline, f"{len(rows)} rows on disk after {bound_s} s; expected {n}"
        time.sleep(0.01)
    return rows


class Killer(threading.Thread):
    """SIGKILL ``pid`` once ``after_rows`` rows are on disk in ``out``, ``wait_e2e`` of their median e2e
    later (0: at once); ``t_kill`` is the lab's clock then."""

    def __init__(self, out, pid: int, after_rows: int, wait_e2e: float = 0.0):
        super().__init__(daemon=True)
        self.out, self.pid, self.after_rows, self.wait_e2e = out, pid, after_rows, wait_e2e
        self.t_kill = None

    def run(self):
        rows = wait_rows(self.out, self.after_rows)
        if self.wait_e2e:
            e2e = sorted(r["e2e_s"] for r in rows)
            time.sleep(self.wait_e2e * e2e[len(e2e) // 2])
        self.t_kill = time.perf_counter()  # the lab's clock (lablib.results.trace.now)
        os.kill(self.pid, signal.SIGKILL)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def classify(rows):
    """(finished, broken mid-stream, refused) rows of a run whose server was killed."""
    ok = [r for r in rows if r["error"] is None]
    broken = [r for r in rows if r["error"] and "closed the connection" in r["error"]]
    # not sent before the server died: refused, or reset as it opened (the server was exiting)
    refused = [r for r in rows if r["error"] and re.search(r"cannot connect .*connection (refused|reset)", r["error"])]
    others = [r["error"] for r in rows if r["error"] and r not in broken and r not in refused]
    assert not others, f"error rows that name neither a broken nor a refused connection: {others[:3]}"
    return ok, broken, refused


def killed_run(srv, model, out, mode, requests, after_rows, wait_e2e=0.0, max_new_tokens=NEW):
    """``bench`` on ``srv`` at concurrency 8 while a Killer SIGKILLs it (``after_rows``, ``wait_e2e``);
    (summary, rows on disk, killer, t_return)."""
    killer = Killer(out, srv.pid, after_rows, wait_e2e)
    killer.start()
    kw = dict(concurrency=8) if mode == "closed" else dict(rates="2", concurrency=8)
    (s,) = bench(
        base_url=srv.base_url,
        out=out,
        model=model,
        requests=requests,
        prompt_tokens=16,
        max_new_tokens=max_new_tokens,
        warmup=0,
        max_duration_s=240,
        log=lambda m: None,
        **kw,
    )
    t_return = time.perf_counter()
    killer.join(timeout=5)
    assert killer.t_kill is not None, "the run ended before the server was killed"
    return s, rows_on_disk(out), killer, t_return
