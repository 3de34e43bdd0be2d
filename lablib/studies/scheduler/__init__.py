"""Lab 09's operations: what a production scheduler does under real traffic.

Three experiments on real servers the lab starts (:mod:`lablib.engines.servers`), each a function of tidy
rows and returning tables (pandas DataFrames):

- **head-of-line blocking** (:func:`hol_blocking`): a few short streams decoding, then one long prompt
  arrives; the short streams' inter-token latency over time shows whether the long prompt's prefill
  stalled them (one step that holds the whole prompt) or was cut into chunks between their decode steps
  (:func:`token_table`, :func:`hol_summary`, :func:`hol_table`); the same inside this process on an
  engine's own continuous batching (:func:`hol_in_process`: llama.cpp's batch session, its steps counted
  exactly);
- **the KV cache as the limit** (:func:`kv_capacity`): how many sequences of a length fit in a KV cache of
  N blocks (:func:`kv_prediction`, from the model's shape), beside what the server says at start
  (:func:`stated_capacity`, from its log) and what it does when concurrency rises (its ``/metrics``: running,
  waiting, KV cache used, preemptions);
- **the saturation knee** (:func:`find_knee`): the rate where throughput stops following the offered load
  and latency turns up, found from a rate sweep's table by a stated rule;
- **real traffic** (:func:`trace_replay`): a slice of Mooncake's trace on its own send times; the same slice
  with prefix caching on and off (:func:`prefix_reuse`: the server's own hit counters beside what a perfect
  cache could have reused, TTFT p50/p99), and multi-turn chats on and off (:func:`multi_turn`,
  :func:`turn_table`: TTFT and cached tokens by turn). One server serves both arms (:func:`_arm_engine`:
  llama-server per request, ``cache_prompt``; vLLM started with prefix caching on, through its
  ``cache_salt``), "on" first.

Seconds unless a name says otherwise; times on the lab's clock (:func:`lablib.results.trace.now`), a
run's times relative to its first ``t_submit``.
"""

from __future__ import annotations

from lablib.studies.scheduler.hol import (
    ROLES,
    STEP_COUNTERS,
    HolRun,
    batch_tokens,
    engine_batch_tokens,
    hol_blocking,
    hol_in_process,
    hol_summary,
    hol_table,
    prefill_steps,
    server_steps,
    step_counter,
    steps_counted,
    token_table,
)
from lablib.studies.scheduler.knee import KNEE_RULE, find_knee, kneedle, rate_sweep
from lablib.studies.scheduler.kv import (
    KV_VIEW,
    kv_capacity,
    kv_prediction,
    server_kv_blocks,
    server_kv_cache,
    stated_capacity,
)
from lablib.studies.scheduler.traffic import (
    ARMS,
    REUSE_VIEW,
    _arm_engine,
    cache_block_tokens,
    multi_turn,
    prefix_reuse,
    seen_prefix,
    trace_replay,
    turn_table,
)


def quick_defaults(quick: bool | None = None) -> dict:
    """Sizes for lab 09 (:data:`lablib.config.BUDGETS` ``"scheduler"``): small in quick mode (LABLIB_QUICK=1)."""
    from lablib.config import budgets

    return budgets("scheduler", quick)


__all__ = [
    "ARMS",
    "KNEE_RULE",
    "KV_VIEW",
    "REUSE_VIEW",
    "ROLES",
    "STEP_COUNTERS",
    "HolRun",
    "batch_tokens",
    "cache_block_tokens",
    "engine_batch_tokens",
    "find_knee",
    "hol_blocking",
    "hol_in_process",
    "hol_summary",
    "hol_table",
    "kneedle",
    "kv_capacity",
    "kv_prediction",
    "multi_turn",
    "prefill_steps",
    "prefix_reuse",
    "quick_defaults",
    "rate_sweep",
    "seen_prefix",
    "server_kv_blocks",
    "server_kv_cache",
    "server_steps",
    "step_counter",
    "steps_counted",
    "stated_capacity",
    "token_table",
    "trace_replay",
    "turn_table",
    "_arm_engine",
]
