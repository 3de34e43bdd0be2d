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
``token_ids`` (llama-server's native ``/completion`` stream), ``logprobs`` (entries per
chunk; llama-server gives each entry's id), ``usage`` (cumulative usage on every chunk,
vLLM's ``continuous_usage_stats``), ``retokenized`` (the streamed text so far through the
lab's tokenizer), ``one_per_chunk``. The server's usage is requested and checked against
the client's count (``usage_mismatch``); llama-server's ``timings`` are kept
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
import itertools
import json
import os
import threading
from dataclasses import dataclass, field

from lablib.engines.base import Engine, EngineInfo, GenerationConfig
from lablib.errors import LabError
from lablib.results.trace import RequestTrace, now

APIS = ("completions", "chat", "native")


class HTTPEngineError(LabError):
    """A request over HTTP failed. ``trace``: what arrived before the failure (an HTTPTrace,
    possibly without tokens); ``status``: the HTTP status when there was one."""

    def __init__(self, message: str, trace=None, status: int | None = None):
        super().__init__(message)
        self.trace, self.status = trace, status


@dataclass(frozen=True)
class ServerProfile:
    """What one kind of server honours, as the http engine streams from it.

    ``ids``: the completions API takes the prompt as token ids. ``fixed``: how to generate
    exactly max_tokens (``ignore_eos``, ``min_tokens``, ``logit_bias``, ``generation_config`` or ``none``).
    ``extra``: fields sent with every request (prompt cache off where there is a switch).
    ``logprobs``: ask for one logprob per token to count tokens per chunk exactly (cheap on
    this server). ``stream_usage``: the server can put usage in a stream. ``chunk_usage``: ask for
    cumulative usage on every chunk (vLLM's ``continuous_usage_stats``): an exact count per chunk.
    ``model_id``: the model id requests name when none is given (None: the first of ``/v1/models``).
    """

    ids: bool
    fixed: str
    extra: dict = field(default_factory=dict)
    logprobs: bool = False
    stream_usage: bool = True
    chunk_usage: bool = False
    model_id: str | None = None


# kind of server -> its profile; lablib.engines.servers.SERVERS gives each server the lab starts its row here
PROFILES = {
    # llama.cpp tools/server: `logprobs` is an alias of n_probs (ids in each entry), cache_prompt defaults true
    "llama-server": ServerProfile(ids=True, fixed="ignore_eos", extra={"cache_prompt": False}, logprobs=True),
    # llama_cpp/server/types.py: prompt is str | list[str]; min_tokens masks EOS; no usage in streams;
    # logprobs would sort the whole vocabulary per token in Python (distorts what it measures)
    "llama-cpp-python": ServerProfile(ids=False, fixed="min_tokens", stream_usage=False),
    # mlx_lm/server.py: text prompts, logit_bias honoured, usage with stream_options.include_usage;
    # "default_model" is the model it was started with (another id may load another)
    "mlx": ServerProfile(ids=False, fixed="logit_bias", model_id="default_model"),
    # transformers/cli/serving: stream_options and logprobs unused; a `generation_config` JSON string replaces
    # the generation config (min_new_tokens holds EOS back); the role chunk comes before prefill
    "transformers": ServerProfile(ids=False, fixed="generation_config"),
    # vLLM: token ids, ignore_eos and min_tokens, cumulative usage per chunk; prefix caching on by default
    "vllm": ServerProfile(ids=True, fixed="ignore_eos", chunk_usage=True),
    # any other OpenAI-compatible server
    "openai": ServerProfile(ids=False, fixed="logit_bias"),
}
KINDS = tuple(PROFILES)


@dataclass
class HTTPTrace(RequestTrace):
    """A request's trace plus what the stream told: per-chunk arrivals and counts, the server's
    usage and timings, and the checks (usage, prompt count, fixed length)."""

    server: str = ""
    api: str = ""
    max_new_tokens: int = 0
    count_method: str = ""
    chunk_arrivals: list[float] = field(default_factory=list)  # perf_counter s, one per content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens counted in each content chunk
    reads: int = 0  # network reads of the body
    events: int = 0  # SSE events parsed
    max_events_per_read: int = 0
    pings: int = 0  # SSE comment lines
    text: str = ""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    usage_cached_tokens: int | None = None
    server_timings: dict | None = None
    fixed_length: str = ""
    error: str | None = None

    # --- checks -----------------------------------------------------------
    @property
    def usage_mismatch(self) -> bool | None:
        """True when the server's completion token count differs from the client's (None: no usage)."""
        u = self.usage_completion_tokens
        return None if u is None else u != self.output_tokens

    @property
    def prompt_mismatch(self) -> bool | None:
        """True when the server counted other prompt tokens than the lab (None: no usage)."""
        u = self.usage_prompt_tokens
        return None if u is None else u != self.prompt_tokens

    @property
    def output_count_ok(self) -> bool:
        """False when a fixed-length request gave another count than asked (client or server count)."""
        if self.finish_reason == "stop" and self.fixed_length == "off":
            return True
        n = self.usage_completion_tokens if self.usage_completion_tokens is not None else self.output_tokens
        return n == self.max_new_tokens and self.output_tokens == self.max_new_tokens

    @property
    def chunk_gaps_s(self) -> list[float]:
        """Gaps between content chunks (ICL), seconds: their own distribution, next to ITL."""
        a = self.chunk_arrivals
        return [y - x for x, y in itertools.pairwise(a)]

    @property
    def server_prompt_s(self) -> float | None:
        t = self.server_timings or {}
        return t["prompt_ms"] / 1e3 if isinstance(t.get("prompt_ms"), (int, float)) else None

    @property
    def http_overhead_s(self) -> float | None:
        """What HTTP and the server's queue add to the first token: client TTFT minus the server's
        own prompt time (seconds; None without server timings or tokens)."""
        sp = self.server_prompt_s
        return None if sp is None or not self.t_tokens else self.ttft_s - sp

    @property
    def server_decode_tps(self) -> float | None:
        t = self.server_timings or {}
        return t.get("predicted_per_second") if isinstance(t.get("predicted_per_second"), (int, float)) else None

    def metrics(self) -> dict:
        out = super().metrics()
        sp = self.server_prompt_s
        out.update(
            server=self.server,
            api=self.api,
            max_new_tokens=self.max_new_tokens,
            count_method=self.count_method,
            chunks=len(self.chunk_arrivals),
            chunk_tokens=list(self.chunk_tokens),
            chunk_gaps_s=self.chunk_gaps_s,
            reads=self.reads,
            events=self.events,
            max_events_per_read=self.max_events_per_read,
            pings=self.pings,
            usage_prompt_tokens=self.usage_prompt_tokens,
            usage_completion_tokens=self.usage_completion_tokens,
            usage_cached_tokens=self.usage_cached_tokens,
            usage_mismatch=self.usage_mismatch,
            prompt_mismatch=self.prompt_mismatch,
            fixed_length=self.fixed_length,
            output_count_ok=self.output_count_ok,
            server_prompt_s=sp,
            server_decode_tps=self.server_decode_tps,
            server_timings=json.dumps(self.server_timings) if self.server_timings else None,
            http_overhead_s=self.http_overhead_s,
            text=self.text,
            error=self.error,
        )
        return out


# --- reading one chunk ---------------------------------------------------------------------
def _num(x) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def parse_chunk(obj: dict, api: str) -> dict:
    """What one streamed JSON object carries: ``text``, ``ids`` (token ids or None),
    ``logprob_ids`` (one entry per token: its id or None; None when no logprobs),
    ``finish_reason``, ``usage`` (dict or None), ``timings`` (dict or None), ``error``."""
    out = {
        "text": "",
        "ids": None,
        "logprob_ids": None,
        "finish_reason": None,
        "usage": obj.get("usage") if isinstance(obj.get("usage"), dict) else None,
        "timings": obj.get("timings") if isinstance(obj.get("timings"), dict) else None,
        "error": obj.get("error"),
    }
    if api == "native":  # llama-server /completion
        out["text"] = obj.get("content") or ""
        toks = obj.get("tokens")
        out["ids"] = [int(t) for t in toks] if isinstance(toks, list) and toks else None
        if obj.get("stop"):
            out["finish_reason"] = {"limit": "length", "eos": "stop", "word": "stop"}.get(
                obj.get("stop_type"), obj.get("stop_type")
            )
            # not `tokens_cached`: that is what the slot holds after the request (prompt + output - 1,
            # server-context.cpp: slot.prompt.n_tokens()); prefix reuse is `timings.cache_n`
            out["usage"] = {
                "completion_tokens": obj.get("tokens_predicted"),
                "prompt_tokens": obj.get("tokens_evaluated"),
            }
        return out
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return out
    c = choices[0]
    out["finish_reason"] = c.get("finish_reason")
    if api == "chat":
        d = c.get("delta") or {}
        parts = [d.get("content"), d.get("reasoning_content"), d.get("reasoning")]
        out["text"] = "".join(p for p in parts if isinstance(p, str))
        if d.get("tool_calls"):
            out["text"] += json.dumps(d["tool_calls"])
    else:
        out["text"] = c.get("text") or ""
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        entries = lp.get("content")
        if isinstance(entries, list):  # chat format, and llama-server's completions
            out["logprob_ids"] = [_num(e.get("id")) if isinstance(e, dict) else None for e in entries]
        elif isinstance(lp.get("tokens"), list):  # legacy completions format
            out["logprob_ids"] = [None] * len(lp["tokens"])
    return out


# --- the engine --------------------------------------------------------------------------------
class HTTPEngine(Engine):
    """An OpenAI-compatible server at ``base_url`` (".../v1"), streamed with aiohttp.

    ``api``: "completions" (prompt as ids where the server takes them), "chat" (the prompt's
    text as one user message, or :meth:`agenerate`'s ``messages``), or "native"
    (llama-server's ``/completion``: token ids in every chunk). ``server``: a kind of
    :data:`KINDS`, or "auto" (asked from the server). ``server_model``: the model id sent
    (default: the first of ``/v1/models``). ``read_timeout_s``: longest silence within a
    response; ``connect_timeout_s``: to open the connection. ``api_key_env``: the name of
    an environment variable holding a key (default LABLIB_API_KEY, if set).
    """

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
        max_connections: int = 256,
        tokenizer=True,
    ):
        super().__init__(model)
        self._import_library("aiohttp")
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
        for what, v in (("read_timeout_s", read_timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not isinstance(v, (int, float)) or v <= 0:
                raise LabError(f"{what}={v!r}: expected a positive number of seconds")
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.api = api
        self.api_key_env = api_key_env
        self.read_timeout_s, self.connect_timeout_s = float(read_timeout_s), float(connect_timeout_s)
        self.max_connections = int(max_connections)
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
        kind = server if server != "auto" else None
        if kind is not None and kind not in KINDS:
            raise LabError(f"server={server!r}: expected one of {', '.join(KINDS)} or 'auto'")
        try:
            self.run(self._probe())  # reachability, kind, version, model id, context
        except BaseException:
            self.close()
            raise
        self.kind = kind or self.server_info.get("kind", "openai")
        self.profile = PROFILES[self.kind]
        self.server_model = server_model or self.profile.model_id or self.server_info.get("model_id")
        self.server_version = server_version or self.server_info.get("version") or "unknown"
        if api == "native" and self.kind != "llama-server":
            raise LabError(
                f"api='native' is llama-server's /completion, but {self.base_url} is a {self.kind} "
                "server; use api='completions' or 'chat'"
            )
        self.n_ctx = int(n_ctx or self.server_info.get("n_ctx") or getattr(model, "max_position_embeddings", 0) or 2048)

    # --- the engine's event loop (one thread, one aiohttp session) -----------------------------
    def submit(self, coro):
        """Schedule ``coro`` on the engine's event loop (started on first use) and return at once: a
        ``concurrent.futures.Future`` of its result (``cancel()`` stops it). A load run goes this way
        (:func:`lablib.measure.load.run_load`), its rows taken off in the calling thread meanwhile."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="lablib-http", daemon=True)
                self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro):
        """Run ``coro`` on the engine's event loop (started on first use) and return its result.

        Works from scripts and from notebooks (whose own loop is already running)."""
        return self.submit(coro).result()

    def _get_session(self):
        import aiohttp

        if self._session is None:
            trace_cfg = aiohttp.TraceConfig()

            async def headers_sent(session, ctx, params):
                box = ctx.trace_request_ctx
                if isinstance(box, dict) and box.get("t_start") is None:
                    box["t_start"] = now()

            trace_cfg.on_request_headers_sent.append(headers_sent)
            # one connection per request (force_close): llama-server closes a connection after a
            # streamed answer, and a pooled connection closed that way failed the next POST
            # ("Can not write request body") for every second request; connecting counts into
            # queue_s (t_start is when the request's headers are sent), ~0.1 ms on loopback
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, force_close=True),
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

    def _timeout(self):
        import aiohttp

        return aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s, sock_read=self.read_timeout_s)

    async def _get_json(self, url):
        import aiohttp

        try:
            async with self._get_session().get(url, headers=self._headers(), timeout=self._timeout()) as r:
                if r.status != 200:
                    return None
                return await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def _probe(self) -> None:
        info = self.server_info
        models = await self._get_json(f"{self.base_url}/models")
        health_only = False
        if models is None and await self._get_json(f"{self.root_url}/health") is not None:
            models, health_only = {}, True  # a healthy server whose model list fails (mlx_lm.server, no hub cache)
        if models is None:
            raise LabError(
                f"no OpenAI-compatible server answers at {self.base_url} (GET /models failed); "
                "expected a running server: start one with `lablib serve --server NAME`, or check "
                "the URL (it ends in /v1)"
            )
        data = models.get("data") if isinstance(models, dict) else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        info["model_id"] = first.get("id")
        owner = str(first.get("owned_by", ""))
        props = await self._get_json(f"{self.root_url}/props")
        if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
            info.update(kind="llama-server", version=str(props.get("build_info", "")))
            n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
            if _num(n_ctx):
                info["n_ctx"] = int(n_ctx)
            return
        if owner == "vllm":
            info["kind"] = "vllm"
            v = await self._get_json(f"{self.root_url}/version")
            info["version"] = (v or {}).get("version")
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

    def close(self) -> None:
        """Close the HTTP session and stop the engine's event loop (the server keeps running)."""
        if self._loop is None:
            return
        if self._session is not None:
            self.run(self._session.close())
            self._session = None
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
        return self._need_tok("detokenize").decode(list(ids), skip_special_tokens=False)

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

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            version=f"{self.kind} {self.server_version}",
            backend=f"{self.kind} at {self.base_url}",
            dtype="server",
            threads=0,
            n_ctx=self.n_ctx,
            flags={
                "api": self.api,
                "server": self.kind,
                "server_version": self.server_version,
                "server_model": self.server_model,
                "base_url": self.base_url,
                "fixed_length": self.profile.fixed,
                "prompt_as": self._prompt_as(),
                "cache_control": self.profile.extra.get("cache_prompt", "none")
                if self.kind == "llama-server"
                else "none",
                "api_key_env": self.api_key_env if os.environ.get(self.api_key_env or "") else None,
            },
        )

    def _prompt_as(self) -> str:
        if self.api == "native" or (self.api == "completions" and self.profile.ids):
            return "token_ids"
        return "messages" if self.api == "chat" else "text"

    # --- requests ------------------------------------------------------------------------------
    def _request(self, ids: list[int], cfg: GenerationConfig, messages=None) -> tuple[str, dict, int]:
        """(url, JSON body, prompt tokens as the lab counts them) for one request."""
        p = self.profile
        if self.api == "native":
            body = {
                "prompt": ids,
                "n_predict": cfg.max_new_tokens,
                "stream": True,
                "return_tokens": True,
                "cache_prompt": False,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "seed": cfg.seed,
            }
            if cfg.greedy:
                body["top_k"] = 1
            if cfg.ignore_eos:
                body["ignore_eos"] = True
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
        return self.run(self.agenerate(ids, cfg, t_submit=t_submit, messages=messages, _checked=True))

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
        error status (429, 500 ...), an error event, a stream cut before its end, or
        ``read_timeout_s`` without a byte. ``box``: a dict that gets the trace under "trace" as soon
        as it exists (a cancelled caller keeps what arrived).
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
                url, json=body, headers=self._headers(), timeout=self._timeout(), trace_request_ctx=box
            ) as resp:
                trace.start(box["t_start"] or t_post)
                if resp.status != 200:
                    text = (await resp.text(errors="replace"))[:300]
                    raise HTTPEngineError(_status_message(resp.status, url, text), trace, resp.status)
                if resp.content_type == "application/json":  # an answer, not a stream: usually an error
                    text = (await resp.text(errors="replace"))[:300]
                    raise HTTPEngineError(
                        f"{url} answered with JSON, not an event stream: {text!r}; expected a streaming "
                        "server (stream: true): read the server's message",
                        trace,
                        resp.status,
                    )
                async for data in resp.content.iter_any():
                    t = now()  # bytes arrived: stamp before parsing
                    trace.reads += 1
                    events = parser.feed(data)
                    trace.max_events_per_read = max(trace.max_events_per_read, len(events))
                    for ev in events:
                        trace.events += 1
                        if state.event(ev, t):
                            break
                    if state.done:
                        break
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
        except asyncio.TimeoutError:
            trace.error = (
                f"no byte from {url} for {self.read_timeout_s:g} s (read_timeout_s) after "
                f"{trace.output_tokens} tokens; the server is stuck or overloaded: raise read_timeout_s, "
                "lower the load, or restart the server"
            )
            raise HTTPEngineError(trace.error, trace) from None
        except aiohttp.ClientConnectorError as e:
            trace.error = (
                f"cannot connect to {url} ({e.os_error or e}); expected a running server: start one "
                "with `lablib serve --server NAME`, or check the URL"
            )
            raise HTTPEngineError(trace.error, trace) from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            trace.error = (
                f"the connection to {url} broke mid-stream after {trace.output_tokens} tokens "
                f"({type(e).__name__}: {e}); the tokens before it are kept in the trace"
            )
            raise HTTPEngineError(trace.error, trace) from None
        state.finish()
        return trace


def _status_message(status: int, url: str, body: str) -> str:
    what = {
        429: "the server refuses more load (429 Too Many Requests): lower the rate or concurrency, or "
        "give the server more slots",
        401: "the server wants an API key: put it in the environment variable named by api_key_env "
        "(LABLIB_API_KEY by default)",
        404: "no such endpoint: check the base URL (it ends in /v1) and the api ('completions' or 'chat')",
    }
    advice = what.get(
        status,
        "the server failed the request: read its log"
        if status >= 500
        else "the server refused the request: read its message",
    )
    return f"HTTP {status} from {url}: {body.strip()!r}; {advice}"


class _StreamState:
    """Turns parsed SSE events of one stream into token events of its trace."""

    def __init__(self, engine: HTTPEngine, trace: HTTPTrace):
        self.engine, self.trace = engine, trace
        self.done = False  # [DONE] seen
        self.finished = False  # a finish_reason or native stop seen
        self.methods: set[str] = set()
        self.counted_usage = 0  # cumulative usage seen on content chunks

    def event(self, ev, t: float) -> bool:
        """Handle one event that arrived at ``t``; True at the stream's end marker."""
        tr = self.trace
        if ev.data.strip() == "[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(ev.data)
        except ValueError:
            if ev.event == "error":
                raise HTTPEngineError(f"the server sent an error event: {ev.data[:300]!r}", tr) from None
            raise HTTPEngineError(
                f"the server sent an event that is not JSON: {ev.data[:200]!r}; expected OpenAI-style JSON chunks", tr
            ) from None
        if not isinstance(obj, dict):
            raise HTTPEngineError(
                f"the server sent a JSON {type(obj).__name__}, expected an object: {ev.data[:200]!r}", tr
            )
        if ev.event == "error" or obj.get("error"):
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise HTTPEngineError(f"the server sent an error mid-stream after {tr.output_tokens} tokens: {msg}", tr)
        c = parse_chunk(obj, self.engine.api)
        if c["timings"]:
            tr.server_timings = c["timings"]
        if c["usage"]:
            u = c["usage"]
            tr.usage_prompt_tokens = _num(u.get("prompt_tokens"))
            tr.usage_completion_tokens = _num(u.get("completion_tokens"))
            det = u.get("prompt_tokens_details")
            if isinstance(det, dict) and _num(det.get("cached_tokens")) is not None:
                tr.usage_cached_tokens = tr.cached_tokens = _num(det["cached_tokens"])
        if c["timings"] and _num(c["timings"].get("cache_n")) is not None and tr.usage_cached_tokens is None:
            tr.usage_cached_tokens = tr.cached_tokens = _num(c["timings"]["cache_n"])
        self._tokens(c, t)
        if c["finish_reason"]:
            tr.finish_reason = c["finish_reason"]
            self.finished = True
        return False

    def _tokens(self, c: dict, t: float) -> None:
        tr = self.trace
        text, ids, lp = c["text"], c["ids"], c["logprob_ids"]
        if not text and not ids and not lp:
            return  # role-only, usage-only, timings-only or empty: not a token
        tr.text += text
        if ids:
            k, method, new_ids = len(ids), "token_ids", ids
        elif lp:
            k, method, new_ids = len(lp), "logprobs", [-1 if i is None else i for i in lp]
        elif (
            c["usage"]
            and _num(c["usage"].get("completion_tokens"))
            and c["usage"]["completion_tokens"] > self.counted_usage
        ):
            k = c["usage"]["completion_tokens"] - self.counted_usage
            method, new_ids = "usage", [-1] * k
        elif self.engine._tok is not None:
            all_ids = self.engine.tokenize(tr.text)
            k = max(1, len(all_ids) - tr.output_tokens)  # a chunk that carries text carries a token
            method, new_ids = "retokenized", (all_ids[tr.output_tokens :] + [-1] * k)[:k]
        else:
            k, method, new_ids = 1, "one_per_chunk", [-1]
        if c["usage"] and _num(c["usage"].get("completion_tokens")):
            self.counted_usage = c["usage"]["completion_tokens"]
        self.methods.add(method)
        tr.chunk_arrivals.append(t)
        tr.chunk_tokens.append(k)
        for i in new_ids:
            tr.token(i, t)

    def finish(self) -> None:
        tr = self.trace
        tr.count_method = "+".join(sorted(self.methods)) if self.methods else "none"
        if tr.finish_reason is None:
            tr.finish_reason = "length" if tr.output_tokens >= tr.max_new_tokens else "stop"
        if not tr.t_tokens:
            tr.error = f"the stream ended without a generated token (finish_reason {tr.finish_reason!r})"
            raise HTTPEngineError(tr.error, tr)
