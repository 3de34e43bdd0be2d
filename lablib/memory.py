"""Will it fit? Weights plus KV cache against the RAM available now.

KV cache per token = 2 (K and V) x layers x KV heads x head size x bytes per
element (the standard count for grouped-query attention, e.g. Pope et al.,
"Efficiently Scaling Transformer Inference", 2022). Weights: the bytes the
engine reads (GGUF file for llama.cpp, safetensors for transformers and MLX).
An estimate, not a promise: activations and allocator slack come on top,
hence the 20 % headroom.
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import LabError

HEADROOM = 1.2
LLAMA_GRAPH_RESERVE = 32 * 2**20
KV_BYTES = {"llama.cpp": 2, "transformers": 4, "mlx": 4}  # f16 KV in llama.cpp; float32 models elsewhere


def model_shape(model) -> dict:
    """{layers, kv_heads, head_dim, vocab} from the model's HF or MLX config (Llama-style names, or
    GPT-2-style n_layer / n_head / n_embd). Raises LabError when the config does not say."""
    folder = model.hf_path or model.mlx_path
    if not folder:
        raise LabError(f"{model.source}: no config.json to read the model's shape from; run `lablib prepare`")
    cfg = json.loads((Path(folder) / "config.json").read_text())
    cfg = cfg.get("text_config") or cfg

    def first(*keys):
        for k in keys:
            if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool):
                return cfg[k]
        return None

    heads = first("num_attention_heads", "n_head", "num_heads")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    hidden = first("hidden_size", "n_embd", "d_model")
    if not heads or not layers or not (hidden or first("head_dim")):
        raise LabError(f"{Path(folder) / 'config.json'}: cannot tell the model's layers, attention heads and "
                       "hidden size (num_hidden_layers/n_layer, num_attention_heads/n_head, hidden_size/n_embd); "
                       "expected a transformer decoder's config")
    return {"layers": layers, "kv_heads": first("num_key_value_heads") or heads,
            "head_dim": first("head_dim") or hidden // heads, "vocab": first("vocab_size") or 0}


def weights_bytes(model, engine: str) -> int:
    """Bytes of weights the engine loads."""
    if engine == "llama.cpp" and model.gguf_path:
        return Path(model.gguf_path).stat().st_size
    folder = model.hf_path if engine == "transformers" else model.mlx_path
    if not folder:
        return model.parameters * 4
    files = list(Path(folder).glob("*.safetensors")) or list(Path(folder).glob("pytorch_model*.bin"))
    return sum(p.stat().st_size for p in files)


def kv_cache_bytes(model, engine: str, tokens: int) -> int:
    """KV cache bytes for ``tokens`` tokens (all sequences together)."""
    s = model_shape(model)
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * KV_BYTES.get(engine, 4) * tokens


def runtime_bytes(model, engine: str, n_batch: int = 512) -> int:
    """Buffers an engine allocates besides weights and KV cache, bytes.

    llama.cpp reserves logits for a whole micro-batch (n_batch x vocabulary x 4 bytes; llama.cpp
    caps n_batch at n_ctx) plus its compute graph (LLAMA_GRAPH_RESERVE, about 32 MiB for small
    models): 128 MiB for SmolLM2-135M at n_batch 512. transformers and MLX allocate activations
    per request, covered by the headroom.
    """
    if engine != "llama.cpp":
        return 0
    return n_batch * model_shape(model)["vocab"] * 4 + LLAMA_GRAPH_RESERVE


def _effective_batch(engine: str, context_tokens: int, n_batch: int) -> int:
    """llama.cpp caps its batch at the context it was given."""
    return min(n_batch, context_tokens) if engine == "llama.cpp" and context_tokens else n_batch


def estimate_bytes(model, engine: str, context_tokens: int, concurrency: int = 1, n_batch: int = 512) -> dict:
    """{weights, kv_cache, runtime, total} in bytes for ``concurrency`` sequences of ``context_tokens``."""
    w = weights_bytes(model, engine)
    kv = kv_cache_bytes(model, engine, context_tokens * concurrency)
    rt = runtime_bytes(model, engine, _effective_batch(engine, context_tokens, n_batch))
    return {"weights": w, "kv_cache": kv, "runtime": rt, "total": int((w + kv + rt) * HEADROOM)}


def check_fits(model, engines, context_tokens: int, concurrency: int = 1, available: int | None = None,
               n_batch: int = 512) -> None:
    """Raise LabError with the numbers when the largest run will not fit in available memory
    (RAM, or a container's cgroup cap: :func:`lablib.hardware.available_ram_bytes`).

    Engines are loaded one at a time, so the largest single engine counts.
    """
    from .hardware import available_ram_bytes

    available = available_ram_bytes() if available is None else available
    for engine in engines:
        est = estimate_bytes(model, engine, context_tokens, concurrency, n_batch)
        if est["total"] > available:
            gib = 2 ** 30
            parts = [f"weights {est['weights'] / gib:.2f} GiB"]
            if context_tokens:
                parts.append(f"KV cache {est['kv_cache'] / gib:.2f} GiB for {concurrency} x {context_tokens} tokens")
            if est["runtime"]:
                parts.append(f"buffers {est['runtime'] / gib:.2f} GiB")
            if not context_tokens:
                advice = "close other engines and programs, or use a smaller/quantized model"
            elif engine == "llama.cpp":
                advice = ("use a smaller context (--n-ctx / n_ctx: llama.cpp reserves its KV cache for all of "
                          "it), lower concurrency, or a smaller/quantized model")
            else:
                advice = "use shorter contexts, lower concurrency, or a smaller/quantized model"
            raise LabError(
                f"memory: {engine} needs about {est['total'] / gib:.2f} GiB ({' + '.join(parts)}, +20 % "
                f"headroom), but {available / gib:.2f} GiB is available. To fit: {advice}.")


# --- compare: every engine loaded at once, logits streamed -------------------------------------------
LOGIT_FLOAT64_ARRAYS = 10  # float64 [chunk, vocab] arrays alive at once in compare.logit_stats (measured peak)


def compare_bytes(model, engines, tokens: int, chunk: int = 64, loaded=()) -> dict:
    """{weights, kv_cache, logits, total} bytes for :func:`lablib.compare.compare` of ``tokens``
    tokens (prompt + output) on ``engines``, all held at once; engines named in ``loaded`` are in
    memory already and their weights (and llama.cpp's KV cache, reserved at load) do not count.

    Logits are streamed ``chunk`` positions at a time: per engine a float32 block [chunk, vocab]
    (the engine's output and the lab's copy), plus the float64 arrays of the statistics; they
    never grow with ``tokens``.
    """
    from .engines import llama_default_n_ctx

    vocab = model_shape(model)["vocab"] or 0
    weights = kv = 0
    for e in engines:
        if e == "llama.cpp":
            if e not in loaded:
                n_ctx = llama_default_n_ctx(model)
                weights += (weights_bytes(model, e) + kv_cache_bytes(model, e, n_ctx)
                            + runtime_bytes(model, e, _effective_batch(e, n_ctx, 512)))
        else:
            weights += 0 if e in loaded else weights_bytes(model, e)
            kv += kv_cache_bytes(model, e, tokens)
    logits = len(engines) * 2 * chunk * vocab * 4 + LOGIT_FLOAT64_ARRAYS * chunk * vocab * 8
    return {"weights": weights, "kv_cache": kv, "logits": logits,
            "total": int((weights + kv + logits) * HEADROOM)}


def check_compare_fits(model, engines, tokens: int, chunk: int = 64, loaded=(), available: int | None = None) -> None:
    """Raise LabError with the numbers when a comparison of ``tokens`` tokens on ``engines`` (all
    held at once) will not fit in the memory available now (:func:`compare_bytes`)."""
    from .hardware import available_ram_bytes

    available = available_ram_bytes() if available is None else available
    est = compare_bytes(model, engines, tokens, chunk, loaded)
    if est["total"] > available:
        mib = 2 ** 20
        raise LabError(
            f"memory: comparing {', '.join(engines)} on {tokens} tokens needs about {est['total'] / mib:.0f} MiB "
            f"(weights not yet loaded {est['weights'] / mib:.0f} MiB + KV caches {est['kv_cache'] / mib:.0f} MiB + "
            f"logit blocks of {chunk} positions {est['logits'] / mib:.0f} MiB, +20 % headroom), but "
            f"{available / mib:.0f} MiB is available. To fit: compare fewer engines at a time (engines=[...]), "
            f"use a shorter prompt, or close other engines and programs.")
