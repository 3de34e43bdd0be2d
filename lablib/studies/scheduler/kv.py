"""The KV cache as the limit (lab 09): how many sequences of a length fit in a KV cache of N blocks, predicted
from the model's shape (:func:`kv_prediction`), beside what vLLM says at start (:func:`stated_capacity`) and
what it does as concurrency rises (:func:`kv_capacity`: running, waiting, KV cache used, preemptions).
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
        window = model_dims(model)["sliding_window"]
        reserve = groups.get("full", 0) * math.ceil(max_model_len / block_tokens)
        if groups.get("sliding"):  # vLLM's max_admission_blocks_per_request of a sliding group
            held = min(window - 1 + in_flight_tokens, max_model_len)
            reserve += groups["sliding"] * (math.ceil(held / block_tokens) + 1)
        out["predicted_max_concurrency"] = kv_blocks / reserve
        out["predicted_kv_tokens"] = (
            kv_blocks * block_tokens if "sliding" not in groups else int(kv_blocks / reserve * max_model_len)
        )
    return out


_STATED = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


def stated_capacity(log_text: str) -> dict:
    """What vLLM says of its KV cache at start, read from its log (vllm/v1/core/kv_cache_utils.py,
    ``update_kv_cache_capacity``: "CPU KV cache size: 23,296 tokens, Maximum concurrency for 512 tokens per
    request: 45.50x"): ``stated_kv_tokens``, ``stated_for_tokens`` (the request length it divides by: its
    max_model_len), ``stated_max_concurrency``; and, when it was started with ``--num-gpu-blocks-override``
    ("Overriding num_gpu_blocks=182 with num_gpu_blocks_override=5"), ``space_blocks`` (what its KV cache
    space would have given) and ``override_blocks``, else None. LabError when the log has no such line (not
    a vLLM log, or one of a start that did not get that far)."""
    found = _STATED.findall(log_text or "")
    if not found:
        raise LabError(
            "no 'KV cache size: N tokens, Maximum concurrency for M tokens per request: X.XXx' line in the log: "
            "expected the log of a vLLM server that started (RunningServer.log_path)"
        )
    tokens, per_request, conc = found[-1]
    over = _OVERRIDE.findall(log_text)
    return {
        "stated_kv_tokens": int(tokens.replace(",", "")),
        "stated_for_tokens": int(per_request.replace(",", "")),
        "stated_max_concurrency": float(conc),
        "space_blocks": int(over[-1][0]) if over else None,
        "override_blocks": int(over[-1][1]) if over else None,
    }


def server_kv_blocks(server, model) -> int:
    """The KV cache blocks of ``server`` (a RunningServer of a paged KV cache: its settings name
    ``kv_cache_space_gib``): ``num_gpu_blocks`` when the lab set it, else what its KV cache space gives
    (floor(space / (block_tokens x KV bytes per token)), as vLLM divides it). LabError for a server
    without a paged KV cache."""
    from lablib.engines.servers import vllm_block_bytes

    s = getattr(server, "settings", None) or {}
    if s.get("num_gpu_blocks") is not None:
        return int(s["num_gpu_blocks"])
    if s.get("kv_cache_space_gib") is None:
        raise LabError(
            f"{getattr(server, 'name', server)!r} states no paged KV cache (its settings have no kv_cache_space_gib "
            "or num_gpu_blocks): kv_capacity needs a server with one, as the lab starts vLLM"
        )
    per_block = vllm_block_bytes(model, _bytes_per_element(s))  # group_size layers: every layer, when alike
    return int(s["kv_cache_space_gib"] * 2**30 // per_block)


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

    Each row: ``concurrency``; the prediction (:func:`kv_prediction` with the server's blocks, dtype and
    ``max_num_seqs``: kv_blocks, usable_blocks, blocks_per_sequence, fit_sequences, predicted_running_max,
    predicted_waiting, predicted_preemption, predicted_kv_usage_max, predicted_kv_tokens,
    predicted_max_concurrency ...); what the server stated at start (:func:`stated_capacity` of its log:
    stated_kv_tokens, stated_max_concurrency, stated_for_tokens); and what it did (its /metrics:
    ``running_max``, ``waiting_max``, ``kv_usage_max`` (0..1), ``preemptions``), with ``errors`` and the
    run's ``ttft_p50_s`` and ``e2e_p50_s``. The request rows are in the result's ``attrs["rows"]``, the
    server's samples (with ``concurrency``) in ``attrs["server_rows"]``. LabError for a server without a
    paged KV cache or /metrics, or a sequence longer than its context."""

    from lablib.checks import whole
    from lablib.engines.http.metrics import MetricsSampler, run_maxima
    from lablib.measure.load import run_load, summarize
    from lablib.measure.workload import distinct_prompts

    blocks = server_kv_blocks(server, model)
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

    return table_with_rows(table, raw, server_rows)
