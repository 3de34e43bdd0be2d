"""The wire protocol of OpenAI-compatible servers: the APIs, each server kind's stream profile, one
streamed chunk read into token ids or text, HTTP errors as one message, and the count of tokens
across a stream (token ids > logprobs > usage per chunk > the final usage spread over the chunks by the
re-tokenized text > re-tokenized text > one per chunk).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lablib.engines.base import Engine
from lablib.engines.http.trace import HTTPTrace
from lablib.errors import LabError, excerpt, is_html, json_kind

APIS = ("completions", "chat", "native")


class HTTPEngineError(LabError):
    """A request over HTTP failed. ``trace``: what arrived before the failure (an HTTPTrace,
    possibly without tokens); ``status``: the HTTP status when there was one; ``retry_after_s``:
    the server's Retry-After in seconds when it sent one (the lab never retries by itself)."""

    def __init__(self, message: str, trace=None, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.trace, self.status, self.retry_after_s = trace, status, retry_after_s
        self.server_said = None  # the server's own words, where it said any (an error body's message)


def server_words(body: str) -> str:
    """What an error body says: its JSON ``error.message`` (or ``error``, ``message``, ``detail``) where it is
    OpenAI-style JSON, else the body itself."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return err if isinstance(err, str) else body


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
    ``keep_alive``: the server keeps a connection open after a streamed answer and takes the next request
    on it (HTTP/1.1 keep-alive), so the engine pools connections instead of opening one per request.
    ``constraint``: how a request carries a Constraint (structured output, lab 10): "gbnf" (llama-server's
    ``json_schema`` field, a regex as a GBNF ``grammar``: it has no regex field), "structured_outputs" (vLLM's
    ``structured_outputs: {json | regex}``); None: the lab sends none (the engine refuses a constrained request).
    """

    ids: bool
    fixed: str
    extra: dict = field(default_factory=dict)
    logprobs: bool = False
    stream_usage: bool = True
    chunk_usage: bool = False
    model_id: str | None = None
    keep_alive: bool = False
    constraint: str | None = None


# kind of server -> its profile; lablib.engines.servers.SERVERS gives each server the lab starts its row here
PROFILES = {
    # llama.cpp tools/server: cache_prompt defaults true; `verbose` adds each partial chunk's native form
    # (`__verbose`, server-task.cpp), whose `tokens` is that chunk's id: the count and the ids per chunk at no
    # cost to the server, where `logprobs` (an alias of n_probs: a softmax over the vocabulary per token) made its
    # TPOT 1.04x a plain request's (1.00-1.11x over 3 runs; `verbose` 0.91-0.98x: benchmarks/request_options.py,
    # 8-10 interleaved rounds, 1 slot, 2-core EPYC)
    "llama-server": ServerProfile(
        ids=True, fixed="ignore_eos", extra={"cache_prompt": False, "verbose": True}, constraint="gbnf"
    ),
    # llama_cpp/server/types.py: prompt is str | list[str]; min_tokens masks EOS; no usage in streams;
    # logprobs would sort the whole vocabulary per token in Python (distorts what it measures)
    "llama-cpp-python": ServerProfile(ids=False, fixed="min_tokens", stream_usage=False),
    # mlx_lm/server.py: text prompts, logit_bias honoured, usage with stream_options.include_usage;
    # "default_model" is the model it was started with (another id may load another)
    "mlx": ServerProfile(ids=False, fixed="logit_bias", model_id="default_model"),
    # transformers/cli/serving: stream_options and logprobs unused; a `generation_config` JSON string replaces
    # the generation config (min_new_tokens holds EOS back); the role chunk comes before prefill
    "transformers": ServerProfile(ids=False, fixed="generation_config"),
    # vLLM: token ids in (prompt) and out (return_token_ids: each chunk's ids), ignore_eos and min_tokens,
    # cumulative usage per chunk; prefix caching on by default (the lab starts it off: engines.servers);
    # uvicorn keeps connections alive (vllm bench pools them: TCPConnector(keepalive_timeout=60))
    "vllm": ServerProfile(
        ids=True,
        fixed="ignore_eos",
        extra={"return_token_ids": True},
        chunk_usage=True,
        keep_alive=True,
        constraint="structured_outputs",
    ),
    # any other OpenAI-compatible server
    "openai": ServerProfile(ids=False, fixed="logit_bias"),
}
KINDS = tuple(PROFILES)


# the setting that sizes each kind of server's context (its own flag), for a server the lab did not start
CONTEXT_SETTINGS = {
    "llama-server": "--ctx-size (-c), shared by its --parallel slots",
    "vllm": "--max-model-len",
    "llama-cpp-python": "--n_ctx",
}


def larger_context(kind: str, base_url: str, n_ctx: int, stated: int | None, card: dict | None, trained) -> str:
    """How to give the server at ``base_url`` a larger context, for the http engine's context overflow (the
    engine holds to ``n_ctx``). A server the lab started (``card``: its name and settings, as
    :func:`lablib.engines.http.cards.card_for` gives them) is restarted with ``--n-ctx`` / ``start_server(n_ctx=)``;
    another takes its own setting (:data:`CONTEXT_SETTINGS`), and the advice says the context the server
    states (``stated``; None: it states none); the http engine's own ``n_ctx=`` only where the server states
    more than the engine was loaded with. ``trained``: the model's trained context, or None."""
    of_model = f"; the model was trained to {trained}" if trained else ""
    if card:
        name = card.get("name") or kind
        per_slot = (card.get("settings") or {}).get("n_ctx")
        was = f" (the lab started it with n_ctx={per_slot} tokens per slot)" if per_slot else ""
        return (
            f"restart the {name} at {base_url} with a larger context{was}: `lablib serve --server {name} --n-ctx N` "
            f"or start_server({name!r}, model, n_ctx=N){of_model}"
        )
    if stated and stated > n_ctx:
        return (
            f"load the http engine with n_ctx={stated}: the {kind} server at {base_url} states a context of {stated} "
            f"tokens, more than the n_ctx={n_ctx} the engine was loaded with"
        )
    setting = CONTEXT_SETTINGS.get(kind, "its context length, or maximum model length")
    if stated:
        return (
            f"restart the server with a larger context, with its own setting ({setting}): the {kind} server at "
            f"{base_url} states a context of {stated} tokens{of_model}"
        )
    return (
        f"restart the server with a larger context, with its own setting ({setting}): the {kind} server at "
        f"{base_url} states none, so the lab holds to {n_ctx} tokens; if the server holds more, load the http "
        f"engine with n_ctx= its context{of_model}"
    )


# --- reading one chunk ---------------------------------------------------------------------
def _num(x) -> int | None:
    if type(x) is int:  # the usual case, first
        return x
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


_scan = json.JSONDecoder().scan_once  # the C scanner json.loads runs, without its wrappers
try:  # the serve extra's orjson: a chunk of vLLM's stream in 1.2 us, against 2.4 for _scan and 3.8 for json.loads
    from orjson import JSONDecodeError as _FastError, loads as _fast
except ImportError:  # the standard library's scanner alone
    _fast = None


def loads(text: str):
    """``json.loads(text)``, the same result and the same errors, faster on the hot path: one streamed
    chunk per token (18 % of the stamping loop's time at 1,024 streams with ``_scan``, py-spy).

    orjson where installed; what it refuses (NaN, Infinity, a lone surrogate, an error) goes to
    ``json.loads``, which reads it or raises its own error. Two differences, neither near a streamed chunk:
    an integer past 64 bits orjson reads as a float, where json.loads keeps it whole; and arrays or objects
    nested about 1,000 deep (Python's recursion limit) up to 1,024, which orjson reads and json.loads refuses.

    Without orjson, the C scanner reads a document that starts at the first character and fills the text;
    anything else (whitespace around it, trailing data, an error) goes to ``json.loads``."""
    if _fast is not None:
        try:
            return _fast(text)
        except _FastError:
            return json.loads(text)
    try:
        obj, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return obj if end == len(text) else json.loads(text)


# what one chunk carries, in the order _read_chunk returns it
CHUNK_FIELDS = ("text", "reasoning", "ids", "logprob_ids", "finish_reason", "usage", "timings", "error")


def parse_chunk(obj: dict, api: str) -> dict:
    """What one streamed JSON object carries: ``text``, ``ids`` (token ids or None),
    ``logprob_ids`` (one entry per token: its id or None; None when no logprobs),
    ``finish_reason``, ``usage`` (dict or None), ``timings`` (dict or None), ``error``, and
    ``reasoning``: the part of ``text`` that is a chat model's reasoning (``reasoning_content`` or
    ``reasoning``), not its answer."""
    return dict(zip(CHUNK_FIELDS, _read_chunk(obj, api)))


def _read_chunk(obj: dict, api: str) -> tuple:
    """:func:`parse_chunk` as a tuple in :data:`CHUNK_FIELDS` order: the stream's hot path (one per token)
    builds no dict of its own."""
    usage, timings = obj.get("usage"), obj.get("timings")
    if usage is not None and not isinstance(usage, dict):
        usage = None
    if timings is not None and not isinstance(timings, dict):
        timings = None
    error = obj.get("error")
    if api == "native":  # llama-server /completion
        text = obj.get("content") or ""
        toks = obj.get("tokens")
        ids = [int(t) for t in toks] if isinstance(toks, list) and toks else None
        finish = None
        if obj.get("stop"):
            finish = {"limit": "length", "eos": "stop", "word": "stop"}.get(obj.get("stop_type"), obj.get("stop_type"))
            # not `tokens_cached`: that is what the slot holds after the request (prompt + output - 1,
            # server-context.cpp: slot.prompt.n_tokens()); prefix reuse is `timings.cache_n`
            usage = {"completion_tokens": obj.get("tokens_predicted"), "prompt_tokens": obj.get("tokens_evaluated")}
        return text, "", ids, None, finish, usage, timings, error
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", "", None, None, None, usage, timings, error
    c = choices[0]
    finish = c.get("finish_reason")
    reasoning = ""
    if api == "chat":
        d = c.get("delta")
        d = d if isinstance(d, dict) else {}
        thought = [d.get("reasoning_content"), d.get("reasoning")]
        reasoning = "".join(p for p in thought if isinstance(p, str))
        answer = d.get("content") if isinstance(d.get("content"), str) else ""
        text = reasoning + answer
        if d.get("tool_calls"):
            text += json.dumps(d["tool_calls"])
    else:
        text = c.get("text")
        if not isinstance(text, str):
            text = ""
    ids = None
    tids = c.get("token_ids")  # vLLM with return_token_ids: this chunk's generated ids
    if tids is None:  # llama-server with `verbose`: a partial chunk's own ids in its native form
        v = obj.get("__verbose")
        if isinstance(v, dict) and v.get("stop") is False:
            tids = v.get("tokens")
    if isinstance(tids, list) and tids:
        if len(tids) == 1 and type(tids[0]) is int:  # the usual chunk: one token, already an int
            ids = tids
        elif all(_num(t) is not None for t in tids):
            ids = [int(t) for t in tids]
    lp_ids = None
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        entries = lp.get("content")
        if isinstance(entries, list):  # chat format, and llama-server's completions
            lp_ids = [_num(e.get("id")) if isinstance(e, dict) else None for e in entries]
        elif isinstance(lp.get("tokens"), list):  # legacy completions format
            lp_ids = [None] * len(lp["tokens"])
    return text, reasoning, ids, lp_ids, finish, usage, timings, error


def retry_after_s(value) -> float | None:
    """A Retry-After header in seconds: delay-seconds, or an HTTP date (seconds from now, at least 0);
    None when absent or unreadable."""
    if not value:
        return None
    value = str(value).strip()
    if value.isascii() and value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    import datetime

    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def _status_message(
    status: int,
    url: str,
    body: str,
    kind: str = "",
    model: str | None = None,
    retry_after: float | None = None,
    content_type: str = "",
) -> str:
    """One message for an HTTP error status: the server (its kind and the URL), the status, the
    server's own words (an HTML page, a proxy's or a web server's: its content type and a short line of its
    text, never the page) and what to do; the Retry-After value when the server gave one."""
    wait = (
        f"the server asks to retry after {retry_after:g} s (Retry-After); the lab does not retry by itself"
        if retry_after is not None
        else "the server gave no Retry-After; the lab does not retry by itself"
    )
    what = {
        400: "the server refused the request as malformed: read its message (often the prompt plus "
        "max_tokens exceeds its context, or a field this kind of server does not take: check server=)",
        401: "the server wants an API key: put it in the environment variable named by api_key_env "
        "(LABLIB_API_KEY by default)",
        403: "the server refuses this API key: check the key in the environment variable named by api_key_env",
        404: f"no such model or endpoint: the request named model {model!r}; pass server_model= one of the ids "
        "GET /v1/models lists, and check the base URL (it ends in /v1) and the api ('completions' or 'chat')",
        429: f"the server refuses more load (429 Too Many Requests): lower the rate or concurrency, or give the "
        f"server more slots; {wait}",
        503: f"the server is unavailable (503: overloaded, or still loading its model): wait for it or lower the "
        f"load; {wait}",
    }
    advice = what.get(
        status,
        "the server failed the request: read its log"
        if status >= 500
        else "the server refused the request: read its message",
    )
    who = f"the {kind} server at {url}" if kind else url
    if is_html(content_type, body):
        said = f"an HTML page ({content_type or 'text/html'}: {excerpt(body, content_type, 80)!r}), not the API's JSON"
    else:
        said = repr(body.strip()[:300])
    return f"HTTP {status} from {who}: {said}; {advice}"


class _StreamState:
    """Turns parsed SSE events of one stream into token events of its trace."""

    def __init__(self, engine: Engine, trace: HTTPTrace):  # engine: the HTTPEngine streaming it
        self.engine, self.trace = engine, trace
        self.done = False  # [DONE] seen
        self.finished = False  # a finish_reason or native stop seen
        self.methods: set[str] = set()
        self.counted_usage = 0  # cumulative usage seen on content chunks
        self.retokenized: int | None = None  # the lab's tokenizer's count of the text so far
        self.ignored_types: set[str] = set()

    def event(self, ev, t: float) -> bool:
        """Handle one event that arrived at ``t``; True at the stream's end marker."""
        tr = self.trace
        data = ev.data
        if data[:1] != "{" and data.strip() == "[DONE]":  # a JSON chunk starts with "{": no strip per token
            self.done = True
            return True
        if ev.event not in ("message", "error"):  # not an OpenAI chunk (a server's own event): kept out, counted
            tr.ignored_events += 1
            self.ignored_types.add(ev.event[:40])
            return False
        try:
            obj = loads(data)
        except ValueError:
            if ev.event == "error":
                raise HTTPEngineError(f"the server sent an error event: {ev.data[:300]!r}", tr) from None
            raise HTTPEngineError(
                f"the server sent an event that is not JSON: {ev.data[:200]!r}; expected OpenAI-style JSON chunks", tr
            ) from None
        if not isinstance(obj, dict):
            raise HTTPEngineError(f"the server sent a JSON {json_kind(obj)}, expected an object: {ev.data[:200]!r}", tr)
        if ev.event == "error" or obj.get("error"):
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            err = HTTPEngineError(f"the server sent an error mid-stream after {tr.output_tokens} tokens: {msg}", tr)
            err.server_error = True  # the server's own error event (vLLM's grammar errors arrive so)
            err.server_said = str(msg)
            raise err
        text, reasoning, ids, lp, finish, usage, timings, _ = _read_chunk(obj, self.engine.api)
        if timings:
            tr.server_timings = timings
        if usage:
            tr.usage_prompt_tokens = _num(usage.get("prompt_tokens"))
            tr.usage_completion_tokens = _num(usage.get("completion_tokens"))
            det = usage.get("prompt_tokens_details")
            if isinstance(det, dict) and _num(det.get("cached_tokens")) is not None:
                tr.usage_cached_tokens = tr.cached_tokens = _num(det["cached_tokens"])
        if timings and _num(timings.get("cache_n")) is not None and tr.usage_cached_tokens is None:
            tr.usage_cached_tokens = tr.cached_tokens = _num(timings["cache_n"])
        if text or ids or lp:  # else role-only, usage-only, timings-only or empty: not a token
            self._tokens(text, reasoning, ids, lp, usage, t)
        if finish:
            tr.finish_reason = finish
            self.finished = True
        return False

    def _tokens(self, text: str, reasoning: str, ids, lp, usage, t: float) -> None:
        tr = self.trace
        tr.text += text
        # the first answer token (a chat model's reasoning comes before it): in a chat, the first chunk with answer
        # text (or a tool call). Not ids alone: vLLM sends ids on every chunk (return_token_ids), a reasoning chunk's
        # and an empty delta's too (the <think> and </think> its reasoning parser takes out of the text)
        if tr.t_first_answer is None and (self.engine.api != "chat" or len(text) > len(reasoning)):
            tr.t_first_answer = t
        if ids:
            k, method, new_ids = len(ids), "token_ids", ids
        elif lp:
            k, method, new_ids = len(lp), "logprobs", [-1 if i is None else i for i in lp]
        elif usage and _num(usage.get("completion_tokens")) and usage["completion_tokens"] > self.counted_usage:
            k = usage["completion_tokens"] - self.counted_usage
            method, new_ids = "usage", [-1] * k
        elif self.engine._tok is not None:
            all_ids = self.engine.tokenize(tr.text)
            self.retokenized = len(all_ids)
            k = max(1, len(all_ids) - tr.output_tokens)  # a chunk that carries text carries a token
            method, new_ids = "retokenized", (all_ids[tr.output_tokens :] + [-1] * k)[:k]
        else:
            k, method, new_ids = 1, "one_per_chunk", [-1]
        if usage and tr.usage_completion_tokens:  # event() read it from this chunk's usage
            self.counted_usage = usage["completion_tokens"]
        self.methods.add(method)
        tr.chunk_arrivals.append(t)
        tr.chunk_tokens.append(k)
        if k == 1:  # RequestTrace.token's two appends, inline (every id here is an int already)
            tr.t_tokens.append(t)
            tr.token_ids.append(new_ids[0])
        else:
            tr.t_tokens.extend([t] * k)
            tr.token_ids.extend(new_ids)

    def finish(self) -> None:
        tr = self.trace
        tr.count_method = "+".join(sorted(self.methods)) if self.methods else "none"
        if self.retokenized is not None:
            tr.retokenized_tokens = self.retokenized
        u = tr.usage_completion_tokens
        if u and tr.t_tokens and self.methods and self.methods <= {"retokenized", "one_per_chunk"}:
            self._spread(u)  # the server counted what it generated: its count, the lab's shape
        if tr.finish_reason is None:
            tr.finish_reason = "length" if tr.output_tokens >= tr.max_new_tokens else "stop"
        if not tr.t_tokens:
            tr.error = f"the stream ended without a generated token (finish_reason {tr.finish_reason!r})"
            if tr.ignored_events:
                tr.error += (
                    f"; {tr.ignored_events} events of other types ({', '.join(sorted(self.ignored_types))}) were "
                    "ignored: an OpenAI-compatible stream sends its chunks as plain `data:` events"
                )
            raise HTTPEngineError(tr.error, tr)

    def _spread(self, total: int) -> None:
        """Make the stream's count the server's ``total`` (its final usage), spread over the content chunks
        in proportion to the lab's own per-chunk estimate (re-tokenized text, or one per chunk): the first
        chunk keeps at least one token (TTFT), every token keeps its chunk's arrival time."""
        tr = self.trace
        est, arrivals = list(tr.chunk_tokens), list(tr.chunk_arrivals)
        n_est = sum(est)
        counts, done, cum = [], 0, 0
        for i, k in enumerate(est):
            cum += k
            upto = total if i == len(est) - 1 else min(total, max(1, round(cum * total / n_est)))
            upto = max(upto, done)
            counts.append(upto - done)
            done = upto
        same = counts == est
        ids = list(tr.token_ids) if same else [-1] * total  # the lab's ids only where its count is the server's
        tr.t_tokens = [t for t, k in zip(arrivals, counts) for _ in range(k)]
        tr.token_ids = ids
        tr.chunk_tokens = counts
        tr.count_method = "final_usage"
