"""A server's own view of a load run (lablib.engines.http.metrics): Prometheus text parsed with
prometheus_client's parser and normalized to the lab's common names, on a real vLLM capture
(tests/data/vllm_metrics.txt) and on a real llama-server started by the lab (``--metrics``), sampled
during ``lablib.measure.load.bench`` on the lab's clock; a server without /metrics is one clear error.
"""

import http.server
import json
import threading
from pathlib import Path

import pandas as pd
import pytest

from lablib.engines.http import metrics as M
from lablib.engines.servers import start_server
from lablib.errors import LabError
from lablib.measure.load import bench

VLLM = Path(__file__).parent / "data" / "vllm_metrics.txt"


# --- a real vLLM's /metrics, captured ------------------------------------------------------------
def test_a_vllm_capture_parses_and_normalizes():
    text = VLLM.read_text()
    samples = M.parse(text)
    names = {s["name"] for s in samples}
    # the parser strips _total from a counter's family name; its samples keep it
    assert {"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"} <= names
    assert "vllm:prompt_tokens" not in names
    value = {s["name"]: s["value"] for s in samples if not s["labels"].get("reason")}
    view = M.server_view(samples)
    assert view == {
        "running": 0,
        "waiting": 0,
        "waiting_by_reason": {"capacity": 0, "deferred": 0},
        "kv_usage": 0.0,
        "prefix_cache_queries": 56,
        "prefix_cache_hits": 0,
        "preemptions": 0,
        "prompt_tokens": 56,
        "generation_tokens": 20,
    }
    # the counters agree with the per-request histograms of the same scrape (4 requests, all finished)
    assert view["prompt_tokens"] == value["vllm:request_prompt_tokens_sum"]
    assert view["generation_tokens"] == value["vllm:request_generation_tokens_sum"]
    assert sum(s["value"] for s in samples if s["name"] == "vllm:request_success_total") == 4
    # kv_cache_usage_perc is a fraction despite its name: its own help says so
    assert "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage." in text
    settings = M.server_settings(samples)["vllm:cache_config_info"]
    assert settings["block_size"] == "128" and settings["enable_prefix_caching"] == "True"
    assert settings["num_gpu_blocks"] == "182" and settings["cache_dtype"] == "auto"
    # the sampler's filtered parse reads the same view and settings from a fraction of the samples
    few = M.parse(text, only_view=True)
    assert M.server_view(few) == view and M.server_settings(few) == M.server_settings(samples)
    assert len(few) < len(samples) / 10


def test_several_engines_of_one_vllm_add_up_and_kv_usage_averages():
    lines = VLLM.read_text().splitlines()
    extra = [
        'vllm:num_requests_running{engine="1",model_name="smollm2"} 3.0',
        'vllm:kv_cache_usage_perc{engine="1",model_name="smollm2"} 0.5',
        'vllm:generation_tokens_total{engine="1",model_name="smollm2"} 7.0',
        'vllm:num_requests_waiting_by_reason{engine="1",model_name="smollm2",reason="capacity"} 2.0',
    ]
    for line in extra:  # after the engine="0" sample of the same name
        name = line.split("{")[0]
        at = max(i for i, x in enumerate(lines) if x.startswith(name + "{"))
        lines.insert(at + 1, line)
    view = M.server_view(M.parse("\n".join(lines) + "\n"))
    assert view["running"] == 3 and view["kv_usage"] == 0.25 and view["generation_tokens"] == 27
    assert view["waiting_by_reason"] == {"capacity": 2, "deferred": 0}


# --- a real llama-server, started by the lab with --metrics ---------------------------------------
@pytest.fixture(scope="module")
def llama_server():
    srv = start_server("llama-server", parallel=2, n_ctx=512, timeout_s=900)
    yield srv
    srv.stop()


@pytest.mark.engine
def test_llama_server_metrics_and_slots(llama_server):
    root = llama_server.base_url.removesuffix("/v1")
    samples = M.scrape(root)
    view = M.server_view(samples)
    assert all(isinstance(view[k], int) and view[k] >= 0 for k in M.COUNTERS if k != "preemptions")
    assert view["running"] == 0 and view["waiting"] == 0  # idle
    assert view["preemptions"] is None and view["waiting_by_reason"] is None  # llama-server has neither
    assert M.server_settings(samples) == {}
    slots = M.slots(root)
    assert [s["n_ctx"] for s in slots] == [512, 512] and not any(s["is_processing"] for s in slots)
    assert M.slots_view(slots) == {"running": 0, "kv_usage": 0.0, "slots": 2, "n_ctx": 512}


@pytest.mark.engine
def test_bench_samples_the_server_on_the_lab_clock(llama_server, model, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    (s,) = bench(
        base_url=llama_server.base_url,
        out=out,
        requests=4,
        prompt_tokens=32,
        max_new_tokens=8,
        concurrency=2,
        model=model,
        log=lambda *_: None,
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    c = s["server_counters"]
    assert c["scrape_failures"] == 0 and c["scrapes"] >= 2
    # the counters of the run alone (sampled after the warm-up, first scrape before the first request and
    # last after the last token): every prompt token (computed + from the cache), every generated token
    assert c["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows) == 4 * 32
    assert c["prefix_cache_hits"] == sum(r["usage_cached_tokens"] for r in rows)
    assert c["prefix_cache_queries"] == c["prompt_tokens"]
    assert c["generation_tokens"] == sum(r["output_tokens"] for r in rows) == 4 * 8
    assert s["server_info"] == {"slots": {"slots": 2, "n_ctx": 512}}
    # the client's own headroom: the stamping loop probed from the first request to the last, and the run's
    # summary on disk beside its rows (the same numbers as returned)
    h = s["client_headroom"]
    assert h["samples"] > 0 and h["method"] in ("timerfd", "sleep") and isinstance(h["near_limit"], bool)
    assert h["threshold_s"] == pytest.approx(max(0.001, 0.1 * s["itl_p50_s"]))
    assert h["near_limit"] == (h["loop_lag_p99_s"] > h["threshold_s"] or h["loop_cpu_fraction"] >= 0.9)
    (run,) = [json.loads(x) for x in (tmp_path / "r.runs.jsonl").read_text().splitlines()]
    assert run["client_headroom"] == h and run["requests"] == 4 and run["out"] == str(out)

    server = [json.loads(x) for x in (tmp_path / "r.server.jsonl").read_text().splitlines()]
    assert {r["metric"] for r in server} == {
        "running",
        "waiting",
        "kv_usage",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "prompt_tokens",
        "generation_tokens",
    }
    assert all(r["mode"] == "closed" and r["concurrency"] == 2 and r["server"] == "llama-server" for r in server)
    raw = {r["metric"]: r["raw"] for r in server}
    assert raw["running"] == "llamacpp:requests_processing" and raw["kv_usage"] == "/slots"
    # one clock: every sample inside the run, give or take one sampling interval
    lo, hi = min(r["t_submit"] for r in rows) - 0.25, max(r["t_last_token"] for r in rows) + 0.25
    assert all(lo <= r["t_s"] <= hi for r in server), (lo, hi, [r["t_s"] for r in server])
    running = [r["value"] for r in server if r["metric"] == "running"]
    kv = [r["value"] for r in server if r["metric"] == "kv_usage"]
    # the counters run since the server started: the first sample holds the warm-up alone (one request of
    # 32 prompt tokens, 8 generated; this module's server serves nothing else before)
    first = {r["metric"]: r["value"] for r in server if r["t_s"] == server[0]["t_s"]}
    assert first["prompt_tokens"] == 32 and first["generation_tokens"] == 8
    # two clients on two slots: after the first prefill both decode together until a request ends, most
    # of a run that lasts a second or more on 2 cores, so samples 0.25 s apart see both (a server so fast
    # that the whole run fits in an interval or two could slip between samples); never more than the slots
    assert max(running) == 2 == c["running"] and min(running) >= 0
    assert 0 < max(kv) <= 1 and c["kv_usage"] == max(kv)
    assert running[0] == 0 and running[-1] == 0  # the first scrape before the run, the last after it

    # the figure: the client's and the server's view on one time axis
    from lablib.plots import server_timeline
    from lablib.ui.text import server_line

    fig = server_timeline(pd.DataFrame(rows), pd.DataFrame(server))
    names = [t.name for t in fig.data]
    assert names == [
        "requests in flight (client)",
        "TTFT of each request (s, at its first token)",
        "running (server)",
        "waiting (server)",
        "KV cache used (server, %)",
    ]
    assert max(fig.data[0].y) == 2 and len(fig.data[1].x) == 4
    assert fig.layout.xaxis.matches == "x2"  # the client's row shares the server row's time axis
    assert {t.xaxis for t in fig.data} == {"x", "x2"}
    line = server_line(c)
    assert "server_prompt_tokens=128 server_generation_tokens=32" in line and "running_max=2" in line


# --- no /metrics ----------------------------------------------------------------------------------
class _Html(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = b"<html><body>metrics dashboard</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_page_that_is_not_prometheus_text_is_a_clear_error():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(LabError, match=r"/metrics answered text/plain that is not Prometheus text"):
            M.scrape(root + "/v1")  # a base URL's /v1 is dropped
        with pytest.raises(LabError, match=r"/slots: HTTP 404, not a JSON list of slots"):
            M.slots(root)
    finally:
        httpd.shutdown()
        httpd.server_close()
    with pytest.raises(LabError, match=r"no answer .* expected a running server there"):
        M.scrape(root)


@pytest.mark.engine
def test_a_server_without_metrics_is_a_clear_error_and_bench_goes_on(model, tmp_path):
    srv = start_server("llama-cpp-python", model, n_ctx=512)
    try:
        with pytest.raises(LabError, match=r"/metrics: HTTP 404 .* start llama-server with --metrics"):
            M.scrape(srv.base_url)
        with pytest.raises(LabError, match=r"HTTP 404"):
            M.MetricsSampler(srv.base_url).start()
        logged = []
        (s,) = bench(
            base_url=srv.base_url,
            out=tmp_path / "r.jsonl",
            requests=2,
            prompt_tokens=8,
            max_new_tokens=2,
            concurrency=1,
            warmup=0,
            model=model,
            log=logged.append,
        )
    finally:
        srv.stop()
    assert s["server_counters"] is None and s["server_info"] is None and s["errors"] == 0
    assert not (tmp_path / "r.server.jsonl").exists()
    assert any(m.startswith("no server counters: GET http://127.0.0.1:") for m in logged)
