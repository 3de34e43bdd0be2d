"""Any OpenAI-compatible server as an engine: streamed over HTTP, timed with the lab's clock.

``load_engine("http", model, base_url="http://127.0.0.1:8080/v1", api="completions")``.
``model`` is the lab's model: its tokenizer renders chat prompts, turns ids into text for
servers that take text, and re-tokenizes streamed text when the server gives no count.

The clock (DESIGN.md), over HTTP:

- ``t_submit``: the request entered the lab's queue; ``t_start``: its headers were written
  to the socket (aiohttp's ``on_request_headers_sent``), so client-side queueing is
  ``queue_s``, never TTFT;
- bytes are stamped right after each network read, before parsing: every SSE event of
  that read shares the time (:mod:`lablib.engines.http.sse` parses them);
- TTFT is the first event that carries a generated token (text, reasoning, tool calls,
  token ids or logprobs), never a role-only chunk, a ping or a usage-only chunk;
- a chunk of k tokens gives k token events at its arrival time; the gaps between content
  chunks are kept apart (``chunk_gaps_s``), with ``chunk_tokens`` per chunk.

Tokens per chunk, best first (the row's ``count_method`` names the one used):
``token_ids`` (vLLM's ``return_token_ids``; llama-server's native ``/completion`` stream, and its
OpenAI chunks' ``__verbose`` form when asked for ``verbose``), ``logprobs`` (entries per chunk with
their ids), ``usage`` (cumulative usage on every chunk,
vLLM's ``continuous_usage_stats``), ``final_usage`` (the server's final usage is the count,
spread over the chunks by the lab's estimate: a server running another model counts its own
tokens; the lab's count stays in ``retokenized_tokens``), ``retokenized`` (the streamed text so
far through the lab's tokenizer), ``one_per_chunk``. The server's usage is requested and checked
against the client's own count (``usage_mismatch``); llama-server's ``timings`` are kept
(``server_prompt_s``, ``server_decode_tps``, ``http_overhead_s = ttft_s - server_prompt_s``).

Each server kind has a profile (:data:`PROFILES`): whether the completions API takes token
ids, how to ask for a fixed length (``ignore_eos``, ``min_tokens`` or a logit bias against
EOS), the prompt-cache switch, the model id to name. ``server="auto"`` asks the server what it
is. The servers the lab starts itself (:data:`lablib.engines.servers.SERVERS`) carry these profiles.

Sync use goes through :meth:`Engine.generate`; many concurrent streams through
:meth:`HTTPEngine.agenerate`, run on the engine's own event loop (:meth:`HTTPEngine.run`),
as :mod:`lablib.measure.load` does. An API key comes from the environment variable named by
``api_key_env`` at each request; it is never stored, logged or written to a row.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
from typing import ClassVar

from lablib.engines.base import Engine, EngineInfo, GenerationConfig, token_ids
from lablib.engines.http.cards import card_for
from lablib.engines.http.protocol import (
    APIS,
    KINDS,
    PROFILES,
    HTTPEngineError,
    _num,
    _status_message,
    _StreamState,
    retry_after_s,
    server_words,
)
from lablib.engines.http.trace import HTTPTrace
from lablib.errors import LabError, excerpt, is_html
from lablib.results.trace import now

# cache_salt=SALT_PER_REQUEST: a salt of its own for every request (no request reuses another's blocks)
SALT_PER_REQUEST = "per-request"


def _refuse_credentials(base_url: str, api_key_env: str | None) -> None:
    """Raise LabError for a base URL that carries a secret: a user or password (``http://u:p@host``) or a
    query string (``?api_key=...``). The lab writes ``base_url`` into every row, manifest and message, so
    a key belongs in the environment variable ``api_key_env`` instead; the message names the URL without
    what it refuses."""
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    if not (u.username or u.password or u.query):
        return
    host = u.hostname or "?"
    bare = f"{u.scheme}://{host}{f':{u.port}' if u.port else ''}{u.path}"
    what = "a user name or password" if (u.username or u.password) else "a query string"
    raise LabError(
        f"base_url {bare} was given with {what} in it (not repeated here): the lab writes the base URL into "
        f"every row, manifest and message, so it takes none; give {bare} and put the API key in the "
        f"environment variable {api_key_env or 'LABLIB_API_KEY'} (sent as a bearer token, never written)"
    )


# the kinds the probe tells for sure, and how: a server= naming another of the lab's kinds is refused
_SURE_KINDS = {
    "llama-server": "GET /props gives its build_info",
    "vllm": "GET /v1/models says owned_by: vllm",
    "llama-cpp-python": "its OpenAPI title names llama.cpp Python",
}


def _check_host_port(base_url: str) -> None:
    """Raise LabError for a base URL without a host, or whose port is no TCP port (1 to 65535)."""
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    try:
        port = u.port
    except ValueError:
        port = 0
    what = "no host" if not u.hostname else "a port that is not a TCP port from 1 to 65535" if port == 0 else None
    if what:
        raise LabError(
            f"base_url={base_url!r}: {what} in it; expected an http(s) URL such as http://127.0.0.1:8080/v1 "
            "(the host and port the server listens on, then /v1)"
        )


def _lora_name(path) -> str:
    """A llama-server adapter's name from its file (``GET /lora-adapters``' path): a lab adapter's folder
    (``.../r8/adapter-f32.gguf``: ``r8``), else the file's stem."""
    from pathlib import PurePath

    p = PurePath(str(path or "?"))
    return p.parent.name if p.name.startswith("adapter-") and p.parent.name else p.stem


# --- the engine --------------------------------------------------------------------------------
def _refused(e) -> bool:
    """Whether a failed request was the server refusing it before any token: HTTP 400 (llama-server's JSON schema
    conversion), or its own error event with no token yet (vLLM's grammar compile fails in its engine core)."""
    tr = getattr(e, "trace", None)
    return e.status == 400 or (getattr(e, "server_error", False) and not (tr is not None and tr.output_tokens))


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def _event_loop_kind(event_loop: str) -> str:
    """The loop an engine runs its streams on: "uvloop" or "asyncio" (``event_loop`` "auto": uvloop where it
    is installed). uvloop runs the same aiohttp client on libuv: less of the loop's own CPU per read, so at
    hundreds of streams on one process its tokens wait less before they are stamped
    (``benchmarks/client_capacity.py``)."""
    if event_loop not in EVENT_LOOPS:
        raise LabError(f"event_loop={event_loop!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if event_loop == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if event_loop == "uvloop":
            raise LabError(
                "event_loop='uvloop': the uvloop package is not installed (it has no Windows build); expected "
                "it installed: pip install uvloop, or event_loop='auto' (asyncio where uvloop is missing)"
            ) from None
        return "asyncio"
    return "uvloop"


def _new_event_loop(kind: str):
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _event_loop_version(kind: str) -> str:
    """``kind`` with its version, for the manifest: "uvloop 0.23.0", "asyncio (Python 3.11.7)"."""
    if kind == "uvloop":
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return f"asyncio (Python {sys.version.split()[0]})"


class _ReadDeadline:
    """``read_timeout_s`` of silence within a response body, on one timer per stream re-armed about once
    per ``read_timeout_s`` (when it comes due it looks at the last read's time, ``t_read``), not at every read.

    aiohttp's own ``sock_read`` timer cancels and re-schedules a timer handle in every ``data_received``:
    profiled (py-spy, only the thread holding the GIL) at 1,024 streams of 25 tok/s each, that was 13 % of
    the stamping loop's time, the largest part of it the lab could avoid (vLLM's benchmark client sets no
    ``sock_read`` at all). So once a response's headers are in, aiohttp's timer is switched off on that
    connection (``ResponseHandler.read_timeout``, as aiohttp's own websocket client does after its handshake)
    and this one takes over; aiohttp's still bounds the wait for the headers. When silence passes
    ``timeout_s`` the body's stream gets the error aiohttp's timer sets (``ServerTimeoutError``), so the
    request ends as it did before: an HTTPEngineError that keeps the tokens that arrived.

    Silence is the server's, never the client's: bytes that reached the stream's buffer but were not read yet
    (the loop busy or stalled, so the reading task has not run) count as bytes, through the buffer's byte count
    (``StreamReader.total_bytes``), as aiohttp's timer counted them at the socket."""

    __slots__ = ("t_read", "_content", "_handle", "_loop", "_timeout", "_bytes", "_t_bytes")

    def __init__(self, resp, timeout_s: float):
        self.t_read = now()  # the last read of the body (perf_counter s): the caller sets it at each read
        self._content, self._timeout = resp.content, timeout_s
        self._bytes, self._t_bytes = resp.content.total_bytes, self.t_read  # bytes in at the last look, and when
        self._loop = asyncio.get_running_loop()
        if resp.connection is not None:  # this connection's next read drops aiohttp's timer and sets none
            resp.connection.protocol.read_timeout = None
        self._handle = self._loop.call_later(timeout_s, self._due)

    def _due(self) -> None:
        t = now()
        if self._content.total_bytes != self._bytes:  # bytes came in since the last look, read or not yet
            self._bytes, self._t_bytes = self._content.total_bytes, t
        silent = t - max(self.t_read, self._t_bytes)
        if silent < self._timeout:  # bytes came since: due again read_timeout_s after them
            self._handle = self._loop.call_later(self._timeout - silent, self._due)
            return
        import aiohttp

        self._handle = None
        self._content.set_exception(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class HTTPEngine(Engine):
    """An OpenAI-compatible server at ``base_url`` (".../v1"), streamed with aiohttp.

    ``api``: "completions" (prompt as ids where the server takes them), "chat" (the prompt's
    text as one user message, or :meth:`agenerate`'s ``messages``), or "native"
    (llama-server's ``/completion``: token ids in every chunk). ``server``: a kind of
    :data:`KINDS`, or "auto" (asked from the server). ``server_model``: the model id sent
    (default: the first of ``/v1/models``; on vLLM, one it does not list there is refused at load, as vLLM would
    answer each request with a 404; other servers take ids they do not list; rows record it as
    ``server_model``). ``read_timeout_s``: longest silence within a
    response, and longest time without a complete line (a server trickling bytes);
    ``connect_timeout_s``: to open the connection; ``request_timeout_s``: the most one request may take
    from its POST to its stream's end (a wait for a free connection included), however busy the stream:
    a server that keeps sending SSE comments (``: ping``, as mlx_lm.server does during a long prefill)
    never trips ``read_timeout_s``. Default 600 s, finite but generous: twice a load run's default
    ``max_duration_s``, far beyond any request the labs send; ``math.inf``: no limit (the stream is still
    bounded by ``read_timeout_s`` of silence). An HTTP error is never retried (its HTTPEngineError has
    ``retry_after_s`` when the server sent Retry-After). ``api_key_env``: the name of an environment
    variable holding a key (default LABLIB_API_KEY, if set). ``keep_alive``: pool connections (True),
    open one per request (False), or as the server's kind allows (None: pooled for vLLM, one per request
    elsewhere; llama-server drops a pooled connection). ``max_connections``: at most that many open at
    once, later requests waiting for one (in their ``queue_s``); None: no limit. ``event_loop``: the loop
    that reads and stamps the streams: "uvloop" (libuv's, where the ``uvloop`` package is installed: Linux
    and macOS), "asyncio" (the standard library's), or "auto" (uvloop where installed, else asyncio); the
    manifest's ``event_loop`` says which ran (:func:`_event_loop_kind`).

    Prompt caches, switched explicitly and recorded (the manifest's ``cache_control``): ``prompt_cache``
    True sends llama-server ``cache_prompt: true`` (a request may reuse the KV of an earlier prompt its slot,
    or the server's prompt cache in host memory, still holds); False (the default) sends ``cache_prompt:
    false``, the lab's rule that no measured request reuses another's KV cache. Other servers have no such
    per-request switch (vLLM's prefix caching is a server start switch: ``start_server(...,
    prefix_caching=True)``): True is refused there. ``cache_salt``: vLLM's per-request ``cache_salt`` (a
    request reuses only blocks computed under the same salt): a string sent with every request (this
    engine's requests may share blocks with each other, no one else's), or :data:`SALT_PER_REQUEST` (a fresh
    salt for every request: none reuses another's blocks, on a server whose prefix caching is on).

    LoRA adapters (lab 11): a request's ``GenerationConfig.adapter`` names one the server serves (``adapters``:
    name -> llama-server's adapter id; :meth:`_served_adapters` says where the names come from), refused before
    sending otherwise. llama-server gets its ``lora`` list, the named adapter at scale 1 and every other at 0 (all
    0 for ``adapter=None``: the base model, whatever the server's own scales); vLLM, and any server whose
    ``/v1/models`` lists LoRA modules with a parent model, gets ``model``: the adapter's name (the base model's id
    for None). A server that lists none (another kind, another URL) takes no adapter name: the lab cannot tell an
    adapter from another model there.
    """

    # its tokenizer is the lab's, and info what the server said: both still answer after close() (the server
    # keeps running); a request refuses (Engine.generate's check_open)
    needs_open: ClassVar[tuple] = ()

    name = "http"
    requires = "aiohttp"
    install_hint = "pip install 'lablib[serve]' (aiohttp)"
    in_process = False  # the model lives in the server's process; here only the lab's tokenizer

    def __init__(
        self,
        model,
        base_url: str | None = None,
        api: str = "completions",
        server: str = "auto",
        server_model: str | None = None,
        server_version: str | None = None,
        api_key_env: str = "LABLIB_API_KEY",
        n_ctx: int | None = None,
        read_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 600.0,
        max_connections: int | None = None,
        keep_alive: bool | None = None,
        tokenizer=True,
        server_settings: dict | None = None,
        prompt_cache: bool = False,
        cache_salt: str | None = None,
        event_loop: str = "auto",
    ):
        super().__init__(model)
        self._import_library("aiohttp")
        self.event_loop = _event_loop_kind(event_loop)
        if not base_url:
            raise LabError(
                "the http engine needs base_url=... (a server's OpenAI URL, e.g. "
                "http://127.0.0.1:8080/v1); start a server with `lablib serve`, measure it with "
                "`lablib bench --base-url URL`"
            )
        if api not in APIS:
            raise LabError(f"api={api!r}: expected one of {', '.join(APIS)}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise LabError(f"base_url={base_url!r}: expected an http(s) URL such as http://127.0.0.1:8080/v1")
        _check_host_port(base_url)
        _refuse_credentials(base_url, api_key_env)
        for what, v in (("read_timeout_s", read_timeout_s), ("connect_timeout_s", connect_timeout_s)):
            # inf (or nan) would leave a request to a server that never answers waiting forever
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise LabError(f"{what}={v!r}: expected a positive, finite number of seconds")
        v = 600.0 if request_timeout_s is None else request_timeout_s  # None: the default, as load_engine's
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:  # nan is not > 0
            raise LabError(f"request_timeout_s={v!r}: expected a positive number of seconds (math.inf: no limit)")
        self.request_timeout_s = float(v)
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.api = api
        self.api_key_env = api_key_env
        self.read_timeout_s, self.connect_timeout_s = float(read_timeout_s), float(connect_timeout_s)
        from lablib.checks import whole

        self.max_connections = (
            None
            if max_connections is None
            else whole(max_connections, "max_connections", "a whole number >= 1 or None")
        )
        if keep_alive not in (None, True, False):
            raise LabError(f"keep_alive={keep_alive!r}: expected True, False or None (as the server's kind allows)")
        self._keep_alive = False  # the probe opens one connection per request: the kind is not known yet
        self._loop = None
        self._thread = None
        self._session = None
        self._lock = threading.Lock()
        self._tok = None
        if tokenizer and model is not None:
            from lablib.model.tokenizer import lab_tokenizer

            self._tok = lab_tokenizer(model)
            self.n_vocab = len(self._tok)
        self.server_info: dict = {}
        if server_settings is None:  # a server the lab started, perhaps in another process: its card
            server_settings = (card_for(base_url) or {}).get("settings")
        self.server_settings = dict(server_settings or {})  # what the server was started with, when known
        kind = server if server != "auto" else None
        if kind is not None and kind not in KINDS:
            raise LabError(f"server={server!r}: expected one of {', '.join(KINDS)} or 'auto'")
        try:
            self.run(self._probe())  # reachability, kind, version, model id, context
        except BaseException:
            self.close()
            raise
        probed = self.server_info.get("kind")
        if kind not in (None, "openai", probed) and probed in _SURE_KINDS:
            self.close()  # the probe's event loop and HTTP session
            raise LabError(
                f"server={server!r}, but {self.base_url} answers as a {probed} server ({_SURE_KINDS[probed]}): its "
                f"requests would carry the wrong fields (a {probed} server's prompt cache, say, left on) and its rows "
                f"the wrong name; expected server='auto' (or {probed!r}), or 'openai' for plain OpenAI requests"
            )
        self.kind = kind or probed or "openai"
        self.profile = PROFILES[self.kind]
        self.server_model = server_model or self.profile.model_id or self.server_info.get("model_id")
        listed = self.server_info.get("model_ids") or []
        # vLLM answers an id it does not serve with a 404 per request: refused here, at once. Other servers take
        # ids they do not list (llama-server: any, its one model; Ollama: "llama3.2" for "llama3.2:latest";
        # mlx_lm.server and transformers serve load another model on request): sent as given, recorded in rows
        if self.kind == "vllm" and server_model and listed and server_model not in listed:
            self.close()  # the probe's event loop and HTTP session
            shown = ", ".join(map(repr, listed[:10])) + (f" and {len(listed) - 10} more" if len(listed) > 10 else "")
            raise LabError(
                f"server_model={server_model!r}: the {self.kind} server at {self.base_url} lists no such model "
                f"(GET /v1/models: {shown}); expected one of its ids, or none for its first ({listed[0]!r})"
            )
        self.server_version = server_version or self.server_info.get("version") or "unknown"
        self.adapters = self._served_adapters()
        if api == "native" and self.kind != "llama-server":
            self.close()  # the probe's event loop and HTTP session
            raise LabError(
                f"api='native' is llama-server's /completion, but {self.base_url} is a {self.kind} "
                "server; use api='completions' or 'chat'"
            )
        self.n_ctx = int(n_ctx or self.server_info.get("n_ctx") or getattr(model, "max_position_embeddings", 0) or 2048)
        try:
            self.prompt_cache, self.cache_salt = self._cache_switches(prompt_cache, cache_salt)
        except LabError:
            self.close()  # the probe's event loop and HTTP session
            raise
        import uuid

        self._salt_id, self._salts = uuid.uuid4().hex[:12], 0  # SALT_PER_REQUEST: lab-<id>-<n>, one per request
        self.keep_alive = self.profile.keep_alive if keep_alive is None else bool(keep_alive)
        if self.keep_alive:  # the probe's session closed its connections; requests get a pooled one
            self.run(self._close_session())
            self._keep_alive = True

    def _served_adapters(self) -> dict[str, int | None]:
        """The LoRA adapters a request may name (GenerationConfig.adapter), name -> llama-server's adapter id (None
        elsewhere): those the lab started the server with (its settings' ``adapters``, in ``--lora`` order: their
        ids), none for another server the lab started; at any other URL what the server says: llama-server's
        ``GET /lora-adapters`` (each named by its file: a lab adapter's folder, ``<name>/adapter-f32.gguf``, else
        the file's stem), or the ``/v1/models`` entries that name a parent model (vLLM's ``--lora-modules``)."""
        said = self.server_settings.get("adapters")
        if said is not None:
            return {a["name"]: i for i, a in enumerate(said)}
        if self.server_settings.get("n_ctx"):  # a server the lab started without adapters
            return {}
        found = self.server_info.get("adapters") or []
        if self.kind == "llama-server":
            return {a[0]: a[1] for a in found if isinstance(a, tuple)}
        return {a: None for a in found if isinstance(a, str)}

    def check_adapter_request(self, cfg: GenerationConfig) -> None:
        """LabError, before anything is sent, for ``cfg.adapter`` naming an adapter the server does not serve (its
        name, as :meth:`_served_adapters` knows them); None (the base model) always passes. A server serves
        several adapters, one per request; an in-process engine only the one it was loaded with."""
        adapter = cfg.adapter
        if adapter is None or adapter in self.adapters:
            return
        if self.adapters:
            has = f"serves the adapters {', '.join(self.adapters)}"
        elif self.server_settings.get("n_ctx"):
            has = (
                "was started without adapters: start it with start_server(name, model, options={'adapters': "
                "[make_adapter(model, rank=8), ...]}) (llama-server, vLLM)"
            )
        else:
            has = (
                "lists no LoRA adapter (llama-server: GET /lora-adapters; vLLM: /v1/models entries with a parent, its "
                "--lora-modules)"
            )
        raise LabError(
            f"adapter={adapter!r}: the {self.kind} server at {self.base_url} {has}; expected one of those, or None "
            "(the base model)"
        )

    def _adapter_fields(self, cfg: GenerationConfig) -> dict:
        """The request fields that choose ``cfg.adapter`` (None: the base model): llama-server's ``lora``, every
        adapter it loaded with its scale (1 for the named one, 0 for the rest: one it does not list would run at
        its server-wide scale); elsewhere ``model``, the adapter's name (vLLM's LoRA module). Nothing for a server
        without adapters."""
        self.check_adapter_request(cfg)
        if self.kind == "llama-server":
            if not self.adapters:
                return {}
            return {"lora": [{"id": i, "scale": 1.0 if n == cfg.adapter else 0.0} for n, i in self.adapters.items()]}
        return {} if cfg.adapter is None else {"model": cfg.adapter}

    def _cache_switches(self, prompt_cache, cache_salt) -> tuple[bool, str | None]:
        """``prompt_cache`` and ``cache_salt`` checked against what this kind of server honours."""
        if not isinstance(prompt_cache, bool):
            raise LabError(f"prompt_cache={prompt_cache!r}: expected True (reuse allowed) or False (the lab's default)")
        if prompt_cache and "cache_prompt" not in self.profile.extra:
            raise LabError(
                f"prompt_cache=True: a {self.kind} server has no per-request prompt-cache switch (llama-server's "
                "cache_prompt); where its prefix cache is a server start switch (vLLM), start it with "
                "start_server(..., prefix_caching=True)"
            )
        if cache_salt is None:
            return bool(prompt_cache), None
        if self.kind != "vllm":
            raise LabError(f"cache_salt={cache_salt!r}: vLLM's cache_salt, but {self.base_url} is a {self.kind} server")
        bad = not isinstance(cache_salt, str) or not 0 < len(cache_salt) <= 100 or set(cache_salt) & set("@/\\\x00")
        if bad:
            raise LabError(
                f"cache_salt={cache_salt!r}: expected a string of 1 to 100 characters without @, / or \\ "
                f"(vLLM's rule), or {SALT_PER_REQUEST!r} for a salt of its own per request"
            )
        return bool(prompt_cache), cache_salt

    def _cache_control(self) -> str:
        """What the requests say about prompt caches, in words: ``cache_prompt: true`` / ``false`` (llama-server),
        ``cache_salt: per-request`` or ``cache_salt: <salt>`` (vLLM), ``none`` (no switch sent)."""
        if "cache_prompt" in self.profile.extra:
            return f"cache_prompt: {'true' if self.prompt_cache else 'false'}"
        if self.cache_salt is not None:
            return f"cache_salt: {self.cache_salt}"
        return "none"

    def _next_salt(self) -> str | None:
        """The salt of the next request: the engine's ``cache_salt``, or (SALT_PER_REQUEST) one of its own."""
        if self.cache_salt != SALT_PER_REQUEST:
            return self.cache_salt
        self._salts += 1
        return f"lab-{self._salt_id}-{self._salts}"

    # --- the engine's event loop (one thread, one aiohttp session) -----------------------------
    def submit(self, coro):
        """Schedule ``coro`` on the engine's event loop (started on first use) and return at once: a
        ``concurrent.futures.Future`` of its result (``cancel()`` stops it). A load run goes this way
        (:func:`lablib.measure.load.run_load`), its rows taken off in the calling thread meanwhile."""
        with self._lock:
            if self._loop is None:
                self._loop = _new_event_loop(self.event_loop)
                self._thread = threading.Thread(target=self._loop.run_forever, name="lablib-http", daemon=True)
                self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro):
        """Run ``coro`` on the engine's event loop (started on first use) and return its result.

        Works from scripts and from notebooks (whose own loop is already running). An interrupt of the
        wait (Ctrl-C; SIGTERM in ``lablib bench``) cancels ``coro`` too: it is not left running on the loop."""
        fut = self.submit(coro)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # done already (its own error): no-op
            raise

    def _get_session(self):
        import aiohttp

        if self._session is None:
            trace_cfg = aiohttp.TraceConfig()

            async def headers_sent(session, ctx, params):
                box = ctx.trace_request_ctx
                if isinstance(box, dict) and box.get("t_start") is None:
                    box["t_start"] = now()

            trace_cfg.on_request_headers_sent.append(headers_sent)
            # One connection per request (force_close) unless the server's kind keeps them (its profile's
            # keep_alive: vLLM) or keep_alive=True: llama-server closes a connection after a streamed
            # answer, and a pooled connection closed that way failed the next POST ("Can not write
            # request body") for every second request. A new connection's connect (~0.1 ms on loopback)
            # counts into queue_s, as a wait for a free one does under max_connections (t_start is when
            # the request's headers are sent); a pooled one skips it, as vllm bench's client does.
            # max_connections None: no limit (aiohttp's 0), so no request waits in the client unseen.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections or 0,
                    **({"keepalive_timeout": 60} if self._keep_alive else {"force_close": True}),
                ),
                trace_configs=[trace_cfg],
                auto_decompress=False,
            )
        return self._session

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _timeout(self, total: float | None = None):
        import aiohttp

        return aiohttp.ClientTimeout(total=total, connect=self.connect_timeout_s, sock_read=self.read_timeout_s)

    async def _get_json(self, url, why: dict | None = None):
        """The JSON at ``url``, or None; ``why`` (a dict) gets the reason of a None as ``reason`` (a timeout ...;
        where the server answered, "HTTP <status>, <content type>" and an excerpt of what it sent: never a whole
        page) and, where it answered, ``status``, ``body`` and ``content_type``."""
        import aiohttp

        reason = None
        try:
            async with self._get_session().get(url, headers=self._headers(), timeout=self._timeout()) as r:
                text = await r.text(errors="replace")
                said = excerpt(text, r.content_type, 80)
                found = f"HTTP {r.status}, {r.content_type or 'no content type'}" + (f" ({said!r})" if said else "")
                if why is not None:
                    why.update(status=r.status, body=text, content_type=r.content_type)
                if r.status != 200:
                    reason = found
                else:
                    try:
                        return json.loads(text)
                    except ValueError:
                        reason = f"{found}, not JSON"
        except aiohttp.ConnectionTimeoutError:
            reason = f"no connection within {self.connect_timeout_s:g} s (connect_timeout_s={self.connect_timeout_s:g})"
        except asyncio.TimeoutError:
            reason = f"no answer within {self.read_timeout_s:g} s (read_timeout_s={self.read_timeout_s:g})"
        except aiohttp.ClientConnectorError as e:
            refused = isinstance(e.os_error, ConnectionRefusedError)
            reason = "connection refused: nothing listens there" if refused else f"cannot connect: {e.os_error or e}"
        except aiohttp.ClientError as e:
            reason = f"{type(e).__name__}: {e}"
        if why is not None:
            why["reason"] = reason
        return None

    async def _probe(self) -> None:
        info = self.server_info
        why: dict = {}
        models = await self._get_json(f"{self.base_url}/models", why)
        health_only = False
        # no second question to a server that let the first time out (was: /health waited as long again)
        timed_out = models is None and why.get("status") is None and "_timeout_s=" in (why.get("reason") or "")
        if models is None and not timed_out and await self._get_json(f"{self.root_url}/health") is not None:
            models, health_only = {}, True  # a healthy server whose model list fails (mlx_lm.server, no hub cache)
        status = why.get("status")
        if models is None and status is not None and (status in (401, 403, 429) or status >= 500):
            # a server that answers, but not yet or not to this client: an API key, its load, its own failure
            raise LabError(
                _status_message(status, f"{self.base_url}/models", why["body"], "", None, None, why["content_type"])
            )
        if models is None and status is not None:  # something answers there, but not as an OpenAI server
            raise LabError(
                f"no OpenAI-compatible server answers at {self.base_url}: GET /models gave {why['reason']}; expected JSON "
                'listing the server\'s models ({"data": [{"id": ...}]}): check that the URL is an OpenAI-compatible '
                "server's base URL (it ends in /v1, e.g. http://127.0.0.1:8080/v1), or start one with "
                "`lablib serve --server NAME`"
            )
        if models is None:
            slow = "_timeout_s=" in why["reason"]
            raise LabError(
                f"no OpenAI-compatible server answers at {self.base_url} (GET /models failed: {why['reason']}); "
                "expected a running server: start one with `lablib serve --server NAME`, or check "
                "the URL (it ends in /v1)"
                + ("; for a slow server give a larger connect_timeout_s= or read_timeout_s= (seconds)" if slow else "")
            )
        data = models.get("data") if isinstance(models, dict) else None
        if not health_only and not isinstance(data, list):  # JSON, but no model list: not an OpenAI server's
            shown = json.dumps(models)[:120]
            raise LabError(
                f"no OpenAI-compatible server answers at {self.base_url}: GET /models gave JSON with no model list "
                f'({shown}); expected {{"data": [{{"id": ...}}]}}: check that the URL is an OpenAI-compatible '
                "server's base URL (it ends in /v1), or start one with `lablib serve --server NAME`"
            )
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        info["model_id"] = first.get("id")
        # LoRA modules a server lists beside its model, each naming the model it adapts (vLLM's ModelCard.parent)
        entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        info["model_ids"] = [str(m["id"]) for m in entries if m.get("id") is not None]  # what requests may name
        info["adapters"] = [str(m["id"]) for m in entries if m.get("parent") and m.get("id") is not None]
        owner = str(first.get("owned_by", ""))
        props = await self._get_json(f"{self.root_url}/props")
        if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
            info.update(kind="llama-server", version=str(props.get("build_info", "")))
            n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
            if _num(n_ctx):
                info["n_ctx"] = int(n_ctx)
            # its LoRA adapters (--lora), by id: [{"id", "path", "scale"}, ...] (server-task.cpp, get_lora)
            loras = await self._get_json(f"{self.root_url}/lora-adapters")
            info["adapters"] = [
                (_lora_name(a.get("path")), int(a["id"]))
                for a in (loras if isinstance(loras, list) else [])
                if isinstance(a, dict) and _num(a.get("id")) is not None
            ]
            return
        if owner == "vllm":
            info["kind"] = "vllm"
            v = await self._get_json(f"{self.root_url}/version")
            info["version"] = (v or {}).get("version")
            if _num(first.get("max_model_len")):
                info["n_ctx"] = int(first["max_model_len"])
            return
        spec = await self._get_json(f"{self.root_url}/openapi.json")
        title = str(((spec or {}).get("info") or {}).get("title", ""))
        if "llama.cpp Python" in title:
            info.update(kind="llama-cpp-python", version=(spec.get("info") or {}).get("version"))
        elif owner == "mlx" or (not spec and (health_only or "mlx" in str(info.get("model_id", "")).lower())):
            info["kind"] = "mlx"
        elif owner in ("huggingface", "transformers"):
            info["kind"] = "transformers"
        else:
            info["kind"] = "openai"

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _end_tasks(self, grace_s: float = 5.0) -> None:
        """Cancel what still runs on the loop (a probe or request whose caller was interrupted), and wait for
        it: left running, a probe went on to open a new session, destroyed pending when the loop closed."""
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=grace_s)

    def close(self) -> None:
        """Close the HTTP session and stop the engine's event loop (the server keeps running)."""
        if self._loop is None:
            return
        self.run(self._end_tasks())
        self.run(self._close_session())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = None

    # --- tokenizer (the lab's) ------------------------------------------------------------------
    def _need_tok(self, what: str):
        if self._tok is None:
            raise LabError(
                f"{what} needs the lab's tokenizer, but this http engine was loaded without a model; "
                "load it with the model the server runs (load_engine('http', MODEL, ...))"
            )
        return self._tok

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self._need_tok("tokenize")(text, add_special_tokens=add_special)["input_ids"])

    def detokenize(self, ids) -> str:
        ids = token_ids(ids)
        self.check_ids(ids)
        return self._need_tok("detokenize").decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        tok = self._need_tok("a chat prompt")
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.tokenize(text)

    @property
    def eos_ids(self) -> set[int]:
        tok = self._tok
        if tok is None:
            return set()
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        gen = getattr(self.model, "eos_token_ids", None)
        return ids | set(gen or ())

    @property
    def bos_id(self):
        return None if self._tok is None else self._tok.bos_token_id

    def _larger_context(self) -> str:
        """The server's knob, not this engine's n_ctx= (which only makes the lab send what the server refuses):
        ``--n-ctx`` for a server the lab started (its card, or the settings it was started with), else its own
        setting, with the context it states (:func:`lablib.engines.http.protocol.larger_context`)."""
        from lablib.engines.http.protocol import larger_context

        started = self.server_settings.get("n_ctx") and {"name": self.kind, "settings": self.server_settings}
        # a proxy the lab started (lablib.engines.servers.proxy) holds no context: the server behind it does
        upstream = (self.server_settings.get("proxy") or {}).get("upstream")
        hint = larger_context(
            self.kind,
            f"{upstream}/v1, behind the proxy at {self.base_url}," if upstream else self.base_url,
            self.n_ctx,
            self.server_info.get("n_ctx"),
            card_for(self.base_url) or started or None,
            getattr(self.model, "max_position_embeddings", None),
        )
        return f"{hint}; then start_buffering_proxy in front of it again" if upstream else hint

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            version=f"{self.kind} {self.server_version}",
            backend=f"{self.kind} at {self.base_url}",
            dtype="server",
            threads=0,
            n_ctx=self.n_ctx,
            # the server's device, as the lab read it when it started the server (lablib.engines.servers.device);
            # a server at any other URL does not say: "unknown", never this client's device
            device=self.server_settings.get("device") or "unknown",
            flags={
                "api": self.api,
                "server_device": self.server_settings.get("device_name") or "unknown",
                "server": self.kind,
                "server_version": self.server_version,
                # the id requests name (native /completion requests name none); a LoRA request names its adapter
                "server_model": None if self.api == "native" else self.server_model,
                "base_url": self.base_url,
                "fixed_length": self.profile.fixed,
                "prompt_as": self._prompt_as(),
                "cache_control": self._cache_control(),
                "api_key_env": self.api_key_env if os.environ.get(self.api_key_env or "") else None,
                "server_settings": self.server_settings or None,
                # how requests reached the server: a connection each, or pooled (keep-alive); and the cap
                "connections": "pooled" if self._keep_alive else "one per request",
                "max_connections": self.max_connections,
                "event_loop": _event_loop_version(self.event_loop),
                # the LoRA adapters its requests may name (GenerationConfig.adapter); None: none
                "adapters": list(self.adapters) or None,
            },
        )

    def _prompt_as(self) -> str:
        if self.api == "native" or (self.api == "completions" and self.profile.ids):
            return "token_ids"
        return "messages" if self.api == "chat" else "text"

    # --- requests ------------------------------------------------------------------------------
    @property
    def constraints(self) -> tuple[str, ...]:
        """The Constraint kinds this server's requests carry (its profile's ``constraint`` form)."""
        return ("json_schema", "regex") if self.profile.constraint else ()

    def _constraint_body(self, c) -> dict:
        """The request fields that carry constraint ``c`` (:attr:`ServerProfile.constraint`)."""
        if self.profile.constraint == "structured_outputs":
            return {"structured_outputs": {"json" if c.kind == "json_schema" else "regex": c.spec}}
        if c.kind == "json_schema":
            return {"json_schema": c.spec}
        from lablib.engines.llamacpp import _to_gbnf  # llama.cpp's own converter (llama-cpp-python's port)

        return {"grammar": _to_gbnf("regex", c.spec)}

    def _constraint_error(self, ids, cfg: GenerationConfig, err) -> LabError:
        """A server's refusal of a constraint (HTTP 400) as a ConstraintError: the server's message and the part of
        the schema that fails alone (each part probed with a one-token request; a refusal costs no decode)."""
        from dataclasses import replace

        from lablib.engines.base import Constraint, ConstraintError, schema_part

        c = cfg.constraint

        def fails(sub) -> bool:
            probe = replace(cfg, max_new_tokens=1, constraint=Constraint.json_schema(sub, c.name))
            try:
                self.run(self.agenerate(ids, probe, _checked=True))
            except HTTPEngineError as e:
                return _refused(e)
            return False

        part = schema_part(c.spec, fails) if c.kind == "json_schema" else None
        return ConstraintError(f"{self.kind} server (http engine)", c, err.server_said or str(err), part)

    def _request(self, ids: list[int], cfg: GenerationConfig, messages=None) -> tuple[str, dict, int]:
        """(url, JSON body, prompt tokens as the lab counts them) for one request."""
        p = self.profile
        self.check_constraint(cfg)
        if self.api == "native":
            body = {
                "prompt": ids,
                "n_predict": cfg.max_new_tokens,
                "stream": True,
                "return_tokens": True,
                "cache_prompt": self.prompt_cache,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "seed": cfg.seed,
            }
            if cfg.greedy:
                body["top_k"] = 1
            if cfg.ignore_eos:
                body["ignore_eos"] = True
            if cfg.constraint is not None:
                body.update(self._constraint_body(cfg.constraint))
            body.update(self._adapter_fields(cfg))
            return f"{self.root_url}/completion", body, len(ids)
        body = {
            "stream": True,
            "max_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "seed": cfg.seed,
            "stream_options": {"include_usage": True, **({"continuous_usage_stats": True} if p.chunk_usage else {})},
        }
        if self.server_model:
            body["model"] = self.server_model
        body.update({k: v for k, v in p.extra.items() if v is not None})
        if "cache_prompt" in p.extra:  # the explicit switch (False unless prompt_cache=True)
            body["cache_prompt"] = self.prompt_cache
        if self.cache_salt is not None:
            body["cache_salt"] = self._next_salt()
        if p.logprobs:
            body["logprobs"] = 1 if self.api == "completions" else True
        if cfg.ignore_eos:
            if p.fixed in ("ignore_eos",):
                body["ignore_eos"] = True
            if p.fixed == "min_tokens" or self.kind == "vllm":
                body["min_tokens"] = cfg.max_new_tokens
            if p.fixed == "generation_config":
                body["generation_config"] = json.dumps(
                    {
                        "max_new_tokens": cfg.max_new_tokens,
                        "min_new_tokens": cfg.max_new_tokens,
                        "do_sample": not cfg.greedy,
                    }
                )
            if p.fixed == "logit_bias" and self.eos_ids:
                body["logit_bias"] = {str(e): -100 for e in sorted(self.eos_ids)}
        if cfg.constraint is not None:
            body.update(self._constraint_body(cfg.constraint))
        body.update(self._adapter_fields(cfg))
        if self.api == "completions":
            if p.ids:
                body["prompt"], n = list(ids), len(ids)
            else:
                body["prompt"], n = self.detokenize(ids), len(ids)
            return f"{self.base_url}/completions", body, n
        if messages is None:
            messages = [{"role": "user", "content": self.detokenize(ids)}]
        body["messages"] = messages
        n = len(self.apply_chat_template(messages)) if self._tok is not None else len(ids)
        return f"{self.base_url}/chat/completions", body, n

    def generate(self, ids, cfg=None, t_submit=None, messages=None) -> HTTPTrace:
        """One streamed request (blocking); an :class:`HTTPTrace`. With ``messages`` (chat api)
        the prompt is those messages and ``ids`` may be empty. Raises HTTPEngineError, and
        ContextOverflowError before any work when prompt + output cannot fit ``n_ctx``."""
        cfg = cfg or GenerationConfig()
        if messages is None:
            ids = [int(i) for i in ids]
            if not ids:
                raise LabError("empty prompt: expected at least one token id")
            self.check_ids(ids)
            self.check_context(len(ids), cfg.max_new_tokens)
        try:
            return self.run(self.agenerate(ids, cfg, t_submit=t_submit, messages=messages, _checked=True))
        except HTTPEngineError as e:
            if cfg.constraint is None or not _refused(e) or messages is not None:
                raise
            raise self._constraint_error(ids, cfg, e) from e

    async def agenerate(
        self,
        ids,
        cfg: GenerationConfig | None = None,
        t_submit: float | None = None,
        messages=None,
        _checked: bool = False,
        box: dict | None = None,
    ) -> HTTPTrace:
        """One streamed request on the engine's loop; returns its HTTPTrace when the stream ends.

        Raises HTTPEngineError (with ``.trace``: what arrived) for a refused connection, an HTTP
        error status (429, 500 ...), an error event, a stream cut before its end, ``read_timeout_s``
        without a byte, or ``request_timeout_s`` without the stream's end. ``box``: a dict that gets the
        trace under "trace" as soon as it exists (a cancelled caller keeps what arrived).
        """
        import aiohttp

        from lablib.engines.http.sse import SSEParser

        cfg = cfg or GenerationConfig()
        ids = [int(i) for i in ids]
        if messages is None and not _checked:
            if not ids:
                raise LabError("empty prompt: expected at least one token id")
            self.check_ids(ids)
        if messages is not None and self.api != "chat":
            raise LabError(f"messages need api='chat'; this engine uses api={self.api!r}")
        url, body, n_prompt = self._request(ids, cfg, messages)
        trace = HTTPTrace(
            prompt_tokens=n_prompt,
            t_submit=now() if t_submit is None else t_submit,
            server=self.kind,
            api=self.api,
            max_new_tokens=cfg.max_new_tokens,
            fixed_length=(self.profile.fixed if self.api != "native" else "ignore_eos") if cfg.ignore_eos else "off",
        )
        if box is not None:
            box["trace"] = trace
        box = {"t_start": None}
        state = _StreamState(self, trace)
        parser = SSEParser()
        try:
            t_post = now()
            async with self._get_session().post(
                url,
                json=body,
                headers=self._headers(),
                timeout=self._timeout(self.request_timeout_s if self.request_timeout_s < math.inf else None),
                trace_request_ctx=box,
            ) as resp:
                trace.start(box["t_start"] or t_post)
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    wait = retry_after_s(resp.headers.get("Retry-After"))
                    msg = _status_message(resp.status, url, text, self.kind, self.server_model, wait, resp.content_type)
                    err = HTTPEngineError(msg, trace, resp.status, retry_after_s=wait)
                    err.server_said = None if is_html(resp.content_type, text) else server_words(text)
                    raise err
                if is_html(resp.content_type):  # a web page, not an API: every request would fail the same way
                    said = excerpt(await resp.text(errors="replace"), resp.content_type, 80)
                    raise HTTPEngineError(
                        f"{url} answered HTTP 200 with an HTML page ({resp.content_type}: {said!r}), not an event "
                        "stream; expected an OpenAI-compatible server's streamed answer: check the base URL (it "
                        "ends in /v1) and the api ('completions' or 'chat')",
                        trace,
                        resp.status,
                    )
                if resp.content_type == "application/json":  # an answer, not a stream: usually an error
                    text = (await resp.text(errors="replace"))[:300]
                    raise HTTPEngineError(
                        f"{url} answered with JSON, not an event stream: {text!r}; expected a streaming "
                        "server (stream: true): read the server's message",
                        trace,
                        resp.status,
                    )
                t_line, lines = now(), 0  # the last time a line completed: a trickle of bytes is no progress
                deadline = _ReadDeadline(resp, self.read_timeout_s)
                try:
                    async for data in resp.content.iter_any():
                        t = deadline.t_read = now()  # bytes arrived: stamp before parsing
                        trace.reads += 1
                        events = parser.feed(data)
                        if parser.lines > lines:
                            t_line, lines = t, parser.lines
                        elif t - t_line > self.read_timeout_s:
                            raise HTTPEngineError(
                                f"{url} sent bytes but no complete line for {t - t_line:.1f} s (read_timeout_s "
                                f"{self.read_timeout_s:g}) after {trace.output_tokens} tokens: a trickle, not a stream; "
                                "the server or the network is stuck: raise read_timeout_s, or restart the server",
                                trace,
                            )
                        trace.max_events_per_read = max(trace.max_events_per_read, len(events))
                        for ev in events:
                            trace.events += 1
                            if state.event(ev, t):
                                break
                        if state.done:
                            break
                finally:
                    deadline.cancel()
            trace.pings = parser.comments
            if not state.done and not state.finished:
                raise HTTPEngineError(
                    f"the stream from {url} ended before its end ([DONE] or a finish_reason) "
                    f"after {trace.output_tokens} tokens; the server closed the connection",
                    trace,
                )
        except HTTPEngineError as e:
            trace.error = str(e)
            trace.pings = parser.comments
            raise
        except aiohttp.ConnectionTimeoutError:
            trace.error = (
                f"cannot connect to {url} within {self.connect_timeout_s:g} s (connect_timeout_s; lablib bench's "
                "--connect-timeout-s); the server or the network is down or overloaded: check the URL, raise "
                "connect_timeout_s, or restart the server"
            )
            raise HTTPEngineError(trace.error, trace) from None
        except asyncio.TimeoutError as e:
            if not isinstance(e, aiohttp.ServerTimeoutError):  # aiohttp's total (request_timeout_s), not sock_read
                trace.pings = parser.comments
                trace.error = (
                    f"the {self.kind} server at {url} did not finish the request within {self.request_timeout_s:g} s "
                    f"(request_timeout_s; lablib bench's --request-timeout-s): {trace.output_tokens} tokens and "
                    f"{parser.comments} keep-alive comments came, but no end; the server may be stuck in a long "
                    "prefill or a queue: raise request_timeout_s (math.inf: no limit) for longer requests, lower the "
                    "load, or restart the server"
                )
                raise HTTPEngineError(trace.error, trace) from None
            trace.error = (
                f"no byte from {url} for {self.read_timeout_s:g} s (read_timeout_s; --read-timeout-s in lablib bench "
                f"and replay) after {trace.output_tokens} tokens; the server is stuck or overloaded: raise "
                "read_timeout_s, lower the load, or restart the server"
            )
            raise HTTPEngineError(trace.error, trace) from None
        except aiohttp.ClientConnectorError as e:
            said = {  # a server that exited: nothing listens; one exiting: the connection reset as it opened
                ConnectionRefusedError: "connection refused: nothing listens there, ",
                ConnectionResetError: "connection reset by the server as it opened: it may be exiting, ",
            }.get(type(e.os_error), "")
            trace.error = (
                f"cannot connect to {url} ({said}{e.os_error or e}); expected a running server: start one with "
                "`lablib serve --server NAME` (or restart the one that exited: read its log), or check the URL"
            )
            raise HTTPEngineError(trace.error, trace) from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            # a server that died (killed, crashed) resets the connection or closes it without an end
            trace.error = (
                f"the server closed the connection to {url} mid-stream after {trace.output_tokens} tokens "
                f"({type(e).__name__}: {e}), before the stream's end; the tokens before it are kept: check that "
                "the server still runs (its log: a crash, out of memory), then run again"
            )
            raise HTTPEngineError(trace.error, trace) from None
        state.finish()
        return trace
