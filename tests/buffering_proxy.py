"""A reverse proxy that buffers: each answer is read whole from the server behind it, then sent on in one write,
as nginx does with ``proxy_buffering on`` (its default) for an answer that fits its buffers. aiohttp.web and
aiohttp's client on 127.0.0.1, a free port; every path and method passed through as it came (less hop-by-hop
headers). A real proxy in front of a real server, for the lab's account of a stream that came whole.
"""

from __future__ import annotations

import asyncio
import threading

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class BufferingProxy:
    """``BufferingProxy(upstream).start()`` (returns self); ``stop()``. ``upstream``: the server's origin
    (``http://127.0.0.1:PORT``, no path); ``base_url``: the proxy's, ending in /v1. ``answers``: the answers
    sent on (method, path, status, bytes)."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.answers: list[tuple[str, str, int, int]] = []
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
        import aiohttp
        from aiohttp import web

        self._client = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._pass)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return self._runner.addresses[0][1]

    async def _pass(self, request):
        from aiohttp import web

        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._client.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=await request.read()
        ) as up:
            body = await up.read()  # the whole answer, its stream's end included, before a byte is sent on
            kept = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
        self.answers.append((request.method, request.path, up.status, len(body)))
        return web.Response(status=up.status, body=body, headers=kept)

    def stop(self) -> None:
        async def down():
            await self._runner.cleanup()
            await self._client.close()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
