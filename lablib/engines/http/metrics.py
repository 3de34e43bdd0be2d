"""A server's own view of a load run: its Prometheus ``/metrics`` (vLLM; llama-server with ``--metrics``)
and llama-server's ``/slots``, read with ``prometheus_client``'s parser and sampled on the lab's clock.

- :func:`scrape`: one GET of ``/metrics``, one dict per sample (``name`` as the parser gives it: a
  counter's sample keeps ``_total``, its family name does not), ``labels``, ``value``;
- :func:`server_view`: the common names (:data:`VIEW`) from vLLM's or llama-server's names
  (:data:`SOURCES`); :func:`server_settings`: what the server says of itself (``*_info`` samples);
- :func:`slots`, :func:`slots_view`: llama-server's slots; they fill ``kv_usage`` where ``/metrics``
  has none (llama-server has no KV gauge): the tokens held by the slots that are processing over
  all slots' ``n_ctx`` (an idle slot's kept prompt counts as free, as vLLM counts its cached free blocks);
- :class:`MetricsSampler`: a thread that samples during a run; tidy rows, counter deltas, gauge maxima.

Common names: ``running`` (requests being prefilled or decoded), ``waiting`` (queued), ``waiting_by_reason``
(vLLM: {reason: requests}), ``kv_usage`` (fraction 0..1; vLLM's ``kv_cache_usage_perc`` is a fraction,
"1 means 100 percent"), and counters ``prefix_cache_queries``, ``prefix_cache_hits`` (tokens),
``preemptions``, ``prompt_tokens`` (every prompt token, computed or from the cache, as vLLM counts;
llama-server's ``prompt_tokens_total`` excludes cached ones, so its ``prompt_tokens_cached_total`` is added),
``generation_tokens``.
"""

from __future__ import annotations

import json
import statistics
import threading
import urllib.error
import urllib.request

from lablib.errors import LabError, excerpt, first_line
from lablib.results.trace import now

VIEW = (
    "running",
    "waiting",
    "waiting_by_reason",
    "kv_usage",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
)
GAUGES = ("running", "waiting", "waiting_by_reason", "kv_usage")
COUNTERS = tuple(k for k in VIEW if k not in GAUGES)
# common name -> where it is read, first found wins: sample names whose values are added (each over its label
# sets: summed, kv_usage averaged)
SOURCES: dict[str, tuple[tuple[str, ...], ...]] = {
    "running": (("vllm:num_requests_running",), ("llamacpp:requests_processing",)),
    "waiting": (("vllm:num_requests_waiting",), ("llamacpp:requests_deferred",)),
    "waiting_by_reason": (("vllm:num_requests_waiting_by_reason",),),  # by its label reason=
    "kv_usage": (
        ("vllm:kv_cache_usage_perc",),
        ("vllm:gpu_cache_usage_perc",),  # vLLM before 0.10
        ("llamacpp:kv_cache_usage_ratio",),
    ),
    "prefix_cache_queries": (
        ("vllm:prefix_cache_queries_total",),
        ("vllm:gpu_prefix_cache_queries_total",),  # vLLM before 0.10
        ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
    ),
    "prefix_cache_hits": (
        ("vllm:prefix_cache_hits_total",),
        ("vllm:gpu_prefix_cache_hits_total",),
        ("llamacpp:prompt_tokens_cached_total",),
    ),
    "preemptions": (("vllm:num_preemptions_total",),),
    "prompt_tokens": (
        ("vllm:prompt_tokens_total",),
        ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
    ),
    "generation_tokens": (("vllm:generation_tokens_total",), ("llamacpp:tokens_predicted_total",)),
}
_WANTED = {n for sources in SOURCES.values() for names in sources for n in names}


def _get(url: str, timeout_s: float) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, no proxy (loopback servers). LabError when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise LabError(
            f"GET {url}: no answer ({first_line(getattr(e, 'reason', e))}); expected a running server there: "
            "check the URL (the server's root, without /v1) and that the server is up"
        ) from None


def _wanted(name: str) -> bool:
    return name.endswith("_info") or name in _WANTED or name + "_total" in _WANTED


def parse(text: str, only_view: bool = False) -> list[dict]:
    """Samples of Prometheus text (prometheus_client's parser): ``{"name", "labels", "value"}`` each.
    ``only_view``: only the lines :data:`SOURCES` and ``*_info`` name (faster on vLLM's long text).
    Raises ValueError when ``text`` is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    if only_view:
        keep = []
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _wanted(parts[2]):
                    keep.append(line)
            elif _wanted(line.split("{", 1)[0].split(" ", 1)[0]):
                keep.append(line)
        text = "\n".join(keep) + "\n"
    return [
        {"name": s.name, "labels": dict(s.labels), "value": float(s.value)}
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def scrape(root_url: str, timeout_s: float = 2.0, only_view: bool = False) -> list[dict]:
    """GET ``<root_url>/metrics`` (the server's root, e.g. http://127.0.0.1:8080, not .../v1): its samples
    (:func:`parse`). Raises LabError when nothing answers, the endpoint is missing (llama-server started
    without ``--metrics``: HTTP 404/501) or the answer is not Prometheus text."""
    url = f"{root_url.rstrip('/').removesuffix('/v1')}/metrics"
    status, ctype, body = _get(url, timeout_s)
    if status != 200:
        raise LabError(
            f"GET {url}: HTTP {status} ({ctype or 'no content type'}: {excerpt(body, ctype, 80) or 'no body'}); "
            "expected the server's Prometheus metrics: start llama-server with --metrics (lablib's start_server does), vLLM serves them by default; "
            "other servers may have none"
        )
    what = f"GET {url} answered {ctype or 'no content type'}"
    if ctype.split(";")[0].strip().lower() in ("text/html", "application/json"):
        raise LabError(f"{what}, not Prometheus text: expected a /metrics endpoint (is this the server's root URL?)")
    try:
        samples = parse(body, only_view)
    except ValueError as e:
        raise LabError(
            f"{what} that is not Prometheus text ({first_line(e)}): expected `name{{labels}} value` lines "
            "(is this the server's root URL?)"
        ) from None
    if not samples and not only_view:
        raise LabError(f"{what} with no samples: expected Prometheus metrics of an inference server")
    return samples


# a server's speculative-decoding counters (vLLM's spec_decode_*; llama-server reports per response, in timings)
SPEC_SOURCES = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_n": "vllm:spec_decode_num_draft_tokens_total",
    "draft_n_accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
SPEC_BY_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position=0,1,...


def speculation_counters(root_url: str, timeout_s: float = 2.0) -> dict:
    """A server's speculative-decoding counters now, summed over label sets: ``drafts`` (draft runs
    proposed), ``draft_n`` (tokens drafted), ``draft_n_accepted`` (accepted) and ``accepted_by_position``
    ({position: accepted tokens}); {} when the server counts none (no speculation, or another server)."""
    samples = scrape(root_url, timeout_s)
    out: dict = {}
    for key, name in SPEC_SOURCES.items():
        vals = [s["value"] for s in samples if s["name"] == name]
        if vals:
            out[key] = sum(vals)
    pos = {int(s["labels"].get("position", 0)): s["value"] for s in samples if s["name"] == SPEC_BY_POSITION}
    if pos:
        out["accepted_by_position"] = dict(sorted(pos.items()))
    return out


def _number(key: str, v: float):
    return int(v) if key != "kv_usage" and float(v).is_integer() else v


def _view_sources(samples: list[dict]) -> dict[str, tuple]:
    """common name -> (value, the raw names it was read from); waiting_by_reason: ({reason: n}, raw)."""
    by: dict[str, list[dict]] = {}
    for s in samples:
        by.setdefault(s["name"], []).append(s)
    out = {}
    for key, sources in SOURCES.items():
        for names in sources:
            if not all(n in by for n in names):
                continue
            if key == "waiting_by_reason":
                reasons: dict[str, float] = {}
                for s in by[names[0]]:
                    r = s["labels"].get("reason", "")
                    reasons[r] = reasons.get(r, 0) + s["value"]
                out[key] = ({r: _number(key, v) for r, v in reasons.items()}, names[0])
            else:
                combine = statistics.fmean if key == "kv_usage" else sum
                value = sum(combine([s["value"] for s in by[n]]) for n in names)
                out[key] = (_number(key, value), " + ".join(names))
            break
    return out


def server_view(samples: list[dict]) -> dict:
    """The common names (:data:`VIEW`) of one scrape; None where the server has no such metric."""
    found = _view_sources(samples)
    return {k: found[k][0] if k in found else None for k in VIEW}


def server_settings(samples: list[dict]) -> dict:
    """What the server says of itself: each ``*_info`` sample's labels (strings, as exported), by name,
    e.g. vLLM's ``{"vllm:cache_config_info": {"block_size": "16", "enable_prefix_caching": "True",
    "num_gpu_blocks": ...}}``; {} when it has none (llama-server)."""
    out: dict[str, dict] = {}
    for s in samples:
        if s["name"].endswith("_info"):
            out.setdefault(s["name"], {}).update(s["labels"])
    return out


def slots(root_url: str, timeout_s: float = 2.0) -> list[dict]:
    """llama-server's ``GET <root_url>/slots``: one dict per slot (``id``, ``n_ctx``, ``is_processing``,
    ``n_prompt_tokens``: tokens in its cache, ...). LabError when the server has no such endpoint."""
    url = f"{root_url.rstrip('/').removesuffix('/v1')}/slots"
    status, _, body = _get(url, timeout_s)
    try:
        data = json.loads(body) if status == 200 else None
    except ValueError:
        data = None
    if not isinstance(data, list) or not all(isinstance(s, dict) and "n_ctx" in s for s in data):
        raise LabError(
            f"GET {url}: HTTP {status}, not a JSON list of slots; expected llama-server's /slots "
            "(on by default; --no-slots turns it off); other servers have none"
        )
    return data


def slots_view(data: list[dict]) -> dict:
    """``running`` (slots processing), ``kv_usage`` (tokens held by processing slots / all slots' n_ctx),
    ``slots`` and ``n_ctx`` (tokens per slot; the largest) of :func:`slots`'s list."""
    busy = [s for s in data if s.get("is_processing")]
    ctx = sum(int(s.get("n_ctx") or 0) for s in data)
    held = sum(int(s.get("n_prompt_tokens") or 0) for s in busy)
    return {
        "running": len(busy),
        "kv_usage": held / ctx if ctx else None,
        "slots": len(data),
        "n_ctx": max((int(s.get("n_ctx") or 0) for s in data), default=None),
    }


def run_maxima(deltas: dict) -> dict:
    """A run's server view as table columns, from :meth:`MetricsSampler.deltas` (``{}``: a server without
    /metrics, every column None): ``running_max``, ``waiting_max`` (requests), ``kv_usage_max`` (0..1),
    ``preemptions`` (the run's count)."""
    return {
        "running_max": deltas.get("running"),
        "waiting_max": deltas.get("waiting"),
        "kv_usage_max": deltas.get("kv_usage"),
        "preemptions": deltas.get("preemptions"),
    }


class MetricsSampler:
    """Samples ``<root_url>/metrics`` every ``interval_s`` seconds in a daemon thread, on the lab's clock
    (:func:`lablib.results.trace.now`, the clock of the request traces).

    :meth:`start` scrapes once in the calling thread (LabError when the server has no ``/metrics``) and
    starts the thread; :meth:`stop` ends it and scrapes once more, so counter deltas cover the whole run.
    A failed scrape in between is counted (``failures``, ``last_error``), never raised. Where ``/metrics``
    lacks ``kv_usage`` and the server answers ``/slots`` (llama-server), each sample also reads ``/slots``
    (:func:`slots_view`). Cost of one sample, measured on loopback (2 CPUs): GET /metrics and the
    filtered parse 1.0 ms (1.3 ms of this process's CPU, GIL held), /slots another 1.0 ms; a real vLLM's
    53 kB text parses in 2.1 ms filtered (19.5 ms whole). At 0.25 s that is under 1 % of one core, off
    the event loop that times the streams; llama-server answers both while a decode runs (it reads its
    state without waiting for the decode), so a scrape holds no request up.

    Tidy rows (:meth:`rows`): ``t_s`` (the lab's clock, seconds, halfway through the GET), ``metric`` (a
    common name of :data:`VIEW`; ``waiting_by_reason.<reason>``), ``value``, ``raw`` (the server's names,
    or ``/slots``), plus the constructor's ``labels``. ``info``: :func:`server_settings` of the first scrape
    (with llama-server's ``slots`` and ``n_ctx`` per slot).
    """

    def __init__(self, root_url: str, interval_s: float = 0.25, timeout_s: float = 2.0, **labels):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not 0 < interval_s < 3600:
            raise LabError(f"interval_s={interval_s!r}: expected seconds between scrapes, above 0 and below 3600")
        self.root_url = root_url.rstrip("/").removesuffix("/v1")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.labels = labels
        self.info: dict = {}
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.scrape_s: list[float] = []  # seconds each successful sample took (GETs and parse)
        self._rows: list[dict] = []
        self._use_slots = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        t0 = now()
        samples = scrape(self.root_url, self.timeout_s, only_view=True)
        text_t = (t0 + now()) / 2
        found = _view_sources(samples)
        if self._use_slots:
            sv = slots_view(slots(self.root_url, self.timeout_s))
            if sv["kv_usage"] is not None and "kv_usage" not in found:
                found["kv_usage"] = (sv["kv_usage"], "/slots")
        rows = []
        for key in VIEW:
            if key not in found:
                continue
            value, raw = found[key]
            if key == "waiting_by_reason":
                rows += [dict(t_s=text_t, metric=f"{key}.{r}", value=v, raw=raw) for r, v in value.items()]
            else:
                rows.append(dict(t_s=text_t, metric=key, value=value, raw=raw))
        with self._lock:
            self._rows += [dict(r, **self.labels) for r in rows]
            self.scrapes += 1
            self.scrape_s.append(now() - t0)

    def _try_sample(self) -> None:
        try:
            self._sample()
        except Exception as e:  # noqa: BLE001 - a failed scrape is recorded, the run goes on
            with self._lock:
                self.failures += 1
                self.last_error = first_line(e)

    def _loop(self) -> None:
        due = now() + self.interval_s
        while not self._stop.wait(max(0.0, due - now())):
            self._try_sample()
            due = max(due + self.interval_s, now())  # a slow scrape skips the ticks it missed

    def start(self) -> MetricsSampler:
        """The first scrape (LabError when the server has no /metrics), then the sampling thread."""
        samples = scrape(self.root_url, self.timeout_s)
        self.info = server_settings(samples)
        if "kv_usage" not in _view_sources(samples):
            try:
                sv = slots_view(slots(self.root_url, self.timeout_s))
                self._use_slots = True
                self.info["slots"] = {"slots": sv["slots"], "n_ctx": sv["n_ctx"]}
            except LabError:
                self._use_slots = False
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="lablib-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread, then the last scrape (a failure is counted)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s + self.interval_s)
        self._thread = None
        self._try_sample()

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def rows(self) -> list[dict]:
        """The tidy rows so far, in time order (a copy)."""
        with self._lock:
            return list(self._rows)

    def deltas(self) -> dict:
        """The run by common name: counters last minus first sample (None when the server restarted: the
        counter went down), gauges their largest sample (``waiting_by_reason``: {reason: max}); None where
        never sampled."""
        series: dict[str, list] = {}
        for r in self.rows():
            series.setdefault(r["metric"], []).append(r["value"])
        out: dict = dict.fromkeys(VIEW)
        for metric, values in series.items():
            key, _, reason = metric.partition(".")
            if key in COUNTERS:
                d = values[-1] - values[0]
                out[key] = _number(key, d) if d >= 0 else None
            elif reason:
                out[key] = dict(out[key] or {}, **{reason: max(values)})
            else:
                out[key] = max(values)
        return out
