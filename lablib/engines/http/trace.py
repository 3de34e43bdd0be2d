"""HTTPTrace: one request over HTTP, timed with the lab's clock, with the stream's own facts (chunks,
reads, usage, the server's timings) next to the sweep's metrics.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from lablib.results.trace import RequestTrace


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
    t_first_answer: float | None = None  # perf_counter s: the first answer token (after a chat model's reasoning)
    retokenized_tokens: int | None = None  # the lab's tokenizer's count of the streamed text (when it counted)
    ignored_events: int = 0  # SSE events of a type other than message/error (not OpenAI chunks)

    # --- checks -----------------------------------------------------------
    @property
    def usage_mismatch(self) -> bool | None:
        """True when the server's completion token count differs from the client's own (None: no usage).
        With ``count_method`` "final_usage" the row's count is the server's, and the client's own is the
        lab's tokenizer's (``retokenized_tokens``): a server running another model differs."""
        u = self.usage_completion_tokens
        if u is None:
            return None
        own = self.retokenized_tokens if self.count_method == "final_usage" else self.output_tokens
        return u != own

    @property
    def ttft_answer_s(self) -> float | None:
        """Time to the first answer token: after a chat model's reasoning (``ttft_s`` counts the first
        token of either; they are equal without reasoning). None without an answer token."""
        return None if self.t_first_answer is None else self.t_first_answer - self.t_submit

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
    def first_arrival_tokens(self) -> int:
        """Tokens that arrived with the first one (in its network read; 0 without tokens): 1 for a stream read token
        by token. More: the ones after the first were decoded before it arrived, so TTFT holds their decode and
        TPOT, over a shorter span, comes out low (a proxy that buffers in pieces; a client that read late); all of
        them: :attr:`decode_unseen`."""
        ts = self.t_tokens
        return sum(t == ts[0] for t in ts) if ts else 0

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
            retokenized_tokens=self.retokenized_tokens,
            ttft_answer_s=self.ttft_answer_s,
            ignored_events=self.ignored_events,
            chunks=len(self.chunk_arrivals),
            chunk_tokens=list(self.chunk_tokens),
            chunk_gaps_s=self.chunk_gaps_s,
            reads=self.reads,
            first_arrival_tokens=self.first_arrival_tokens,
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
