"""A reverse proxy that buffers: each answer is read whole from the server behind it, then sent on in one write,
as nginx does with ``proxy_buffering on`` (its default) for an answer that fits its buffers. aiohttp.web and
aiohttp's client on 127.0.0.1, a free port; every path and method passed through as it came (less hop-by-hop
headers). A real proxy in front of a real server, for the lab's account of a stream that came whole.
"""

from __future__ import annotations

from sse_server import AppServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class BufferingProxy(AppServer):
    """``BufferingProxy(upstream).start()`` (returns self); ``stop()``. ``upstream``: the server's origin
    (``http://127.0.0.1:PORT``, no path); ``base_url``: the proxy's, ending in /v1. ``answers``: the answers
    sent on (method, path, status, bytes)."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.answers: list[tuple[str, str, int, int]] = []
        super().__init__()

    async def _routes(self, app) -> None:
        import aiohttp

        self._client = aiohttp.ClientSession(auto_decompress=False)
        app.router.add_route("*", "/{path:.*}", self._pass)

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

    async def _close(self) -> None:
        await self._client.close()
