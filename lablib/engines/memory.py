"""Will it fit? Weights plus KV cache against the RAM available now.

KV cache per token = 2 (K and V) x layers x KV heads x head size x bytes per
element (:func:`lablib.model.shape.kv_bytes_per_token`, the standard count for
grouped-query attention), a sliding-window layer holding at most its window; what each
engine really holds at a context is its own fact (``Engine.kv_cache_bytes``: llama.cpp in
process keeps the whole context for sliding layers too). Weights: the bytes the
engine reads (GGUF file for llama.cpp, safetensors for transformers and MLX).
An estimate, not a promise: activations and allocator slack come on top,
hence the 20 % headroom.

The per-engine facts (bytes per KV element, weights read, buffers allocated at load)
come from the engine classes (:class:`lablib.engines.base.Engine`), handed in by the
caller: ``engine`` below is an Engine subclass, e.g. ``lablib.engines.ENGINES["llama.cpp"]``.
"""

from __future__ import annotations

from lablib.errors import LabError
from lablib.machine.limits import available_ram_bytes
from lablib.model.shape import kv_bytes_per_token, model_dims

HEADROOM = 1.2


def weights_bytes(model, engine) -> int:
    """Bytes of weights ``engine`` (an Engine class) loads for ``model``."""
    return engine.weights_bytes(model)


def kv_cache_bytes(model, engine, tokens: int) -> int:
    """The keys and values of ``tokens`` tokens in every layer, at ``engine``'s (an Engine class) bytes per
    element: 2 x layers x KV heads x head size x bytes x tokens, what a kept prefix of that many tokens holds
    (lablib.studies.prefix). What an engine allocates for a context, a sliding-window layer keeping at most its
    window and llama.cpp padding its cells, is ``Engine.kv_cache_bytes`` (the memory checks below)."""
    return int(kv_bytes_per_token(model_dims(model), engine.kv_bytes_per_value) * tokens)


def estimate_bytes(model, engine, context_tokens: int, concurrency: int = 1, n_batch: int = 512) -> dict:
    """{weights, kv_cache, runtime, total} in bytes for ``concurrency`` sequences of ``context_tokens``
    in ``engine`` (an Engine class); total includes the headroom."""
    w = engine.weights_bytes(model)
    kv = engine.kv_cache_bytes(model, context_tokens, concurrency) if context_tokens else 0
    rt = engine.runtime_bytes(model, n_batch, context_tokens)
    return {"weights": w, "kv_cache": kv, "runtime": rt, "total": int((w + kv + rt) * HEADROOM)}


def check_fits(
    model, engines, context_tokens: int, concurrency: int = 1, available: int | None = None, n_batch: int = 512
) -> None:
    """Raise LabError with the numbers when the largest run will not fit in available memory
    (RAM, or a container's cgroup cap: :func:`lablib.machine.available_ram_bytes`).

    ``engines``: Engine classes. Engines are loaded one at a time, so the largest single engine counts.
    """
    available = available_ram_bytes() if available is None else available
    for engine in engines:
        est = estimate_bytes(model, engine, context_tokens, concurrency, n_batch)
        if est["total"] > available:
            gib = 2**30
            parts = [f"weights {est['weights'] / gib:.2f} GiB"]
            if context_tokens:
                parts.append(f"KV cache {est['kv_cache'] / gib:.2f} GiB for {concurrency} x {context_tokens} tokens")
            if est["runtime"]:
                parts.append(f"buffers {est['runtime'] / gib:.2f} GiB")
            if not context_tokens:
                advice = "close other engines and programs, or use a smaller/quantized model"
            elif engine.reserves_kv_at_load:
                advice = (
                    f"use a smaller context (--n-ctx / n_ctx: {engine.name} reserves its KV cache for all "
                    "of it), lower concurrency, or a smaller/quantized model"
                )
            else:
                advice = "use shorter contexts, lower concurrency, or a smaller/quantized model"
            raise LabError(
                f"memory: {engine.name} needs about {est['total'] / gib:.2f} GiB ({' + '.join(parts)}, +20 % "
                f"headroom), but {available / gib:.2f} GiB is available. To fit: {advice}."
            )


# --- compare: every engine loaded at once, logits streamed -------------------------------------------
LOGIT_FLOAT64_ARRAYS = 10  # float64 [chunk, vocab] arrays alive at once in logits.logit_stats (measured peak)


def compare_bytes(model, engines, tokens: int, chunk: int = 64, loaded=()) -> dict:
    """{weights, kv_cache, logits, total} bytes for :func:`lablib.studies.compare.compare` of ``tokens``
    tokens (prompt + output) on ``engines`` (Engine classes), all held at once; engines whose names
    are in ``loaded`` are in memory already and their weights (and a KV cache reserved at load, as
    llama.cpp's) do not count.

    Logits are streamed ``chunk`` positions at a time: per engine a float32 block [chunk, vocab]
    (the engine's output and the lab's copy), plus the float64 arrays of the statistics; they
    never grow with ``tokens``.
    """
    vocab = model_dims(model)["vocab"] or 0
    weights = kv = 0
    for e in engines:  # Engine classes
        if e.reserves_kv_at_load:  # the KV cache for the whole default context, allocated at load
            if e.name not in loaded:
                n_ctx = e.default_load_kwargs(model).get("n_ctx") or tokens
                weights += weights_bytes(model, e) + e.kv_cache_bytes(model, n_ctx) + e.runtime_bytes(model, 512)
        else:
            weights += 0 if e.name in loaded else weights_bytes(model, e)
            kv += e.kv_cache_bytes(model, tokens) if tokens else 0
    logits = len(engines) * 2 * chunk * vocab * 4 + LOGIT_FLOAT64_ARRAYS * chunk * vocab * 8
    return {"weights": weights, "kv_cache": kv, "logits": logits, "total": int((weights + kv + logits) * HEADROOM)}


def check_compare_fits(model, engines, tokens: int, chunk: int = 64, loaded=(), available: int | None = None) -> None:
    """Raise LabError with the numbers when a comparison of ``tokens`` tokens on ``engines`` (all
    held at once) will not fit in the memory available now (:func:`compare_bytes`)."""
    from lablib.machine.limits import available_ram_bytes

    available = available_ram_bytes() if available is None else available
    est = compare_bytes(model, engines, tokens, chunk, loaded)
    if est["total"] > available:
        mib = 2**20
        raise LabError(
            f"memory: comparing {', '.join(e.name for e in engines)} on {tokens} tokens needs about {est['total'] / mib:.0f} MiB "
            f"(weights not yet loaded {est['weights'] / mib:.0f} MiB + KV caches {est['kv_cache'] / mib:.0f} MiB + "
            f"logit blocks of {chunk} positions {est['logits'] / mib:.0f} MiB, +20 % headroom), but "
            f"{available / mib:.0f} MiB is available. To fit: compare fewer engines at a time (engines=[...]), "
            f"use a shorter prompt, or close other engines and programs."
        )
