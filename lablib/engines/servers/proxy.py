"""A reverse proxy that buffers, in front of a server the lab started: what a stream looks like to a client when
something between it and the server holds the bytes back.

nginx, the most common reverse proxy in front of an inference server, buffers an upstream's answer by default
(``proxy_buffering on``): it reads the answer into its buffers and sends it on when they are full or the answer
ends; a short streamed answer then arrives whole, at its end. An API gateway or a load balancer may do the same.
The client sees a TTFT as long as the whole answer and every token at one instant: the decode is hidden inside
TTFT (the lab says ``decode_unseen`` and gives such a request no TPOT). This proxy does that on 127.0.0.1:
``chunk_bytes`` None holds each answer whole; a number sends it on in pieces of that many bytes (nginx's buffers
are 4 or 8 KiB), so tokens arrive in bursts.

:func:`start_buffering_proxy` runs it as a child process of its own (``python -m lablib.engines.servers.proxy``:
its event loop does not share the lab's process, whose loop stamps the tokens), on a free port, tied to the lab's
process like a server (:func:`lablib.engines.servers.process.start_server`), its log under
``$LABLIB_HOME/servers/``; it returns a :class:`lablib.engines.servers.process.RunningServer` that stands for the
server behind it (its kind, model and settings, with ``proxy`` added), so ``.engine(model)``, ``.base_url`` and
``.stop()`` work as for the server itself.
"""

from __future__ import annotations

import sys

from lablib.errors import LabError

# hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp sets from the body it sends: not passed on
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding", "upgrade"}
)


def _app(upstream: str, chunk_bytes: int | None):
    """The proxy's aiohttp.web application: every method and path passed to ``upstream`` (an origin, no path)."""
    import aiohttp
    from aiohttp import web

    async def start_client(app):
        # one connection per request to the server, never a pooled one: llama-server closes its connection after a
        # streamed answer, and a request sent on a pooled connection it closed meanwhile failed ("Server
        # disconnected": a 502 here), one request in a few on a busy machine (the lab's http engine does the same)
        app["client"] = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(force_close=True),
        )
        yield
        await app["client"].close()

    async def pass_on(request):
        try:
            return await relay(request)
        except aiohttp.ClientError as e:  # the server is gone, or closed the connection: a gateway's 502, in words
            if request.get("sent"):  # pieces already sent on: the connection is cut, as the server's was
                raise
            if isinstance(e, aiohttp.ClientConnectorError):
                why = "does not answer (nothing listens there: it was stopped, or it exited)"
            else:
                why = f"closed the connection before its answer's end ({type(e).__name__})"
            return web.Response(status=502, text=f"bad gateway: the server behind this proxy, {upstream}, {why}")

    async def relay(request):
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with request.app["client"].request(
            request.method, upstream + request.path_qs, headers=headers, data=await request.read()
        ) as up:
            kept = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
            if chunk_bytes is None:  # the whole answer, its stream's end included, before a byte is sent on
                return web.Response(status=up.status, body=await up.read(), headers=kept)
            resp = web.StreamResponse(status=up.status, headers=kept)
            await resp.prepare(request)
            request["sent"] = True
            held = b""
            async for data in up.content.iter_any():
                held += data
                while len(held) >= chunk_bytes:  # a buffer full: sent on
                    await resp.write(held[:chunk_bytes])
                    held = held[chunk_bytes:]
            if held:
                await resp.write(held)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.cleanup_ctx.append(start_client)
    app.router.add_route("*", "/{path:.*}", pass_on)
    return app


def main(argv: list[str] | None = None) -> None:
    """``python -m lablib.engines.servers.proxy --upstream http://127.0.0.1:PORT --port N [--chunk-bytes B]``."""
    import argparse

    from aiohttp import web

    p = argparse.ArgumentParser(prog="python -m lablib.engines.servers.proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="the server's origin: http://127.0.0.1:PORT (no path)")
    p.add_argument("--port", type=int, required=True, help="the port to listen on, on 127.0.0.1")
    p.add_argument(
        "--chunk-bytes", type=int, default=None, help="send on in pieces of this many bytes (default: whole)"
    )
    ns = p.parse_args(argv)
    print(f"buffering proxy: 127.0.0.1:{ns.port} -> {ns.upstream}, " + _holds(ns.chunk_bytes), flush=True)
    # run_app stops on SIGTERM and SIGINT (RunningServer.stop sends SIGTERM)
    web.run_app(_app(ns.upstream.rstrip("/"), ns.chunk_bytes), host="127.0.0.1", port=ns.port, print=None)


def _holds(chunk_bytes: int | None) -> str:
    return "each answer held whole" if chunk_bytes is None else f"answers sent on in pieces of {chunk_bytes} bytes"


def start_buffering_proxy(server, chunk_bytes: int | None = None, timeout_s: float = 60.0):
    """A buffering proxy in front of ``server`` (a RunningServer: :func:`start_server`'s), started and ready (it
    answers ``/v1/models`` through to the server); a RunningServer of the proxy's process that speaks for
    ``server`` (its kind, model id, context and settings, ``proxy`` added to them). ``chunk_bytes``: None holds
    each answer whole (nginx's ``proxy_buffering`` on a short answer); a whole number of bytes, at least 1, sends
    it on in pieces of that size. Stop it with ``.stop()`` (the server behind it runs on)."""
    import datetime as dt
    import os

    from lablib.checks import whole
    from lablib.config import lab_home
    from lablib.engines.servers.process import RunningServer, _launch, free_port

    if not isinstance(server, RunningServer):
        raise LabError(
            f"start_buffering_proxy({server!r}): expected a server the lab started, what start_server(...) returns "
            "(a proxy in front of any URL is not built in: put one there yourself)"
        )
    if chunk_bytes is not None:
        chunk_bytes = whole(chunk_bytes, "chunk_bytes", "a whole number of bytes, at least 1 (None: each answer whole)")
    if not server.alive():
        raise LabError(
            f"{server.name} (pid {server.pid}) is not running: a proxy needs a running server behind it; start it "
            f"again with start_server({server.name!r}, ...)"
        )
    port = free_port()
    logs = lab_home() / "servers"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"buffering-proxy-{port}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.log"
    upstream = server.base_url.removesuffix("/v1")
    argv = [sys.executable, "-m", "lablib.engines.servers.proxy", "--upstream", upstream, "--port", str(port)]
    argv += [] if chunk_bytes is None else ["--chunk-bytes", str(chunk_bytes)]
    proxy = {"upstream": upstream, "upstream_pid": server.pid, "buffering": _holds(chunk_bytes)}
    return _launch(
        dict(
            name=f"{server.name} behind a proxy ({'whole answers' if chunk_bytes is None else f'{chunk_bytes}-byte pieces'})",
            kind=server.kind,
            port=port,
            log_path=log_path,
            argv=argv,
            version=server.version,
            server_model=server.server_model,
            n_ctx=server.n_ctx,
            threads=server.threads,
            settings=dict(server.settings, proxy=proxy),
            behind=server,
        ),
        dict(os.environ),
        {},
        [f"http://127.0.0.1:{port}/v1/models"],
        timeout_s,
        None,
    )


if __name__ == "__main__":
    main()
