"""Request traces: what a day's traffic says, read from a file or made (lablib.measure.replay sends them).

A trace is a list of requests, each with an arrival time, a prompt length, an output length and,
where known, the prompt's KV blocks as ids (two requests whose lists start with the same ``k`` ids
share ``k`` blocks of prefix). Two file formats are read (:func:`read_trace`):

- **mooncake**: the JSONL of Mooncake's traces (kvcache-ai/Mooncake, ``FAST25-release/traces``):
  ``timestamp`` (ms from the trace's start), ``input_length``, ``output_length`` (tokens),
  ``hash_ids`` (one id per 512-token block, :data:`MOONCAKE_BLOCK_TOKENS`). The lab ships the first
  1,000 requests of its conversation trace (``data/traces/``, :data:`DEFAULT_TRACE`);
- **plain**: CSV (a header row) or JSONL of ``arrival_s`` (seconds), ``prompt_tokens``,
  ``output_tokens`` and optionally ``prefix_blocks`` (block ids: a JSON list, or in CSV ids separated by
  spaces) and ``session``, ``turn``; blocks of ``block_tokens`` tokens (default 512, as Mooncake's).

Generators make traces of the same kind: :func:`synthetic` (no shared prefixes; lengths fixed, uniform or
log-normal, :class:`LengthDist`, e.g. :func:`fit_lognormal` of a real trace's lengths) and :func:`sessions`
(multi-turn chats: each turn's prompt is the previous turn's prompt, a placeholder of the previous answer's
length and a new question, sent a think time after the previous turn).

:mod:`lablib.measure.replay` scales a trace to the model and machine and replays it over HTTP.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
from pathlib import Path

from lablib.checks import whole
from lablib.errors import LabError

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's traces
DEFAULT_TRACE = "traces/mooncake_conversation_first1000.jsonl"  # under lablib.config.data_dir()
TRACE_FORMATS = ("mooncake", "plain")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
PLAIN_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")  # + optional prefix_blocks, session, turn
LENGTH_KINDS = ("fixed", "uniform", "lognormal")


# --- traces -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, in the trace's own units.

    ``index``: its position in the trace file (0-based, of all its requests); ``arrival_s``: seconds
    from the trace's start; ``prompt_tokens``, ``output_tokens``: lengths (tokens, at least 1);
    ``hash_ids``: the prompt's blocks of the trace's ``block_tokens`` tokens, in order (empty: none
    known, no prefix shared); ``session``, ``turn``: a chat's id and turn (0-based), where known."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    session: int | None = None
    turn: int | None = None


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests in arrival order (ties in file order), with the tokens per block id (None: no block ids),
    where they came from (``source``: a file path or a generator's description), its ``format``
    (mooncake, plain, synthetic, sessions) and, for a file, its SHA-256 and the slice read
    (``start``: the first request's index, ``count``)."""

    requests: tuple[TraceRequest, ...]
    block_tokens: int | None
    source: str
    format: str
    sha256: str | None = None
    start: int = 0
    params: dict = dataclasses.field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.requests)

    def describe(self) -> dict:
        """What the trace is, for a manifest: source, format, sha256, start, count, block_tokens, params."""
        return {
            "source": self.source,
            "format": self.format,
            "sha256": self.sha256,
            "start": self.start,
            "count": self.count,
            "block_tokens": self.block_tokens,
            **({"params": self.params} if self.params else {}),
        }


def default_trace_path() -> Path:
    """The shipped slice of Mooncake's conversation trace (``data/traces/``, :data:`DEFAULT_TRACE`)."""
    from lablib.config import data_dir

    return data_dir() / DEFAULT_TRACE


def _detect(path: Path, first: str) -> str:
    if path.suffix.lower() == ".csv":
        return "plain"
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        raise LabError(
            f"{path}: the first line is not JSON; expected JSONL (mooncake or plain) or a .csv file"
        ) from None
    if isinstance(rec, dict) and "timestamp" in rec:
        return "mooncake"
    if isinstance(rec, dict) and "arrival_s" in rec:
        return "plain"
    keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
    raise LabError(
        f"{path}: cannot tell the trace format from its first record ({keys}); expected Mooncake's "
        f"({', '.join(MOONCAKE_FIELDS)}) or the plain one ({', '.join(PLAIN_FIELDS)}[, prefix_blocks]): "
        "give fmt='mooncake' or 'plain'"
    )


def _int(value, where: str, name: str, lo: int) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise LabError(f"{where}: {name}={value!r}: expected a whole number, at least {lo}")
    return value


def _seconds(value, where: str, name: str, per_s: float = 1.0) -> float:
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise LabError(f"{where}: {name}={value!r}: expected a time of 0 or more")
    return x / per_s  # per_s: the file's units per second (Mooncake: 1000, ms)


def _blocks(value, where: str, name: str) -> tuple[int, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = value.replace(",", " ").replace(";", " ").split()
    if not isinstance(value, (list, tuple)):
        raise LabError(f"{where}: {name}={value!r}: expected a list of block ids (whole numbers, 0 or more)")
    return tuple(_int(v, where, f"{name} item", 0) for v in value)


def _record(rec, fmt: str, index: int, where: str) -> TraceRequest:
    if not isinstance(rec, dict):
        raise LabError(f"{where}: expected one JSON object a line, got {type(rec).__name__}")
    need = MOONCAKE_FIELDS if fmt == "mooncake" else PLAIN_FIELDS
    missing = [k for k in need if k not in rec or rec[k] in (None, "")]
    if missing:
        raise LabError(
            f"{where}: no {', '.join(missing)}; expected a {fmt} trace's fields {', '.join(need)}"
            + ("" if fmt == "mooncake" else " (prefix_blocks, session, turn optional)")
        )
    if fmt == "mooncake":
        return TraceRequest(
            index,
            _seconds(rec["timestamp"], where, "timestamp", 1000),
            _int(rec["input_length"], where, "input_length", 1),
            _int(rec["output_length"], where, "output_length", 1),
            _blocks(rec["hash_ids"], where, "hash_ids"),
        )
    opt = {k: _int(rec[k], where, k, 0) for k in ("session", "turn") if rec.get(k) not in (None, "")}
    return TraceRequest(
        index,
        _seconds(rec["arrival_s"], where, "arrival_s"),
        _int(rec["prompt_tokens"], where, "prompt_tokens", 1),
        _int(rec["output_tokens"], where, "output_tokens", 1),
        _blocks(rec.get("prefix_blocks"), where, "prefix_blocks"),
        **opt,
    )


def read_trace(
    path=None, fmt: str = "auto", start: int = 0, count: int | None = None, block_tokens: int | None = None
) -> Trace:
    """The requests ``start`` .. ``start + count - 1`` (file order, 0-based; ``count`` None: to the end) of
    the trace file ``path`` (None: :func:`default_trace_path`), in arrival order.

    ``fmt``: ``mooncake``, ``plain`` or ``auto`` (a .csv file is plain; a JSONL file by its first record's
    fields). ``block_tokens``: tokens per block id (Mooncake: 512, fixed; plain: default 512). Raises
    LabError naming the file, line and field for a missing or bad field, and for a slice outside the file."""
    p = Path(path) if path is not None else default_trace_path()
    if p.is_dir():
        raise LabError(f"trace file {p} is a folder; expected a file: a Mooncake JSONL or a plain CSV/JSONL trace")
    if not p.is_file():
        hint = " (the shipped slice lives in the project's data/traces/; set LABLIB_DATA)" if path is None else ""
        raise LabError(f"trace file {p} not found{hint}; expected a Mooncake JSONL or a plain CSV/JSONL trace")
    if fmt not in ("auto", *TRACE_FORMATS):
        raise LabError(f"fmt={fmt!r}: expected auto, {', '.join(TRACE_FORMATS)}")
    start = whole(start, "start", "the first request's index, 0 or more", lo=0)
    if count is not None:
        count = whole(count, "count", "a number of requests, at least 1")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a byte order mark (a CSV saved by Excel) is not part of the first field
    except UnicodeDecodeError as e:
        raise LabError(
            f"trace file {p} is not UTF-8 text ({e.reason} at byte {e.start}); expected a Mooncake JSONL or a "
            "plain CSV/JSONL trace, as text"
        ) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise LabError(f"trace file {p} is empty; expected one request a line")
    if fmt == "auto":
        fmt = _detect(p, lines[0][1])
    if fmt == "mooncake":
        if block_tokens not in (None, MOONCAKE_BLOCK_TOKENS):
            raise LabError(f"block_tokens={block_tokens}: a Mooncake trace's blocks are {MOONCAKE_BLOCK_TOKENS} tokens")
        block_tokens = MOONCAKE_BLOCK_TOKENS
    else:
        block_tokens = whole(
            MOONCAKE_BLOCK_TOKENS if block_tokens is None else block_tokens,
            "block_tokens",
            "tokens per block, at least 1",
        )
    is_csv = fmt == "plain" and p.suffix.lower() == ".csv"
    if is_csv:
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None or not set(PLAIN_FIELDS) <= {f.strip() for f in reader.fieldnames}:
            raise LabError(
                f"{p}: header {reader.fieldnames}; expected a header row with {', '.join(PLAIN_FIELDS)}"
                "[, prefix_blocks, session, turn]"
            )
        records = [(reader.line_num, {k.strip(): v for k, v in row.items() if k is not None}) for row in reader]
        records = [(n, r) for n, r in records if any(v not in (None, "") for v in r.values())]
    else:
        records = lines
    total = len(records)
    if start >= total:
        raise LabError(f"start={start}: the trace {p} has {total} requests (0 .. {total - 1})")
    stop = total if count is None else min(total, start + count)
    out = []
    for i in range(start, stop):
        n, rec = records[i]
        where = f"{p}:{n}"
        if not is_csv:
            try:
                rec = json.loads(rec)
            except json.JSONDecodeError as e:
                raise LabError(f"{where}: not JSON ({e.msg}); expected one JSON object a line") from None
        out.append(_record(rec, fmt, i, where))
    out.sort(key=lambda r: r.arrival_s)  # stable: ties keep the file's order
    return Trace(tuple(out), block_tokens, str(p), fmt, hashlib.sha256(data).hexdigest(), start)


# --- length distributions and generators -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LengthDist:
    """A distribution of lengths (tokens), whole numbers clipped to ``lo`` .. ``hi`` (None: no upper bound).

    ``fixed`` (``a``: the length), ``uniform`` (``a`` .. ``b``, both included), ``lognormal`` (``a``: mean,
    ``b``: standard deviation of the natural log of the length; the median is ``exp(a)``). Make one with
    :func:`fixed`, :func:`uniform`, :func:`lognormal` or :func:`fit_lognormal`."""

    kind: str
    a: float
    b: float = 0.0
    lo: int = 1
    hi: int | None = None

    def __post_init__(self):
        if self.kind not in LENGTH_KINDS:
            raise LabError(f"length distribution {self.kind!r}: expected one of {', '.join(LENGTH_KINDS)}")
        whole(self.lo, "lo", "the shortest length, at least 1")
        if self.hi is not None and whole(self.hi, "hi", "the longest length, at least 1") < self.lo:
            raise LabError(f"hi={self.hi} below lo={self.lo}: expected lo <= hi")
        for name, v in (("a", self.a), ("b", self.b)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise LabError(f"{self.kind} {name}={v!r}: expected a finite number")
        if self.kind in ("fixed", "uniform") and self.a < 1:
            raise LabError(f"{self.kind} length {self.a}: expected at least 1 token")
        if self.kind == "uniform" and self.b < self.a:
            raise LabError(f"uniform {self.a} .. {self.b}: expected the lower bound first")
        if self.kind == "lognormal" and self.b < 0:
            raise LabError(f"lognormal sigma={self.b}: expected 0 or more")

    def sample(self, n: int, seed: int = 0) -> list[int]:
        """``n`` lengths (tokens), seeded: the same seed, the same lengths."""
        import numpy as np

        n = whole(n, "n", "a number of lengths, at least 1")
        rng = np.random.default_rng(whole(seed, "seed", "a whole number, 0 or more", lo=0))
        if self.kind == "fixed":
            x = np.full(n, round(self.a))
        elif self.kind == "uniform":
            x = rng.integers(math.ceil(self.a), math.floor(self.b) + 1, size=n)
        else:
            x = np.rint(rng.lognormal(self.a, self.b, size=n))
        x = np.clip(x, self.lo, self.hi if self.hi is not None else None)
        return [int(v) for v in x]

    def describe(self) -> dict:
        return {"kind": self.kind, "a": self.a, "b": self.b, "lo": self.lo, "hi": self.hi}


def fixed(n: int) -> LengthDist:
    """Every length ``n`` tokens."""
    return LengthDist("fixed", whole(n, "length", "at least 1 token"), lo=1)


def uniform(lo: int, hi: int) -> LengthDist:
    """Lengths drawn uniformly from ``lo`` .. ``hi`` tokens (both included)."""
    lo, hi = whole(lo, "lo", "at least 1 token"), whole(hi, "hi", "at least 1 token")
    return LengthDist("uniform", lo, hi, lo=lo, hi=hi)


def lognormal(mu: float, sigma: float, lo: int = 1, hi: int | None = None) -> LengthDist:
    """Lengths whose natural log is normal (mean ``mu``, standard deviation ``sigma``), clipped to ``lo`` .. ``hi``."""
    return LengthDist("lognormal", float(mu), float(sigma), lo=lo, hi=hi)


def fit_lognormal(values) -> LengthDist:
    """The log-normal of ``values`` (lengths, tokens): ``mu`` and ``sigma`` the mean and (population) standard
    deviation of their natural logs, clipped to their smallest and largest. E.g. of a trace's prompt lengths:
    ``fit_lognormal([r.prompt_tokens for r in trace.requests])``."""
    vals = [whole(v, "length", "a length of at least 1 token") for v in values]
    if not vals:
        raise LabError("no lengths to fit: expected one or more")
    logs = [math.log(v) for v in vals]
    mu = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mu) ** 2 for x in logs) / len(logs))
    return lognormal(mu, sigma, lo=min(vals), hi=max(vals))


def _dist(x, what: str) -> LengthDist:
    if isinstance(x, LengthDist):
        return x
    return fixed(whole(x, what, "a length in tokens (at least 1) or a LengthDist"))


def synthetic(
    n: int,
    prompt_tokens,
    output_tokens,
    rate: float,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
) -> Trace:
    """``n`` requests arriving at ``rate`` requests/s (:func:`lablib.measure.load.arrival_schedule`: constant,
    poisson or gamma with ``burstiness``), lengths from ``prompt_tokens`` and ``output_tokens`` (tokens, or
    :class:`LengthDist`; output lengths drawn with ``seed + 1``), no block ids: no two prompts share a prefix.
    The same seed gives the same trace."""
    from lablib.measure.load import arrival_schedule

    pd_, od = _dist(prompt_tokens, "prompt_tokens"), _dist(output_tokens, "output_tokens")
    times = arrival_schedule(n, rate, arrival, burstiness, seed)
    p, o = pd_.sample(n, seed), od.sample(n, seed + 1)
    reqs = tuple(TraceRequest(i, times[i], p[i], o[i]) for i in range(n))
    params = {"rate": rate, "arrival": arrival, "burstiness": burstiness, "seed": seed}
    params.update(prompt_tokens=pd_.describe(), output_tokens=od.describe())
    return Trace(reqs, None, "synthetic", "synthetic", params=params)


def sessions(
    n_sessions: int,
    turns: int,
    question_tokens=32,
    answer_tokens=16,
    think_time_s: float = 5.0,
    rate: float = 0.5,
    arrival: str = "poisson",
    system_tokens: int = 0,
    block_tokens: int = 16,
    seed: int = 0,
) -> Trace:
    """Multi-turn chats: ``n_sessions`` sessions starting at ``rate`` sessions/s (``arrival``, seeded), each of
    ``turns`` turns sent ``think_time_s`` seconds apart (counted from the previous turn's send: an open loop
    does not wait for the answer).

    Turn ``t``'s prompt is turn ``t - 1``'s prompt, a placeholder of turn ``t - 1``'s answer length (text, not
    the model's answer) and a new question: ``system_tokens + sum(q[u] + a[u] for u < t) + q[t]`` tokens;
    its output is ``a[t]`` tokens (``question_tokens``, ``answer_tokens``: tokens or :class:`LengthDist`,
    drawn per session). Blocks of ``block_tokens``: the first ``system_tokens // block_tokens`` (a system
    prompt's whole blocks) are shared by every session, the rest are the session's own, so each turn shares
    its previous turns' blocks. Requests in arrival order, with ``session`` and ``turn``."""
    from lablib.measure.load import arrival_schedule

    n_sessions = whole(n_sessions, "n_sessions", "a number of sessions, at least 1")
    turns = whole(turns, "turns", "turns per session, at least 1")
    system_tokens = whole(system_tokens, "system_tokens", "tokens of a shared system prompt, 0 or more", lo=0)
    block_tokens = whole(block_tokens, "block_tokens", "tokens per block, at least 1")
    if isinstance(think_time_s, bool) or not isinstance(think_time_s, (int, float)) or not 0 <= think_time_s < math.inf:
        raise LabError(f"think_time_s={think_time_s!r}: expected seconds, 0 or more")
    qd, ad = _dist(question_tokens, "question_tokens"), _dist(answer_tokens, "answer_tokens")
    starts = arrival_schedule(n_sessions, rate, arrival, seed=seed)
    shared = system_tokens // block_tokens
    next_id = shared
    reqs = []
    for s in range(n_sessions):
        q, a = qd.sample(turns, seed + 2 * s + 1), ad.sample(turns, seed + 2 * s + 2)
        total = system_tokens + sum(q) + sum(a)  # the whole chat, the last answer included
        ids = list(range(shared)) + list(range(next_id, next_id + math.ceil(total / block_tokens) - shared))
        next_id += len(ids) - shared
        length = system_tokens
        for t in range(turns):
            length += q[t]
            blocks = tuple(ids[: math.ceil(length / block_tokens)])
            reqs.append(TraceRequest(0, starts[s] + t * think_time_s, length, a[t], blocks, s, t))
            length += a[t]
    reqs.sort(key=lambda r: r.arrival_s)
    reqs = tuple(dataclasses.replace(r, index=i) for i, r in enumerate(reqs))
    params = dict(
        n_sessions=n_sessions,
        turns=turns,
        question_tokens=qd.describe(),
        answer_tokens=ad.describe(),
        think_time_s=think_time_s,
        rate=rate,
        arrival=arrival,
        system_tokens=system_tokens,
        seed=seed,
    )
    return Trace(reqs, block_tokens, "sessions", "sessions", params=params)
