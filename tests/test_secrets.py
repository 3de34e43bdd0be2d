"""Secrets and addresses (issue 23): an API key given by environment variable reaches the server and
nothing else: no row, manifest, server-samples file, report, log line or exception has it; a base URL
with credentials in it is refused (and the refusal does not repeat the password); the servers the lab
starts listen on the loopback address only, and the card of one whose process is gone is pruned."""

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from lablib.engines import load_engine
from lablib.engines.base import GenerationConfig
from lablib.engines.http import HTTPEngineError
from lablib.errors import LabError
from sse_server import cmpl, sse

DONE = sse("[DONE]")
LOOPBACK = {"127.0.0.1", "::1"}


def stream(n=4):
    """n one-token chunks with their ids (logprobs), then the usage: an exact count."""
    steps = [sse(cmpl(f" w{i}", [100 + i], finish="length" if i == n - 1 else None)) for i in range(n)]
    return steps + [sse(cmpl(usage={"prompt_tokens": 8, "completion_tokens": n})), DONE]


def files_under(*roots, since: float, skip=("envs", "wheels")):
    """Files under ``roots`` modified at ``since`` (time.time() s) or later; the lab home's installed
    environments and wheels (``skip``: tens of thousands of files no run writes) are not walked."""
    for root in roots:
        for top in Path(root).iterdir():
            for p in [top] if top.is_file() else ([] if top.name in skip else top.rglob("*")):
                if p.is_file() and p.stat().st_mtime >= since:
                    yield p


def test_the_api_key_reaches_the_server_and_no_file_or_line_the_run_writes(server, model, tmp_path):
    import time

    secret = f"sk-lab-{uuid.uuid4().hex}"
    server.script, server.queue = stream(), []
    server.requests.clear()
    t0 = time.time() - 1
    out = tmp_path / "rows.jsonl"
    env = dict(os.environ, LABLIB_API_KEY=secret)
    bench = subprocess.run(
        [sys.executable, "-m", "lablib.cli", "bench", "--base-url", server.base_url, "--server", "openai"]
        + ["--concurrency", "2", "--requests", "3", "--prompt-tokens", "8", "--max-new-tokens", "4"]
        + ["--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    # the key was sent, as a bearer token, on every request (warm-up included)
    assert len(server.requests) == 4
    assert all(h.get("Authorization") == f"Bearer {secret}" for _, h, _ in server.requests)
    report = subprocess.run(
        [sys.executable, "-m", "lablib.cli", "report", str(out), "--html", str(tmp_path / "report.html")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    # a failed request: the 401 message and the error row name the variable, never its value
    server.script = [("status", 401, f'{{"error": "bad key {secret[:6]}"}}', None)]
    os.environ["LABLIB_API_KEY"] = secret
    try:
        e = load_engine("http", model, base_url=server.base_url, server="openai", read_timeout_s=5)
        try:
            with pytest.raises(HTTPEngineError) as err:
                e.generate([5, 6], GenerationConfig(max_new_tokens=2))
            manifest = dataclasses.asdict(e.info())
        finally:
            e.close()
    finally:
        del os.environ["LABLIB_API_KEY"]
    said = "\n".join([bench.stdout, bench.stderr, report.stdout, report.stderr, str(err.value), repr(err.value)])
    said += "\n" + repr(err.value.trace) + "\n" + str(manifest)
    assert "LABLIB_API_KEY" in str(err.value) and secret not in said
    assert manifest["flags"].get("api_key_env") == "LABLIB_API_KEY"  # which variable, so a reader knows
    lab_home = os.environ.get("LABLIB_HOME", str(Path.home() / ".cache" / "lablib"))
    written = list(files_under(tmp_path, lab_home, since=t0))
    assert out in written and tmp_path / "report.html" in written
    leaks = [str(p) for p in written if secret.encode() in p.read_bytes()]
    assert leaks == []


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2pass@127.0.0.1:{port}/v1",
        "http://:hunter2pass@127.0.0.1:{port}/v1",
        "http://127.0.0.1:{port}/v1?api_key=hunter2pass",
    ],
)
def test_a_base_url_with_credentials_is_refused_without_repeating_them(server, model, url):
    url = url.format(port=server.port)
    with pytest.raises(LabError) as e:
        load_engine("http", model, base_url=url, server="openai")
    msg = str(e.value)
    assert "hunter2pass" not in msg and "LABLIB_API_KEY" in msg and f"127.0.0.1:{server.port}" in msg


def listening(pid: int) -> set[str]:
    """The addresses the process ``pid`` and its children listen on (TCP)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    found = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return found


def test_a_server_the_lab_starts_listens_on_loopback_only(model):
    from lablib.engines.servers import start_server

    srv = start_server("llama-server", model, parallel=1, n_ctx=512, log=lambda *_: None)
    try:
        addrs = listening(srv.pid)
    finally:
        srv.stop()
    assert addrs and addrs <= LOOPBACK, addrs


def test_vllm_listens_on_loopback_only(vllm_server):
    # its API server, EngineCore and worker: every listening TCP socket of the process group
    addrs = listening(vllm_server.pid)
    assert addrs and addrs <= LOOPBACK, addrs


def test_the_card_of_a_server_whose_process_is_gone_is_removed_when_the_next_starts(tmp_path, monkeypatch):
    from lablib.engines.http.cards import card_for, cards_dir, write_card

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is free now: the card of a lab process killed before it stopped its server
    write_card("llama-server", dead.pid, 1, "v", ["x"], tmp_path / "log", {})
    assert card_for("http://127.0.0.1:1/v1") is None and (cards_dir() / "1.json").exists()
    write_card("llama-server", os.getpid(), 2, "v", ["x"], tmp_path / "log", {"slots": 2})
    assert sorted(p.name for p in cards_dir().iterdir()) == ["2.json"]
    assert card_for("http://127.0.0.1:2/v1")["settings"] == {"slots": 2}
