"""One request, one trace: timestamps and the metrics derived from them.

Definitions follow DESIGN.md, "The clock". All timestamps are
``time.perf_counter()`` seconds taken in the process that drives the engine:

- ``t_submit``: the request entered the lab's queue
- ``t_start``: the engine began work on it (dequeued)
- ``t_tokens[i]``: generated token ``i`` became available to the caller

Metrics (seconds unless the name says otherwise):
``queue_s = t_start - t_submit``; ``ttft_s = t_tokens[0] - t_submit``;
``prefill_s = t_tokens[0] - t_start``; ``prefill_tps = prompt_tokens_evaluated /
prefill_s``; ``itl_s[i] = t_tokens[i] - t_tokens[i-1]``;
``tpot_s = (t_tokens[-1] - t_tokens[0]) / (n - 1)``; ``decode_tps = 1 / tpot_s``;
``e2e_s = t_tokens[-1] - t_submit``. With one output token there is no decode
phase: ``tpot_s`` and ``decode_tps`` are ``None``. Nor is one seen when every
token has one timestamp (a stream over HTTP that came in one network read:
buffered by a proxy or the server, or read late by a busy client): the decode
was spent before the first token arrived, inside ``ttft_s``, and ``tpot_s`` and
``decode_tps`` are ``None`` there too, not 0 (which would pass for an instant
decode and pull a run's TPOT percentiles down).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lablib.errors import TraceError
from lablib.results.schema import METRICS  # the metric names, declared with the row's columns


def now() -> float:
    """The lab's one clock (``time.perf_counter``), in seconds."""
    return time.perf_counter()


@dataclass
class RequestTrace:
    """Timestamps of one request.

    ``prompt_tokens``: tokens in the prompt. ``cached_tokens``: of those, how
    many the engine took from a KV cache instead of computing (0 unless the
    experiment is about prefix caching). ``token_ids[i]`` is the id whose
    arrival ``t_tokens[i]`` records. ``request_index`` and ``client`` label a
    request of a closed loop (:mod:`lablib.measure.closed_loop`); None otherwise.
    """

    prompt_tokens: int
    t_submit: float
    t_start: float | None = None
    t_tokens: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None  # "length" (budget reached) or "stop" (EOS)
    threads: int | None = None  # CPU threads the engine computed this request with
    request_index: int | None = None  # in a closed loop: the request's submission order, 0..R-1
    client: int | None = None  # in a closed loop: the client that sent it, 0..C-1

    def start(self, t: float | None = None) -> None:
        """Mark the moment the engine dequeues the request."""
        self.t_start = now() if t is None else t

    def token(self, token_id: int, t: float | None = None) -> None:
        """Record one generated token id and the moment it reached the caller."""
        self.t_tokens.append(now() if t is None else t)
        self.token_ids.append(int(token_id))

    # --- metrics -------------------------------------------------------
    @property
    def output_tokens(self) -> int:
        return len(self.t_tokens)

    @property
    def prompt_tokens_evaluated(self) -> int:
        """Prompt tokens the engine computed in prefill (prompt minus cached)."""
        return self.prompt_tokens - self.cached_tokens

    def _need_first(self) -> None:
        if not self.t_tokens:
            raise TraceError("trace has no generated token: no TTFT, prefill or e2e to derive")
        if self.t_start is None:
            raise TraceError("trace has no t_start: the engine never marked the start")

    @property
    def queue_s(self) -> float:
        if self.t_start is None:
            raise TraceError("trace has no t_start")
        return self.t_start - self.t_submit

    @property
    def ttft_s(self) -> float:
        self._need_first()
        return self.t_tokens[0] - self.t_submit

    @property
    def prefill_s(self) -> float:
        self._need_first()
        return self.t_tokens[0] - self.t_start

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens_evaluated / self.prefill_s

    @property
    def itl_s(self) -> list[float]:
        ts = self.t_tokens
        return [b - a for a, b in zip(ts, ts[1:])]

    @property
    def decode_s(self) -> float:
        """Time from the first to the last token (0 for one token)."""
        self._need_first()
        return self.t_tokens[-1] - self.t_tokens[0]

    @property
    def tpot_s(self) -> float | None:
        """``decode_s / (n - 1)``; None with one token, or with every token at one instant (no decode seen)."""
        n = self.output_tokens
        return None if n < 2 or self.decode_s == 0 else self.decode_s / (n - 1)

    @property
    def decode_unseen(self) -> bool:
        """Two or more tokens, all at one instant: the decode was not seen (it is inside ``ttft_s``), so the
        request has no ``tpot_s`` (a buffered stream over HTTP, or one read late)."""
        return self.output_tokens >= 2 and self.decode_s == 0

    @property
    def decode_tps(self) -> float | None:
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot

    @property
    def e2e_s(self) -> float:
        self._need_first()
        return self.t_tokens[-1] - self.t_submit

    def metrics(self) -> dict:
        """The metrics of DESIGN.md plus token counts, as one flat dict."""
        out = {name: getattr(self, name) for name in METRICS}
        out.update(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            decode_s=self.decode_s,
            finish_reason=self.finish_reason,
            decode_unseen=self.decode_unseen,
        )
        return out
