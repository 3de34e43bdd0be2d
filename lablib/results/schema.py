"""The columns of a result row, declared once (one row per measured request).

The writer (:func:`lablib.results.store.trace_row`), the readers and the foreign-file check
(:mod:`lablib.results.store`), the tables (:mod:`lablib.results.tables`), the figures
(:mod:`lablib.plots`) and the CLI name columns through these tuples, as llama-bench
declares its fields once and prints them in several formats.
"""

from __future__ import annotations

# what the run was: set by the sweeps (context rows: request_index = repetition)
LABELS = ("sweep", "mode", "concurrency", "repetition", "run_id", "request_index", "client")
# the metrics of DESIGN.md (RequestTrace's properties), seconds unless named otherwise, in the
# order tables show them (the JSON keys of `lablib run --json`)
METRICS = ("queue_s", "ttft_s", "prefill_s", "prefill_tps", "tpot_s", "decode_tps", "e2e_s")
# the rest of RequestTrace.metrics(): token counts, decode time, why generation stopped
COUNTS = ("prompt_tokens", "cached_tokens", "output_tokens", "decode_s", "finish_reason")
# raw clock readings, perf_counter seconds (comparable within one process and run): timelines
CLOCKS = ("t_submit", "t_start", "t_first_token", "t_last_token")
# lists per row: inter-token latencies, seconds
SERIES = ("itl_s",)
# row column -> (manifest section, key); section None: a top-level manifest key
MANIFEST_FIELDS = {
    "engine": ("engine", "name"),
    "engine_version": ("engine", "version"),
    "backend": ("engine", "backend"),
    "dtype": ("engine", "dtype"),
    # the weights it loaded, as its weights option names them (int4, source...; None: its one choice), and
    # the type its matrix products ran at: what lablib.studies.roofline bounds the row by
    "weights": ("engine", "weights"),
    "compute_dtype": ("engine", "compute_dtype"),
    "threads": ("engine", "threads"),
    "n_ctx": ("engine", "n_ctx"),
    "device": ("engine", "device"),  # what it computed on: cpu, cuda, mps, metal, gpu offload
    "model": ("model", "id"),
    "model_format": ("model", "format"),
    "quantization": ("model", "quantization"),
    "model_sha256": ("model", "file_sha256"),
    "cpu_model": ("hardware", "cpu_model"),
    "cores": ("hardware", "cores_physical"),
    "ram_bytes": ("hardware", "ram_bytes"),
    "accelerator": ("hardware", "accelerator"),
    "hostname": ("hardware", "hostname"),
    "cpu_quota": ("hardware", "cpu_quota"),
    "memory_limit_bytes": ("hardware", "memory_limit_bytes"),
    "load_avg_1m": ("hardware", "load_avg_1m"),  # the machine's load when the run started
    # this machine's measured ceilings, when measured (lablib.machine.measure_machine)
    "measured_bandwidth_gbps": ("hardware", "measured_bandwidth_gbps"),
    "measured_float32_gflops": ("hardware", "measured_float32_gflops"),
    "measured_bfloat16_gflops": ("hardware", "measured_bfloat16_gflops"),
    "measured_int8_gops": ("hardware", "measured_int8_gops"),
    "lablib_version": (None, "lablib_version"),
    "time": (None, "time"),
}
# the manifest basics a report shows, one row per machine and engine
MANIFEST_SUMMARY = (
    "engine",
    "engine_version",
    "backend",
    "device",
    "dtype",
    "weights",
    "compute_dtype",
    "threads",
    "quantization",
    "model",
    "cpu_model",
    "cores",
    "ram_bytes",
    "cpu_quota",
    "memory_limit_bytes",
    "accelerator",
    "hostname",
    "lablib_version",
)
# the roofline beside each measured row (lablib.studies.roofline.add_bound_columns): FLOPs, bytes, intensity
# (FLOP per byte), the machine's bound and the share of it reached, for prefill and decode (it also
# fills the manifest's compute_dtype where a row has none: rows written before the column existed)
BOUND_COLUMNS = (
    "bound_bytes_per_s",
    "bound_flop_per_s",
    "prefill_flops",
    "prefill_bytes",
    "prefill_intensity",
    "prefill_flop_per_s",
    "prefill_bound_tps",
    "prefill_pct_of_bound",
    "decode_depth",
    "decode_batch",
    "decode_flops_per_token",
    "decode_intensity",
    "decode_flop_per_s",
    "decode_bound_tps",
    "decode_pct_of_bound",
)
# prefix caching (lablib.studies.prefix, lab 08): whether the request reused a kept prefix, the shared
# prefix's length (tokens), which question / chat turn it was, the prompt tokens the engine's own
# counter says it evaluated, and the bytes the kept prefix cache held
PREFIX = ("reuse", "shared_tokens", "question", "turn", "evaluated_tokens", "kept_cache_bytes")
# what a row written before a column existed means by its absence (lablib.results.store.load_results)
DEFAULTS = {"cached_tokens": 0}
# present in some rows only: output ids, decoded text, an error message, the file a row came from
OPTIONAL = ("token_ids", "text", "error", "source_file")
# machines to facet figures by
FACETS = ("hostname", "cpu_model")

COLUMNS = LABELS + METRICS + COUNTS + SERIES + CLOCKS + tuple(MANIFEST_FIELDS) + OPTIONAL + BOUND_COLUMNS + PREFIX


def flatten_manifest(manifest: dict) -> dict:
    """The manifest's fields as row columns (:data:`MANIFEST_FIELDS`); a key the manifest lacks is None."""
    return {
        col: (manifest if section is None else manifest.get(section, {})).get(key)
        for col, (section, key) in MANIFEST_FIELDS.items()
    }
