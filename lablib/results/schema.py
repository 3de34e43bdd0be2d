"""The columns of a result row, declared once (one row per measured request), and of the tables made of rows.

Every column a row can carry is in :data:`COLUMNS`: the sweeps' (labels, metrics, counts, clocks, the
manifest), the roofline's bound, prefix caching's, a request over HTTP's, a load shape's and the
quantization ladder's. :data:`TABLE_COLUMNS` are the columns of tables that no row carries (a run
summary, a batch sweep, an anchor comparison, the kept prefix caches' memory). The writer
(:func:`lablib.results.store.trace_row`), the readers and the foreign-file check
(:mod:`lablib.results.store`), the tables and their one column check (:func:`lablib.results.tables.need`,
which refuses a name declared in neither), the figures (:mod:`lablib.plots`) and the CLI name columns
through these tuples, as llama-bench declares its fields once and prints them in several formats.
tests/test_schema.py fails naming a column a row carries that is not declared here.
"""

from __future__ import annotations

# what the run was: set by the sweeps (context rows: request_index = repetition); prompt_format: how the prompt was
# made where a row says, "chat" (the model's chat template) or "text" (raw text: a base model has no template)
LABELS = ("sweep", "mode", "concurrency", "repetition", "run_id", "request_index", "client", "prompt_format")
# the metrics of DESIGN.md (RequestTrace's properties), seconds unless named otherwise, in the
# order tables show them (the JSON keys of `lablib run --json`)
METRICS = ("queue_s", "ttft_s", "prefill_s", "prefill_tps", "tpot_s", "decode_tps", "e2e_s")
# the rest of RequestTrace.metrics(): token counts, decode time, why generation stopped, and whether two or more
# tokens all came at one instant (no decode seen, so no TPOT: a stream that came whole, buffered or read late)
COUNTS = ("prompt_tokens", "cached_tokens", "output_tokens", "decode_s", "finish_reason", "decode_unseen")
# raw clock readings, perf_counter seconds (comparable within one process and run): timelines
CLOCKS = ("t_submit", "t_start", "t_first_token", "t_last_token")
# lists per row: inter-token latencies, seconds
SERIES = ("itl_s",)
# this machine's measured ceilings, the one spelling of their columns (the manifest's hardware keys,
# lablib.machine.ceilings.measured_summary, lablib.studies.roofline.add_bound_columns): the memory bandwidth
# (GB/s = 1e9 bytes/s) and the peak of each compute type (GFLOP/s; int8: GOP/s)
MEASURED_BANDWIDTH = "measured_bandwidth_gbps"
MEASURED_PEAKS = {
    "float32": "measured_float32_gflops",
    "bfloat16": "measured_bfloat16_gflops",
    "int8": "measured_int8_gops",
}
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
    # lablib.machine.identity.machine_key: hostname, CPU model and signature (family, model, flags), usable CPUs,
    # accelerators, hashed; two cloud VMs of one hostname and one CPU name can differ in it
    "machine_key": ("hardware", "machine_key"),
    # lablib.machine.identity.machine_id: the operating system's id of this machine, hashed (12 hex digits; None where
    # it keeps none); two laptops of one hostname and one CPU differ in it (lablib.results.tables.machine_names)
    "machine_id": ("hardware", "machine_id"),
    "cpu_quota": ("hardware", "cpu_quota"),
    "memory_limit_bytes": ("hardware", "memory_limit_bytes"),
    "load_avg_1m": ("hardware", "load_avg_1m"),  # the machine's load when the run started
    # this machine's measured ceilings, when measured (lablib.machine.measure_machine)
    MEASURED_BANDWIDTH: ("hardware", MEASURED_BANDWIDTH),
    **{col: ("hardware", col) for col in MEASURED_PEAKS.values()},
    "lablib_version": (None, "lablib_version"),
    # the Unix time minus the lab's clock when the run started (seconds): t_* + this is a row's Unix time
    # (lablib.results.store.merge_results(one_clock=True): several client machines on one time line)
    "clock_unix_offset_s": (None, "clock_unix_offset_s"),
    "time": (None, "time"),
    # what a server the lab started was started with (lablib.engines.servers.Launch.settings: dtype, KV
    # cache space, prefix caching, threads ...), as JSON text; None for in-process engines
    "server_settings": ("engine", "flags", "server_settings"),
    # the model id an http engine's requests named (its "model" field: lablib bench --model, default the first of the
    # server's /v1/models; None for llama-server's native /completion, whose requests name none; a LoRA request
    # names its adapter instead: the row's ``adapter``); ``model`` is the lab's model, whose tokenizer made and
    # counted the prompts
    "server_model": ("engine", "flags", "server_model"),
    # the device a server computes on, in words ("NVIDIA H200, 140 GiB, 31/31 layers", "AMD EPYC, 2 threads"),
    # as the lab read it when it started the server; "unknown" for a server at any other URL (rows' ``device``
    # then says "unknown" too, not the client's); None for in-process engines
    "server_device": ("engine", "flags", "server_device"),
    # the http engine's connections to its server: "pooled" (keep-alive) or "one per request"
    "connections": ("engine", "flags", "connections"),
    # the event loop that read and stamped the http engine's streams: "uvloop 0.23.0", "asyncio (Python 3.11.7)"
    "event_loop": ("engine", "flags", "event_loop"),
    # what the http engine's requests say about the server's prompt cache: "cache_prompt: false" / "true"
    # (llama-server), "cache_salt: per-request" / "cache_salt: <salt>" (vLLM), "none" (no switch sent)
    "cache_control": ("engine", "flags", "cache_control"),
    # transformers' compiled decoding (load option compile=True): torch.compile's mode ("reduce-overhead" on CUDA,
    # "default" elsewhere); None for an eager engine. Its launch floor is another (lablib.studies.launch_floor)
    "compile_mode": ("engine", "flags", "compile", "mode"),
    # the kernel llama.cpp's prefill multiplies each type of the layers' weights with on the CPU ("Q4_1 row by
    # row", "Q4_0 repacked q4_0_8x8", "Q8_0 tinyBLAS": lablib.engines.ggml_kernels); None for other engines
    "matmul_kernels": ("engine", "flags", "matmul_kernels"),
}
# the GPUs NVML lists (lablib.machine.telemetry.gpu_manifest, the manifest's hardware.gpu): their names (distinct
# ones joined by "; "), count, memory in all (bytes), the driver's version and its CUDA version ("13.0"); only
# where a GPU answers NVML: a CPU machine's manifest has no hardware.gpu and its rows none of these columns
GPU_MANIFEST_FIELDS = {
    "gpu_name": ("hardware", "gpu", "name"),
    "gpu_count": ("hardware", "gpu", "count"),
    "gpu_memory_total_bytes": ("hardware", "gpu", "memory_total_bytes"),
    "gpu_driver": ("hardware", "gpu", "driver"),
    "cuda_version": ("hardware", "gpu", "cuda_version"),
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
    # the third line (lablib.studies.launch_floor): the engine's measured seconds per decode step of the model's
    # skeleton on the row's device and threads (None where none was measured), the two other lines' least seconds
    # per decode step (max(bytes / bandwidth, FLOPs / peak)), and which of the three binds the row's decode:
    # "bandwidth", "compute" or "launches"
    "launch_floor_s",
    "decode_roof_s",
    "decode_bound_by",
)
# prefix caching (lablib.studies.prefix, lab 08): whether the request reused a kept prefix, the shared
# prefix's length (tokens), which question / chat turn it was, the prompt tokens the engine's own
# counter says it evaluated, and the bytes the kept prefix cache held
PREFIX = ("reuse", "shared_tokens", "question", "turn", "evaluated_tokens", "kept_cache_bytes")
# what a request over HTTP adds (lablib.engines.http.HTTPTrace.metrics): the server kind and API, the output
# budget asked, how output tokens were counted, the stream's content chunks (count, tokens in each, the gaps
# between them: ICL, seconds), network reads, the tokens that arrived with the first (more than 1: their decode is
# in TTFT), SSE events (most in one read) and pings, the server's own usage
# counts and the checks against the lab's counts, the fixed-length method and whether the count came out as
# asked, the server's own timings (prompt seconds, decode tokens/s, the raw JSON) and what HTTP and the
# server's queue add to the first token (seconds); the lab's tokenizer's own count of the streamed text where
# the count came from the server's final usage (count_method "final_usage") or from re-tokenizing, the time to
# the first answer token after a chat model's reasoning (seconds; ttft_s is the first token of either), and SSE
# events of other types than an OpenAI chunk's (ignored)
HTTP = (
    "server",
    "api",
    "max_new_tokens",
    "count_method",
    "retokenized_tokens",
    "ttft_answer_s",
    "ignored_events",
    "chunks",
    "chunk_tokens",
    "chunk_gaps_s",
    "reads",
    "first_arrival_tokens",
    "events",
    "max_events_per_read",
    "pings",
    "usage_prompt_tokens",
    "usage_completion_tokens",
    "usage_cached_tokens",
    "usage_mismatch",
    "prompt_mismatch",
    "fixed_length",
    "output_count_ok",
    "server_prompt_s",
    "server_decode_tps",
    "server_timings",
    "http_overhead_s",
)
# a load shape over HTTP (lablib.measure.load.run_load; mode, concurrency, request_index and client are
# LABELS): the open loop's rate (requests/s), arrival process and gamma shape, and each request's scheduled
# send time (seconds after the run's start) and how late it went out (seconds)
LOAD = ("rate", "arrival", "burstiness", "t_scheduled", "schedule_lag_s")
# a request trace replayed (lablib.measure.replay; with LOAD's t_scheduled and schedule_lag_s, PREFIX's turn and
# HTTP's max_new_tokens): which trace and scale (every row: the file, time/length/output factors, the scaled
# block in tokens), and per request its index in the trace, its unscaled lengths, its session, the block ids its
# prompt is made of and their count, and the tokens a perfect prefix cache could reuse (leading full blocks an
# earlier request held)
REPLAY = (
    "trace_file",
    "time_scale",
    "length_scale",
    "output_scale",
    "block_tokens",
    "trace_index",
    "trace_prompt_tokens",
    "trace_output_tokens",
    "session",
    "hash_ids",
    "prefix_blocks",
    "reusable_tokens",
)
# the scheduler under traffic (lablib.studies.scheduler, lab 09): a request's part in the head-of-line experiment
# ("short": a stream decoding; "long": the prompt that arrives while they decode) and the server's token budget
# per step it ran under (llama-server's -b, vLLM's --max-num-batched-tokens; None: the server's default); in a
# prefix-reuse or multi-turn run, the arm ("on": a request may reuse the arm's earlier requests' KV cache;
# "off": none reuses another's) and the prefix tokens a cache that kept every earlier request of the arm (prompt
# and output) could have reused, at the server's block (lablib.studies.scheduler.seen_prefix: an upper bound)
SCHEDULER = ("role", "batch_tokens", "prefix_cache", "seen_prefix_tokens")
# a model's quality against its reference, lablib.studies.quality.STATS: perplexity (its own, the reference's),
# KL divergence per token (mean, p99, max; nats), top-1 agreement, shifts of the reference's top token's
# probability and of the target's (mean |shift|, mean, RMS), and the tokens scored
QUALITY = ("ppl", "ppl_ref", "kl_mean", "kl_p99", "kl_max", "top1", "dp_top_abs_mean", "dp_mean", "dp_rms", "n_tokens")
# a rung of the quantization ladder (lablib.studies.ladder; with QUALITY, prefill_tps, decode_tps and the
# manifest's engine, model and machine columns): the reference it is measured against (label, file), the
# chunks scored, the weights' format, type and path, their sizes (bytes of the file or folder, of the tensors,
# read per decoded token; parameters; bits per weight), the mix of tensor types (summary, JSON), the seconds to
# load and to quantize, and whether the file came from the cache
LADDER = (
    "reference",
    "reference_path",
    "n_chunks",
    "format",
    "type",
    "path",
    "bytes",
    "tensor_bytes",
    "bytes_per_token",
    "parameters",
    "bpw",
    "type_mix",
    "tensor_types",
    "load_s",
    "quantize_s",
    "cached",
)
# speculative decoding (lablib.studies.decoding.speculative, lab 10): how the request speculated (spec_method:
# "none", "draft model", "prompt lookup", "ngram"), the draft (a GGUF type, a dtype, "lookup") and its KL to the
# target per token (nats, lab 06's measure) and its cost per token relative to the target's (c, from their
# plain TPOTs; 0 for a lookup), the target's weights, draft tokens per step (k), the prompt's kind
# (prose, code, repetitive), the engine's own counters (tokens drafted and accepted; their ratio, the acceptance
# rate alpha; target forward passes after the prefill, output tokens per pass; per pass: drafted and accepted),
# whether the greedy output equals the same engine's without speculation (and the first index where it does not),
# and how the tokens arrived (distinct token stamps; the most tokens sharing one stamp: a verified run)
SPECULATIVE = (
    "spec_method",
    "draft",
    "draft_kl",
    "draft_cost",
    "target",
    "k",
    "text_kind",
    "draft_n",
    "draft_n_accepted",
    "acceptance",
    "target_passes",
    "tokens_per_pass",
    "drafted_per_pass",
    "accepted_per_pass",
    "same_as_plain",
    "diverged_at",
    "token_arrivals",
    "max_tokens_per_arrival",
)
# structured output (lablib.studies.decoding.structured, lab 10): the constraint's kind (json_schema, regex, or
# none) and name, whether the request carried it, its arm (first: the first constrained request of that schema;
# cached: later ones; free: no constraint), the seconds to compile it (compile_s) and where that number comes from
# (compile_source: "engine", the engine timed its own compile; "ttft_difference", a server's first TTFT minus its
# cached ones), whether a compiled grammar was reused, and whether the output parses as JSON and validates against
# the schema (jsonschema) or matches the regex in full
STRUCTURED = (
    "constraint_kind",
    "schema",
    "constrained",
    "arm",
    "compile_s",
    "compile_source",
    "compile_cached",
    "parses",
    "valid",
)
# LoRA adapters (lablib.studies.adapters, lab 11): the adapter a request used (its name: r8, r64, r8-s1; None: the
# base model), its rank, the arm (none, unmerged: applied on the fly, merged: in the weights), the seconds to attach
# it to a loaded engine (unmerged), the bytes and parameters it adds, the first output position where the ids differ
# from the same engine's without an adapter (None: not applied) and, merged, from the unmerged arm's; on a server
# serving several: which mix of adapters the closed loop sent (none, same, distinct, first use) and how many the
# server had loaded
ADAPTERS = (
    "adapter",
    "adapter_rank",
    "adapter_arm",
    "adapter_load_s",
    "adapter_bytes",
    "adapter_parameters",
    "adapter_diverged_at",
    "merged_diverged_at",
    "merged_margin_nats",
    "adapter_mix",
    "adapters_loaded",
)
# the first requests after a load (lablib.studies.first_requests, lab 01; with LADDER's load_s, the seconds of that
# load): which load of the engine in its fresh process (1: the process's first) and which request after it (1: the
# first)
FIRST_REQUESTS = ("load_number", "request_number")
# what a row written before a column existed means by its absence (lablib.results.store.load_results)
DEFAULTS = {"cached_tokens": 0}
# present in some rows only: output ids, decoded text, an error message, the file a row came from
OPTIONAL = ("token_ids", "text", "error", "source_file")
# machines to facet figures by; "machine": this machine or a reference's, in words (lablib.results.reference.beside)
FACETS = ("hostname", "cpu_model", "machine")
# the columns lablib.results.reference adds to rows it loads or puts beside a learner's: what each row ran on
REFERENCE = ("machine",)

COLUMNS = (
    LABELS
    + METRICS
    + COUNTS
    + SERIES
    + CLOCKS
    + tuple(MANIFEST_FIELDS)
    + tuple(GPU_MANIFEST_FIELDS)
    + OPTIONAL
    + BOUND_COLUMNS
    + PREFIX
    + HTTP
    + LOAD
    + REPLAY
    + SCHEDULER
    + QUALITY
    + LADDER
    + SPECULATIVE
    + STRUCTURED
    + ADAPTERS
    + FIRST_REQUESTS
)

# --- the columns of tables (lablib.results.tables, lablib.studies): what rows become ------------------------
# every summary's percentiles (lablib.results.tables.run_summary: run_table, the HTTP bench, summary_line)
PERCENTILES = (50, 90, 95, 99)
# the distributions a run summary gives percentiles of, seconds: per request (queue_s ... e2e_s), every
# inter-token gap of every request (itl_s) and every gap between content chunks (chunk_gaps_s, HTTP rows)
DISTRIBUTIONS = ("queue_s", "ttft_s", "tpot_s", "e2e_s", "itl_s", "chunk_gaps_s")


def percentile_column(metric: str, q) -> str:
    """The one naming of a percentile column, ``<metric>_p<q>_s``: ``ttft_s``, 99 -> ``ttft_p99_s``."""
    return f"{metric.removesuffix('_s')}_p{q}_s"


# one run in numbers (lablib.results.tables.run_summary): requests sent and failed, output tokens of the
# successful ones, the makespan (first t_submit to last token, seconds), output tokens/s and successful
# requests/s over it, goodput (requests/s meeting every target; their fraction of all), the percentiles of
# DISTRIBUTIONS, the open loop's largest schedule lag (seconds), and the successful requests of two or more tokens
# whose tokens all arrived at one instant (no TPOT: their decode is inside their TTFT; the rows' decode_unseen), and
# those whose first token came with others but not all (first_arrival_tokens > 1: TTFT holds some decode, TPOT is low)
SUMMARY = (
    "requests",
    "errors",
    "output_tokens",
    "makespan_s",
    "output_tps",
    "requests_per_s",
    "goodput_rps",
    "goodput_fraction",
    *(percentile_column(m, q) for m in DISTRIBUTIONS for q in PERCENTILES),
    "schedule_lag_max_s",
    "decode_unseen_requests",
    "first_bunched_requests",
)
# a batch sweep of the roofline (lablib.studies.roofline.batch_sweep; with decode_tps): the batch size, one
# decode step's seconds, tokens/s of all sequences, intensity (FLOP/byte), FLOP/s and what bounds it
BATCH_SWEEP = ("batch", "step_s", "decode_tps_total", "intensity", "flop_per_s", "bound")
# the lab beside an anchor's own benchmark (lablib.studies.anchors.batched_rows; with concurrency and
# output_tps): who measured it ("lab" or the anchor tool's name)
ANCHOR = ("source",)
# what the kept prefix caches cost (lablib.studies.prefix.memory_table; with engine): their length (tokens),
# the bytes measured (the engine's own count) and counted from the model's shape, and both per token
PREFIX_MEMORY = ("tokens", "kept_bytes", "formula_bytes", "kept_bytes_per_token", "formula_bytes_per_token")
# a server's own view of a load run (lablib.engines.http.metrics.MetricsSampler; lablib bench writes its rows to
# <out>.server.jsonl, with the run's mode, rate and concurrency): a sample's time (the lab's clock, perf_counter s,
# as the request rows' CLOCKS), the common metric name, its value and the server's own names of it; a bench
# summary's per-run server counters (counter deltas, gauge maxima) and what the server says of itself (its
# *_info metrics; not the manifest's server_settings, what the lab started it with); requests in flight over a
# run (lablib.results.tables.client_server_timeline: sent, last token not yet arrived); and the client's own
# headroom in the run (lablib.measure.load.client_headroom_of: the lag of the loop that stamped its tokens)
SERVER = ("t_s", "metric", "value", "raw", "server_counters", "server_info", "in_flight", "client_headroom")
# the machine's own counters over one run (lablib.machine.telemetry.RunTelemetry; a bench summary, a sweep point's
# record in <out>.runs.jsonl, a side_by_side engine's): the GPUs through NVML (per GPU, or why there are none; the
# sampled window, s; memory used, peak, bytes, the GPUs' peaks added; SM clock median, MHz; power median, W, the
# GPUs' medians added; the boards' energy counters' difference, J, and per output token, only over a window of at
# least 5 s, else why not), the CPU packages' energy from RAPL (J, J per output token, the domains read; or why
# none: "not reported here"), and the machine's price for an hour given by the user and what the run's output cost
# at it per million tokens (that currency)
TELEMETRY = (
    "gpu_telemetry",
    "telemetry_window_s",
    "gpu_memory_used_peak_bytes",
    "gpu_sm_clock_mhz_p50",
    "gpu_power_w_p50",
    "gpu_energy_j",
    "gpu_j_per_output_token",
    "gpu_energy_note",
    "cpu_energy_j",
    "cpu_j_per_output_token",
    "cpu_energy_domains",
    "cpu_energy_note",
    "price_per_hour",
    "cost_per_mtok",
)
# what a replay's summary adds to a run summary (lablib.measure.replay.replay_summary): requests scheduled and
# those never sent (past the time limit), the send lag's p50/p99 (s) against its limit and whether the client
# kept up, the schedule's span and the drain after its last send (s), whether every output count came out as
# asked, and the share of prompt tokens a perfect prefix cache could have reused
REPLAY_SUMMARY = (
    "scheduled",
    "not_sent",
    "schedule_lag_p50_s",
    "schedule_lag_p99_s",
    "max_lag_s",
    "kept_up",
    "schedule_span_s",
    "drain_s",
    "output_count_ok",
    "perfect_reuse_fraction",
)
# the scheduler's tables (lablib.studies.scheduler, lab 09): every token of a head-of-line run (token_table: its
# index in its request, with t_s seconds since the run's first t_submit and itl_s the gap to the request's
# previous token); a head-of-line run's summary (hol_summary: the long request's prompt tokens, arrival, first
# token and TTFT, s; the short streams' median ITL before it arrived and longest ITL overlapping its prefill, s,
# and their ratio; the fewest and most tokens a short stream got during that prefill, the prefill steps
# predicted, whether the short streams outlasted it, and the server's own step count over the run; the long
# request's send time and the short streams' budget, s and tokens; the warm-up's long prompt alone: its TTFT
# and TPOT, s, and its steps counted by the server and predicted, and the name of the server's step counter;
# in process, hol_in_process: the engine's steps from the long request's submission to its first token and over
# the run, the short streams' tokens before it was submitted, every request's budget); the
# server's /metrics over a run (gauge maxima, preemptions counted); the KV cache predicted (kv_prediction:
# blocks in all and holding tokens, bytes per token and in all, a sequence's tokens and blocks, sequences that
# fit, the running maximum, waiting, preemption and KV use, 0..1, predicted, and what vLLM would state) beside
# what vLLM stated at start (stated_capacity: its KV tokens and maximum concurrency for requests of so many
# tokens; the blocks its KV space gave and the override); the saturation knee's steps (find_knee: a step's
# throughput slope over the light-load slope, latency over the light-load latency, the knee's row); prefix
# reuse by arm (prefix_reuse: the server's prefix-caching start switch, the perfect block cache's share of the
# prompt tokens, the tokens the server's cache reuses at a time, the server's own hit rate (its hits over the
# prompt tokens) and lookups, cached tokens no earlier request of the arm explains, requests whose output ids
# are the same in both arms) and multi-turn chats by turn (turn_table: the slowest TTFT, s)
SCHEDULER_TABLES = (
    "token_index",
    "long_prompt_tokens",
    "long_arrival_s",
    "long_first_token_s",
    "long_ttft_s",
    "short_itl_before_p50_s",
    "short_itl_during_max_s",
    "itl_ratio",
    "short_tokens_during_min",
    "short_tokens_during_max",
    "prefill_steps_predicted",
    "shorts_outlast_prefill",
    "server_steps",
    "long_delay_s",
    "short_new_tokens",
    "solo_ttft_s",
    "solo_tpot_s",
    "solo_server_steps",
    "solo_steps_predicted",
    "step_counter",
    "steps_to_first_token",
    "engine_steps",
    "short_tokens_before",
    "new_tokens",
    "running_max",
    "waiting_max",
    "kv_usage_max",
    "preemptions",
    "kv_blocks",
    "usable_blocks",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "sequence_tokens",
    "blocks_per_sequence",
    "fit_sequences",
    "predicted_running_max",
    "predicted_preemption",
    "predicted_waiting",
    "predicted_kv_usage_max",
    "predicted_kv_tokens",
    "predicted_max_concurrency",
    "stated_kv_tokens",
    "stated_for_tokens",
    "stated_max_concurrency",
    "space_blocks",
    "override_blocks",
    "throughput_gain",
    "latency_growth",
    "is_knee",
    "prefix_caching",
    "perfect_hit_rate",
    "cache_block_tokens",
    "hit_rate",
    "prefix_cache_queries",
    "cached_above_bound",
    "same_output",
    "ttft_max_s",
)
# lab 10's speedup table (lablib.studies.decoding.speculative.speedup_table; with SPECULATIVE's labels): the same
# engine's medians without speculation (TPOT, e2e, s), measured speedups (plain / speculative), the tokens per pass and speedup Leviathan et al.
# 2023 predict from alpha, k and c, and measured over predicted; acceptance by position in the draft
# (position_table: position 0.., drafts that reached it, the share of them accepted there)
SPECULATIVE_TABLES = (
    "plain_tpot_s",
    "plain_e2e_s",
    "tpot_speedup",
    "e2e_speedup",
    "predicted_tokens_per_pass",
    "predicted_speedup",
    "speedup_ratio",
    "position",
    "drafts_at_position",
    "accepted_share",
)
# lablib.studies.decoding.structured.structured_table, one row per engine x schema: compile seconds of the first
# constrained request and of a cached one, medians of TTFT and TPOT (seconds) without and with the constraint and
# their ratio (with / without), and the share of outputs that validate (0..1) without and with it (and requests,
# SUMMARY's)
STRUCTURED_TABLE = (
    "compile_first_s",
    "compile_cached_s",
    "ttft_free_s",
    "ttft_constrained_s",
    "tpot_free_s",
    "tpot_constrained_s",
    "tpot_ratio",
    "valid_free",
    "valid_constrained",
)
# lablib.studies.adapters' tables (lab 11): cost_table, one row per engine x rank x arm: TPOT over the same engine's
# without an adapter, whether the output moved, whether merged equals unmerged; multi_table, one row per server x
# clients x adapter mix: output tokens per second of the run and over the same shape without adapters, an
# adapter's first and second request's TTFT (s)
ADAPTER_TABLES = (
    "tpot_vs_none",
    "changed",
    "same_as_unmerged",
    "tput_vs_none",
    "ttft_first_s",
    "ttft_second_s",
    "model_parameters",
    "parameter_share",
    "bytes_f32",
    "bytes_f16",
    "flops_share",
)
# lablib.studies.first_requests.first_request_table (lab 01), one row per engine x load: the first request's TTFT and
# TPOT (s), the median of the later requests' (s), and the first over that median
FIRST_REQUEST_TABLE = (
    "first_ttft_s",
    "steady_ttft_s",
    "first_over_steady_ttft",
    "first_tpot_s",
    "steady_tpot_s",
    "first_over_steady_tpot",
)
# the columns of tables that no row carries (a summary's output_tokens is the run's sum of the rows' own)
TABLE_COLUMNS = tuple(
    c
    for c in SUMMARY
    + BATCH_SWEEP
    + ANCHOR
    + PREFIX_MEMORY
    + SERVER
    + TELEMETRY
    + REPLAY_SUMMARY
    + SCHEDULER_TABLES
    + SPECULATIVE_TABLES
    + STRUCTURED_TABLE
    + ADAPTER_TABLES
    + FIRST_REQUEST_TABLE
    + REFERENCE
    if c not in COLUMNS
)
# what lablib.results.tables.need accepts: a column of a result row or of a table
KNOWN = frozenset(COLUMNS + TABLE_COLUMNS)


def flatten_manifest(manifest: dict) -> dict:
    """The manifest's fields as row columns (:data:`MANIFEST_FIELDS`: a path of keys, None for the
    top level); a key the manifest lacks is None, a dict becomes JSON text (sorted keys). The GPU's
    (:data:`GPU_MANIFEST_FIELDS`) only where the manifest has a ``hardware.gpu`` record."""
    import json

    out = {}
    fields = dict(MANIFEST_FIELDS)
    if (manifest.get("hardware") or {}).get("gpu"):
        fields.update(GPU_MANIFEST_FIELDS)
    for col, (section, *keys) in fields.items():
        value = manifest if section is None else manifest.get(section, {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        out[col] = json.dumps(value, sort_keys=True, default=str) if isinstance(value, dict) else value
    return out
