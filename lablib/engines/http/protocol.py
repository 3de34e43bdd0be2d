"""The wire protocol of OpenAI-compatible servers: the APIs, each server kind's stream profile, one
streamed chunk read into token ids or text, HTTP errors as one message, and the count of tokens
across a stream (token ids > logprobs > usage > re-tokenized text > one per chunk).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lablib.engines.base import Engine
from lablib.engines.http.trace import HTTPTrace
from lablib.errors import LabError

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
    # vLLM: token ids in (prompt) and out (return_token_ids: each chunk's ids), ignore_eos and min_tokens,
    # cumulative usage per chunk; prefix caching on by default (the lab starts it off: engines.servers)
    "vllm": ServerProfile(ids=True, fixed="ignore_eos", extra={"return_token_ids": True}, chunk_usage=True),
    # any other OpenAI-compatible server
    "openai": ServerProfile(ids=False, fixed="logit_bias"),
}
KINDS = tuple(PROFILES)


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
    tids = c.get("token_ids")  # vLLM with return_token_ids: this chunk's generated ids
    if isinstance(tids, list) and tids and all(_num(t) is not None for t in tids):
        out["ids"] = [int(t) for t in tids]
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        entries = lp.get("content")
        if isinstance(entries, list):  # chat format, and llama-server's completions
            out["logprob_ids"] = [_num(e.get("id")) if isinstance(e, dict) else None for e in entries]
        elif isinstance(lp.get("tokens"), list):  # legacy completions format
            out["logprob_ids"] = [None] * len(lp["tokens"])
    return out


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

    def __init__(self, engine: Engine, trace: HTTPTrace):  # engine: the HTTPEngine streaming it
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
