"""A scripted SSE server for the HTTP engine's tests: aiohttp.web on 127.0.0.1, a free port.

It is a protocol fixture, not an engine: each POST replays the current script, a list of steps:
``bytes`` (written as one write), a ``float`` (sleep that many seconds), ``"close"`` (cut the
connection mid-stream), ``"hang"`` (never answer), or ``("status", code, body[, headers])`` as the only
step (an HTTP error, with headers such as Retry-After), or ``("json", code, body)`` (a JSON answer instead
of a stream). :func:`bytewise` makes a stream one write per byte; :class:`SilentServer` accepts
connections and never answers. Scripts in
``queue`` are used one per request first. Every request's path, headers and JSON body are kept
in ``requests``.
"""

from __future__ import annotations

import asyncio
import json
import threading


def sse(obj, sep: str = "\n") -> bytes:
    """One SSE event carrying ``obj`` as JSON (or a string as is), ended by a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}{sep}{sep}".encode()


def cmpl(text=None, logprob_ids=None, finish=None, usage=None, timings=None) -> dict:
    """A /v1/completions stream chunk (usage-only when ``text`` is None and no finish)."""
    obj = {"object": "text_completion", "model": "scripted", "choices": []}
    if text is not None or finish is not None:
        c = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        if logprob_ids is not None:
            c["logprobs"] = {"content": [{"id": i, "token": "?", "logprob": 0.0} for i in logprob_ids]}
        obj["choices"] = [c]
    if usage is not None:
        obj["usage"] = usage
    if timings is not None:
        obj["timings"] = timings
    return obj


def bytewise(raw: bytes, gap: float = 0.0) -> list:
    """Script steps writing ``raw`` one byte per write (each followed by ``gap`` seconds when given)."""
    steps = []
    for i in range(len(raw)):
        steps.append(raw[i : i + 1])
        if gap:
            steps.append(gap)
    return steps


def chat(content=None, role=None, finish=None, reasoning=None, ids=None) -> dict:
    """A /v1/chat/completions stream chunk; ``ids``: its generated token ids, as vLLM sends them with
    ``return_token_ids`` (on every chunk, a reasoning chunk's too)."""
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"object": "chat.completion.chunk", "choices": [choice]}


class ScriptedServer:
    """Start with :meth:`start` (returns self), stop with :meth:`stop`. ``base_url`` ends in /v1."""

    def __init__(self, props: dict | None = None, models: list | None = None):
        self.script: list = []
        self.queue: list[list] = []  # per-request scripts, used first (one per POST), then `script`
        self.requests: list[tuple[str, dict, dict]] = []
        self.in_flight = self.most_in_flight = 0  # POSTs being answered now, and the most at once
        self.props = props  # GET /props answers this when set (llama-server's info endpoint)
        self.models = models if models is not None else [{"id": "scripted", "object": "model", "owned_by": "lab"}]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self):
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._props)
        app.router.add_post("/v1/completions", self._post)
        app.router.add_post("/v1/chat/completions", self._post)
        app.router.add_post("/completion", self._post)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return self._runner.addresses[0][1]

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": self.models})

    async def _props(self, request):
        from aiohttp import web

        if self.props is None:
            return web.Response(status=404, text="Not Found")
        return web.json_response(self.props)

    async def _post(self, request):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append((request.path, dict(request.headers), body))
        script = list(self.queue.pop(0) if self.queue else self.script)
        if script and isinstance(script[0], tuple) and script[0][0] == "status":
            headers = script[0][3] if len(script[0]) > 3 else None
            return web.Response(status=script[0][1], text=script[0][2], headers=headers)
        if script and isinstance(script[0], tuple) and script[0][0] == "json":
            return web.Response(status=script[0][1], text=script[0][2], content_type="application/json")
        if script and script[0] == "hang":
            await asyncio.sleep(60)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for step in script:
            if isinstance(step, bytes):
                await resp.write(step)
            elif isinstance(step, (int, float)):
                await asyncio.sleep(step)
            elif step == "close":
                request.transport.close()
                return resp
            elif step == "hang":
                await asyncio.sleep(60)
        await resp.write_eof()
        return resp

    async def _cancel_rest(self):
        """Cancel handlers still running (a "hang" step), so none is left pending at exit."""
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def stop(self):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        asyncio.run_coroutine_threadsafe(self._cancel_rest(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


class _ThreadServer:
    """A server on 127.0.0.1 whose ``_thread`` serves ``port``: ``start`` (returns self), ``base_url`` (ends in /v1)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self):
        self._thread.start()
        return self


class SilentServer(_ThreadServer):
    """A TCP socket on 127.0.0.1 that accepts every connection and never sends a byte (a stuck server)."""

    def __init__(self):
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._conns: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self):
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._conns.append(conn)  # held open, never read or answered

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        for c in self._conns:
            c.close()
        self._sock.close()


WEB_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title>\n<style>body { width: 35em; }</style></head>\n"
    "<body>\n<h1>Welcome to nginx!</h1>\n<p>If you see this page, the nginx web server is successfully installed "
    "and working.</p>\n" + "<p>Further configuration is required.</p>\n" * 20 + "</body></html>\n"
)


class WebPageServer(_ThreadServer):
    """A plain web server on 127.0.0.1 (http.server in a thread, a free port): every GET and POST answers
    ``page`` (an HTML page: a URL that answers, but is no OpenAI-compatible server) with ``status``; another
    ``content_type`` with its body: a server that answers every path alike (a 401 without a key, a 503 loading)."""

    def __init__(self, page: str = WEB_PAGE, status: int = 200, content_type: str = "text/html; charset=utf-8"):
        import http.server

        body = page.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
