"""A fast scripted token server: OpenAI-compatible ``/v1/completions`` streams of exactly N tokens, with the
true send time of every token recorded, in a process of its own (standard library only: raw asyncio).

It stands for a vLLM server whose model costs nothing, so that what is left to measure is the client:
``python benchmarks/fast_server.py [--itl-s 0.01] [--ttft-s 0]`` prints its port on the first line of
stdout and serves on 127.0.0.1 until its stdin closes (so it dies with the process that started it, a
``kill -9`` included) or it gets SIGTERM. :class:`FastServer` starts and stops it.

**The stream** is vLLM's ``/v1/completions`` stream as the lab's ``vllm`` profile asks for it
(:data:`lablib.engines.http.protocol.PROFILES`): one token per chunk, ``token_ids`` in each chunk when the
request has ``return_token_ids`` (the lab's exact count, ``count_method`` ``token_ids``), cumulative ``usage``
on every chunk with ``stream_options.continuous_usage_stats``, ``finish_reason: "length"`` on the N-th token,
a usage-only chunk (``choices: []``) with ``stream_options.include_usage`` (what ``vllm bench`` counts
output tokens from), then ``data: [DONE]``; HTTP/1.1 chunked transfer encoding, keep-alive unless the
client says ``Connection: close``. N is the request's ``max_tokens``, whatever ``ignore_eos`` says. Token
``i`` of a stream has id ``TOKEN_ID0 + i % 1000`` and text ``" a"``, except the first, whose text is the
request's tag ``<rK>`` (K: the server's request number): a client that keeps the streamed text (the lab's
rows' ``text``, ``vllm bench --save-detailed``'s ``generated_texts``) names the request it timed.

**The pace.** ``--itl-s X`` (X > 0): one decode step every X seconds on an absolute schedule, like an
engine's batch: each step writes the next token of every stream in flight, a stream's first token at
the first step ``--ttft-s`` after its request arrived. A step that starts late (the server's own CPU)
is recorded as late: the send times are the truth, not the schedule. ``--itl-s 0``: every stream writes
its tokens as fast as the socket takes them (the transport's buffer is drained past 64 KiB, and the
stream yields to the others every 16 tokens).

**The send times.** Each token's send time is ``time.perf_counter()`` taken just before its bytes are
handed to ``transport.write`` (which sends at once when the socket's buffer has room). On Linux
``perf_counter`` is ``clock_gettime(CLOCK_MONOTONIC)`` (``time.get_clock_info``), one clock for every
process on the machine: the server's send times and the lab's arrival stamps (``lablib.results.trace.now``,
also ``perf_counter``) and ``vllm bench``'s (``time.perf_counter``) are on one time line with no offset to
estimate. ``GET /clock`` answers the server's clock (``{"t": ..., "clock": ...}``): a client that reads its
own clock before and after (:meth:`FastServer.clock_check`) sees the server's value between them.
``GET /sendlog`` answers ``{"requests": [{"rid", "tag", "n", "t_recv", "t_send": [...]}, ...]}`` for the
requests finished since the last ``/sendlog?clear=1``; ``GET /stats`` their count and tokens, and the TCP
connections accepted since the start (``connections``).

Other endpoints: ``GET /v1/models`` (``owned_by: vllm``, ``max_model_len``), ``GET /version``; anything
else is 404 (``/metrics``, ``/props``: the lab's probe then takes it for vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

TOKEN_ID0 = 1000  # token ids TOKEN_ID0 .. TOKEN_ID0 + 999: inside the lab model's vocabulary
MAX_MODEL_LEN = 1 << 20
HIGH_WATER = 64 * 1024  # --itl-s 0: drain the transport past this many buffered bytes
YIELD_EVERY = 16  # --itl-s 0: let other streams write after this many tokens


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event_text(rid: int, i: int, n: int, ids=True, chunk_usage=True, usage=True, prompt_len: int = 1) -> str:
    """The SSE text of token ``i`` (0-based) of request ``rid``'s stream of ``n``; after the last token, the
    usage-only chunk (``usage``) and ``data: [DONE]`` follow in the same text (one write)."""
    text = f"<r{rid}>" if i == 0 else " a"
    last = i == n - 1
    tid = f',"token_ids":[{TOKEN_ID0 + i % 1000}]' if ids else ""
    fin = '"length"' if last else "null"
    p = prompt_len
    u = (
        f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + i + 1},"completion_tokens":{i + 1}}}'
        if chunk_usage
        else ""
    )
    out = (
        f'data: {{"id":"cmpl-{rid}","object":"text_completion","created":0,"model":"fast","choices":'
        f'[{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{fin}{tid}}}]{u}}}\n\n'
    )
    if last:
        if usage:
            out += (
                f'data: {{"id":"cmpl-{rid}","object":"text_completion","created":0,"model":"fast",'
                f'"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{p + n},"completion_tokens":{n}}}}}\n\n'
            )
        out += "data: [DONE]\n\n"
    return out


def stream_payloads(n: int, rid: int = 1, **kw) -> list[bytes]:
    """The bytes of one whole stream of ``n`` tokens, one item per token as the server writes them (without
    the HTTP chunk framing, which a client's HTTP layer takes off): what a client's parser is fed."""
    return [event_text(rid, i, n, **kw).encode() for i in range(n)]


class Stream:
    """One streamed completion: its request's facts and the send time of each token."""

    __slots__ = (
        "rid",
        "n",
        "i",
        "ids",
        "chunk_usage",
        "usage",
        "prompt_len",
        "t_recv",
        "t_send",
        "proto",
        "transport",
        "done",
    )

    def __init__(self, rid, n, ids, chunk_usage, usage, prompt_len, t_recv, proto):
        self.rid, self.n, self.i = rid, n, 0
        self.ids, self.chunk_usage, self.usage, self.prompt_len = ids, chunk_usage, usage, prompt_len
        self.t_recv, self.t_send, self.proto, self.transport = t_recv, [], proto, proto.transport
        self.done = asyncio.get_running_loop().create_future()

    def next_bytes(self) -> bytes:
        """The next token's chunk (and, after the N-th, the stream's end), HTTP chunk framing included."""
        i = self.i
        self.i = i + 1
        out = event_text(self.rid, i, self.n, self.ids, self.chunk_usage, self.usage, self.prompt_len).encode()
        return _chunked(out) + b"0\r\n\r\n" if i == self.n - 1 else _chunked(out)

    def record(self) -> dict:
        return {"rid": self.rid, "tag": f"<r{self.rid}>", "n": self.n, "t_recv": self.t_recv, "t_send": self.t_send}


class Server:
    def __init__(self, itl_s: float, ttft_s: float):
        self.itl_s, self.ttft_s = float(itl_s), float(ttft_s)
        self.rid = 0
        self.log: list[dict] = []
        self.active: list[Stream] = []  # paced mode: streams in flight
        self.joining: list[tuple[float, Stream]] = []  # paced mode: (first step at or after, stream)
        self._wake = None
        self.steps = self.late_steps = 0
        self.connections = 0  # TCP connections accepted since the start

    # --- the paced decode loop -----------------------------------------------------------------
    async def stepper(self):
        loop = asyncio.get_running_loop()
        clock = time.perf_counter
        itl = self.itl_s
        t_next = clock()
        while True:
            if not self.active and not self.joining:
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
                t_next = clock()
            delay = t_next - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_steps += delay < -itl / 2
            t_step = t_next
            t_next += itl
            if t_next < clock() + itl / 2:  # late by half a step or more: the next step is a step from now
                t_next = clock() + itl  # (an engine does not catch up: no burst of steps after a stall)
            self.steps += 1
            if self.joining:
                keep = []
                for t_first, s in self.joining:
                    (self.active.append(s) if t_first <= t_step else keep.append((t_first, s)))
                self.joining = keep
            still = []
            for s in self.active:
                if s.transport.is_closing():
                    self._finish(s)
                    continue
                data = s.next_bytes()
                s.t_send.append(clock())
                s.transport.write(data)
                if s.i < s.n:
                    still.append(s)
                else:
                    self._finish(s)
            self.active = still

    def _finish(self, s: Stream):
        self.log.append(s.record())
        if not s.done.done():
            s.done.set_result(None)

    async def stream(self, s: Stream):
        if self.itl_s > 0:
            self.joining.append((time.perf_counter() + self.ttft_s, s))
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(None)
            await s.done
            return
        if self.ttft_s > 0:
            await asyncio.sleep(self.ttft_s)
        clock, tr = time.perf_counter, s.transport
        while s.i < s.n and not tr.is_closing():
            data = s.next_bytes()
            s.t_send.append(clock())
            tr.write(data)
            if tr.get_write_buffer_size() > HIGH_WATER:
                await s.proto.drain()
            elif s.i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self._finish(s)


class Conn(asyncio.Protocol):
    def __init__(self, server: Server):
        self.server = server
        self.buf = b""
        self.transport = None
        self.queue: asyncio.Queue = asyncio.Queue()
        self._paused = False
        self._drained = None
        self.task = None

    def connection_made(self, transport):
        self.transport = transport
        self.server.connections += 1
        self.task = asyncio.ensure_future(self.serve())

    def data_received(self, data):
        self.queue.put_nowait(data)

    def connection_lost(self, exc):
        self.queue.put_nowait(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self):
        self._paused = True

    def resume_writing(self):
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self):
        if self._paused and not self.transport.is_closing():
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
            self._drained = None

    async def _read_more(self) -> bool:
        data = await self.queue.get()
        if data is None:
            return False
        self.buf += data
        return True

    async def serve(self):
        try:
            while True:
                while b"\r\n\r\n" not in self.buf:
                    if not await self._read_more():
                        return
                head, self.buf = self.buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
                headers = {}
                for ln in lines[1:]:
                    k, _, v = ln.partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length") or 0)
                while len(self.buf) < n:
                    if not await self._read_more():
                        return
                body, self.buf = self.buf[:n], self.buf[n:]
                close = headers.get("connection", "").lower() == "close"
                await self.handle(method, target, body, close)
                if close or self.transport.is_closing():
                    self.transport.close()
                    return
        except Exception as e:  # a bad request: answer 400 once, then close
            if not self.transport.is_closing():
                self._reply(400, {"error": f"{type(e).__name__}: {e}"}, close=True)
                self.transport.close()

    def _reply(self, status: int, obj, close: bool = False):
        body = json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
        )
        self.transport.write(head.encode() + body)

    async def handle(self, method: str, target: str, body: bytes, close: bool):
        srv = self.server
        url = urlsplit(target)
        path = url.path
        if method == "GET" and path == "/v1/models":
            return self._reply(
                200,
                {
                    "object": "list",
                    "data": [{"id": "fast", "object": "model", "owned_by": "vllm", "max_model_len": MAX_MODEL_LEN}],
                },
                close,
            )
        if method == "GET" and path == "/version":
            return self._reply(200, {"version": f"fast-scripted itl {srv.itl_s:g} s"}, close)
        if method == "GET" and path == "/clock":
            info = time.get_clock_info("perf_counter")
            return self._reply(200, {"t": time.perf_counter(), "clock": info.implementation, "pid": os.getpid()}, close)
        if method == "GET" and path == "/stats":
            return self._reply(
                200,
                {
                    "requests": len(srv.log),
                    "tokens": sum(len(r["t_send"]) for r in srv.log),
                    "active": len(srv.active) + len(srv.joining),
                    "steps": srv.steps,
                    "late_steps": srv.late_steps,
                    "connections": srv.connections,
                },
                close,
            )
        if method == "GET" and path == "/sendlog":
            log = srv.log
            if parse_qs(url.query).get("clear") == ["1"]:
                srv.log = []
            return self._reply(200, {"requests": log}, close)
        if method == "POST" and path == "/v1/completions":
            t_recv = time.perf_counter()
            req = json.loads(body or b"{}")
            n = int(req.get("max_tokens") or 16)
            opts = req.get("stream_options") or {}
            prompt = req.get("prompt")
            srv.rid += 1
            s = Stream(
                srv.rid,
                max(1, n),
                bool(req.get("return_token_ids")),
                bool(opts.get("continuous_usage_stats")),
                bool(opts.get("include_usage")),
                len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split()),
                t_recv,
                self,
            )
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                f"Transfer-Encoding: chunked\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
            )
            self.transport.write(head.encode())
            await srv.stream(s)
            return None
        return self._reply(404, {"error": f"no route {method} {path}"}, close)


async def _main(ns) -> None:
    loop = asyncio.get_running_loop()
    srv = Server(ns.itl_s, ns.ttft_s)
    server = await loop.create_server(lambda: Conn(srv), "127.0.0.1", ns.port, backlog=4096)
    stepper = asyncio.ensure_future(srv.stepper()) if srv.itl_s > 0 else None
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    if ns.watch_stdin:  # the parent's end of our stdin closes when it dies: so do we

        def gone():
            try:
                if not os.read(0, 4096):
                    stop.done() or stop.set_result(None)
            except OSError:
                stop.done() or stop.set_result(None)

        loop.add_reader(0, gone)
    await stop
    if stepper is not None:
        stepper.cancel()
    server.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    ap.add_argument("--itl-s", type=float, default=0.01, help="seconds between decode steps; 0: as fast as possible")
    ap.add_argument("--ttft-s", type=float, default=0.0, help="seconds from a request to its first token's step")
    ap.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (the parent died)")
    ns = ap.parse_args(argv)
    if ns.itl_s < 0 or ns.ttft_s < 0:
        ap.error("--itl-s and --ttft-s are seconds, 0 or more")
    asyncio.run(_main(ns))
    return 0


class FastServer:
    """This server in a child process: ``with FastServer(itl_s=0.01) as srv: srv.base_url``.

    ``sendlog(clear=True)`` is the finished requests' send times (and forgets them), ``stats()`` their
    counts, ``clock_check()`` the cross-process clock bracket. The child exits when this object stops it,
    and also when the process that started it dies (its stdin closes)."""

    def __init__(self, itl_s: float = 0.01, ttft_s: float = 0.0, python: str | None = None, log=None):
        self.itl_s, self.ttft_s = itl_s, ttft_s
        self.proc = subprocess.Popen(
            [
                python or sys.executable,
                str(Path(__file__).resolve()),
                "--itl-s",
                str(itl_s),
                "--ttft-s",
                str(ttft_s),
                "--watch-stdin",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log if log is not None else subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the fast server did not start (it printed {line!r})")
        self.port = int(line)
        self.pid = self.proc.pid

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    def _get(self, path: str):
        import urllib.request

        with urllib.request.urlopen(self.root_url + path, timeout=60) as r:
            return json.loads(r.read())

    def sendlog(self, clear: bool = True) -> list[dict]:
        return self._get("/sendlog?clear=1" if clear else "/sendlog")["requests"]

    def stats(self) -> dict:
        return self._get("/stats")

    def clock_check(self) -> dict:
        """The client's clock read before and after the server's (``GET /clock``): ``before <= server <=
        after`` holds when both processes read one clock (``ok``); ``rtt_s`` bounds any offset."""
        t0 = time.perf_counter()
        c = self._get("/clock")
        t1 = time.perf_counter()
        return {
            "before": t0,
            "server": c["t"],
            "after": t1,
            "ok": t0 <= c["t"] <= t1,
            "rtt_s": t1 - t0,
            "server_clock": c["clock"],
            "client_clock": time.get_clock_info("perf_counter").implementation,
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
