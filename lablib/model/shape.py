"""The model's shape, and what it costs per token: the package's one reader of a model's dimensions.

:func:`model_dims` gives {layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied,
mlp_matrices} of a prepared model (its HF or MLX config.json, read by
:func:`lablib.model.formats.read_config`), of a published model (:data:`PRESETS`) or of a dict;
:func:`model_shape` the figures that size a KV cache and the logits. From the shape: weights in
matrix products, parameters, FLOPs of a decoded token and of a prefill, and KV cache bytes per token
(the one formula: :mod:`lablib.engines.memory`'s estimates and :mod:`lablib.studies.roofline`'s
bytes both use it).

Counting, per token, for a decoder of ``layers`` blocks (hidden size d, ``heads`` query heads and
``kv_heads`` key/value heads of size ``head_dim``, MLP width ``intermediate``, vocabulary V):
- weights: 2 FLOP (multiply, add) per weight of every matrix product: q, k, v, o projections, the MLP
  (3 matrices when gated, as in Llama; 2 in GPT-2) and the LM head (d x V; tied or not). The input
  embedding is a lookup, no FLOPs (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
  table 1: C_forward ~ 2 N).
- attention at context depth L (the token attends L positions, itself included): scores q.k and the
  weighted sum of v, each 2 x heads x head_dim x L per layer, so 4 x layers x heads x head_dim x L
  (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", appendix F). Softmax,
  norms and activations are left out (a few % at most).
- prefill of P prompt tokens: the weights' FLOPs for each token; the causal attention of token i
  covers i positions (P(P+1)/2 in all); the LM head runs for the last token only (what llama.cpp and
  ``generate`` do).
- KV cache: 2 (K and V) x kv_heads x head_dim x bytes per element, per token and layer. A full-attention
  layer keeps every position; a sliding-window layer (Gemma 2 and 3, Mistral 7B v0.1, GPT-OSS...: ``layer_types``
  and ``sliding_window`` below) attends, and needs to keep, only its last ``sliding_window`` positions
  (Beltagy et al. 2020, "Longformer"; Jiang et al. 2023, "Mistral 7B"): :func:`kv_cache_bytes` at a context,
  :func:`attended_positions` for the attention FLOPs. What an engine *allocates* may differ (a full-size cache
  for every layer, a paged cache's blocks): each engine says so (``Engine.kv_cache_bytes``).

Besides the figures of :data:`DIMS`, every dims dict has ``layer_types`` (one "full" or "sliding" per layer,
:func:`lablib.model.formats.config_layer_types`) and ``sliding_window`` (tokens; 0: none).
"""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.model.formats import config_layer_types, gguf_config, gguf_layer_types, read_config

DIMS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied", "mlp_matrices")

# Shapes of published models, from each one's config.json on the Hugging Face hub (for what-if), in the
# order of DIMS.
_PUBLISHED = {
    "SmolLM2-135M": (30, 576, 9, 3, 64, 1536, 49152, True, 3),
    "SmolLM2-360M": (32, 960, 15, 5, 64, 2560, 49152, True, 3),
    "SmolLM2-1.7B": (24, 2048, 32, 32, 64, 8192, 49152, True, 3),
    "Llama-3.1-8B": (32, 4096, 32, 8, 128, 14336, 128256, False, 3),
    "Llama-3.1-70B": (80, 8192, 64, 8, 128, 28672, 128256, False, 3),
    "Gemma-3-270M": (18, 640, 4, 1, 256, 2048, 262144, True, 3),
    "Gemma-3-1B": (26, 1152, 4, 1, 256, 6912, 262144, True, 3),
}
# (layer_types, sliding_window) of the presets whose layers differ: Gemma 3's five sliding layers of 512
# tokens before each full one (config.json's layer_types, sliding_window)
_LAYERS = {
    "Gemma-3-270M": (tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(18)), 512),
    "Gemma-3-1B": (tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(26)), 512),
}
PRESETS = {
    name: {
        **dict(zip(DIMS, figures)),
        "layer_types": _LAYERS.get(name, (("full",) * figures[0], 0))[0],
        "sliding_window": _LAYERS.get(name, ((), 0))[1],
    }
    for name, figures in _PUBLISHED.items()
}


def model_dims(model) -> dict:
    """{layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied, mlp_matrices, layer_types,
    sliding_window} of ``model``: a ResolvedModel (its HF or MLX config.json: Llama-style names, or GPT-2-style
    n_layer / n_head / n_embd; ``text_config`` for multimodal models; a model with only a GGUF file: its
    header), a name of :data:`PRESETS`, or such a dict (returned checked; every layer full attention unless it
    says ``layer_types``). ``vocab`` is 0 when the config does not say. Raises LabError when a figure is
    missing."""
    if isinstance(model, str):
        if model not in PRESETS:
            raise LabError(
                f"model {model!r}: not a preset; expected one of {', '.join(PRESETS)}, a dict of "
                "the shape, or a prepared model (lablib.prepare())"
            )
        return dict(PRESETS[model])
    if isinstance(model, dict):
        need = DIMS[:7]
        bad = [k for k in need if not isinstance(model.get(k), int) or model[k] < 1]
        if bad:
            raise LabError(
                f"model shape {model}: {', '.join(bad)} missing or not a positive whole number; "
                f"expected {', '.join(need)} (and tied, mlp_matrices)"
            )
        out = {"tied": True, "mlp_matrices": 3, "sliding_window": 0, **model}
        out.setdefault("layer_types", ("full",) * out["layers"])
        return _check_layers(out, f"model shape {model}")
    return _config_dims(model)


def _check_layers(d: dict, where: str) -> dict:
    from lablib.model.formats import ATTENTION_KINDS

    given, window = d["layer_types"], d.get("sliding_window") or 0
    if isinstance(given, str) or not hasattr(given, "__iter__") or not isinstance(window, int):
        raise LabError(
            f"{where}: layer_types={given!r}, sliding_window={window!r}; expected a list of 'full' or 'sliding', one "
            "per layer, and a window in whole tokens"
        )
    types = tuple(ATTENTION_KINDS.get(t, t) for t in given)  # transformers' names too ("sliding_attention")
    if len(types) != d["layers"] or ("sliding" in types and not window > 0):
        raise LabError(
            f"{where}: layer_types names {len(types)} layers for {d['layers']} layers, or sliding layers without a "
            "sliding_window; expected one 'full' or 'sliding' per layer and a window of at least 1 token"
        )
    d["layer_types"] = types
    return d


def _config_dims(model) -> dict:
    """:func:`model_dims` of a ResolvedModel, from its config.json."""
    folder = model.hf_path or model.mlx_path
    if not folder and getattr(model, "gguf_path", None):
        return _gguf_dims(model.gguf_path)
    if not folder:
        raise LabError(f"{model.source}: no config.json to read the model's shape from; run `lablib prepare`")
    full_cfg = read_config(folder)
    cfg = full_cfg.get("text_config") or full_cfg

    def first(*keys):
        for k in keys:
            if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool):
                return cfg[k]
        return None

    heads = first("num_attention_heads", "n_head", "num_heads")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    hidden = first("hidden_size", "n_embd", "d_model")
    if not heads or not layers or not (hidden or first("head_dim")):
        raise LabError(
            f"{Path(folder) / 'config.json'}: cannot tell the model's layers, attention heads and "
            "hidden size (num_hidden_layers/n_layer, num_attention_heads/n_head, hidden_size/n_embd); "
            "expected a transformer decoder's config"
        )
    head_dim = first("head_dim") or hidden // heads
    hidden = hidden or heads * head_dim
    gated = cfg.get("intermediate_size") is not None  # Llama's gated MLP names its width; GPT-2's does not
    types = config_layer_types(full_cfg)
    return _check_layers(
        {
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "kv_heads": first("num_key_value_heads") or heads,
            "head_dim": head_dim,
            "intermediate": cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden,
            "vocab": first("vocab_size") or 0,
            "tied": bool(cfg.get("tie_word_embeddings", False)),
            "mlp_matrices": 3 if gated else 2,
            "layer_types": types if len(types) == layers else ("full",) * layers,
            "sliding_window": (first("sliding_window") or 0) if "sliding" in types else 0,
        },
        str(Path(folder) / "config.json"),
    )


def _gguf_dims(path) -> dict:
    """:func:`model_dims` of a GGUF file alone (its header, as llama.cpp reads it)."""
    from lablib.model.formats import _header_val

    c = gguf_config(path)
    _, val = _header_val(path)
    arch = val("general.architecture", "")
    need = {k: c[k] for k in ("n_layers", "n_heads", "head_dim")}
    if not all(need.values()):
        raise LabError(f"{path}: its header does not state {', '.join(k for k, v in need.items() if not v)}")
    return _check_layers(
        {
            "layers": c["n_layers"],
            "hidden": val(f"{arch}.embedding_length") or c["n_heads"] * c["head_dim"],
            "heads": c["n_heads"],
            "kv_heads": c["n_kv_heads"] or c["n_heads"],
            "head_dim": c["head_dim"],
            "intermediate": val(f"{arch}.feed_forward_length") or 4 * (val(f"{arch}.embedding_length") or 0),
            "vocab": c["vocab_size"] or 0,
            "tied": c["tie_word_embeddings"],
            "mlp_matrices": 3,
            "layer_types": gguf_layer_types(path),
            "sliding_window": c["sliding_window"],
        },
        str(path),
    )


def model_shape(model) -> dict:
    """{layers, kv_heads, head_dim, vocab} of ``model`` (:func:`model_dims`): what sizes its KV cache
    (:func:`kv_bytes_per_token`) and its logits (vocab x 4 bytes a position)."""
    d = model_dims(model)
    return {k: d[k] for k in ("layers", "kv_heads", "head_dim", "vocab")}


def matmul_weights(dims: dict) -> dict:
    """Weights in matrix products, by part: {attention, mlp, lm_head, total} (counts, not bytes).

    Per layer: q (d x heads*head_dim), k and v (d x kv_heads*head_dim each), o (heads*head_dim x d),
    MLP (mlp_matrices x d x intermediate); the LM head d x vocab."""
    d, q = dims["hidden"], dims["heads"] * dims["head_dim"]
    kv = dims["kv_heads"] * dims["head_dim"]
    attn = dims["layers"] * (2 * d * q + 2 * d * kv)
    mlp = dims["layers"] * dims["mlp_matrices"] * d * dims["intermediate"]
    head = d * dims["vocab"]
    return {"attention": attn, "mlp": mlp, "lm_head": head, "total": attn + mlp + head}


def parameters(dims: dict) -> int:
    """All weights: matrix products, the input embedding when untied, and the RMSNorm weights
    (2 per layer and a final one, d each; biases are left out)."""
    d = dims["hidden"]
    return matmul_weights(dims)["total"] + (0 if dims["tied"] else dims["vocab"] * d) + (2 * dims["layers"] + 1) * d


def attention_flops_per_position(dims: dict) -> int:
    """FLOPs one token spends per attended position, all layers attending it: 4 x layers x heads x head_dim (q.k
    and the sum of v). A sliding-window layer attends fewer positions: :func:`attended_positions`."""
    return 4 * dims["layers"] * dims["heads"] * dims["head_dim"]


def _attention_flops_per_layer_position(dims: dict) -> int:
    return 4 * dims["heads"] * dims["head_dim"]


def _layer_types(dims: dict) -> tuple:
    return tuple(dims.get("layer_types") or ("full",) * dims["layers"])


def attended_positions(dims: dict, context: int) -> int:
    """Positions one token at depth ``context`` attends, summed over the layers: ``context`` in a
    full-attention layer, at most ``sliding_window`` in a sliding one."""
    window = dims.get("sliding_window") or 0
    return sum(min(context, window) if t == "sliding" and window else context for t in _layer_types(dims))


def flops_per_token(dims: dict, context: int) -> dict:
    """FLOPs of one decoded token attending ``context`` positions (a sliding layer at most its window):
    {weights, attention, total}."""
    w = 2 * matmul_weights(dims)["total"]
    a = _attention_flops_per_layer_position(dims) * attended_positions(dims, context)
    return {"weights": w, "attention": a, "total": w + a}


def prefill_flops(dims: dict, prompt_tokens: int) -> dict:
    """FLOPs of a prefill of ``prompt_tokens`` tokens (causal: token i attends i positions, at most the
    window in a sliding layer; LM head for the last token only): {weights, attention, total}."""
    m = matmul_weights(dims)
    p = prompt_tokens
    w = 2 * (m["total"] - m["lm_head"]) * p + 2 * m["lm_head"]
    window = dims.get("sliding_window") or 0
    full = p * (p + 1) // 2
    slid = full if p <= window else window * (window + 1) // 2 + (p - window) * window
    positions = sum(slid if t == "sliding" and window else full for t in _layer_types(dims))
    a = _attention_flops_per_layer_position(dims) * positions
    return {"weights": w, "attention": a, "total": w + a}


def kv_bytes_per_token(dims: dict, bytes_per_element: float) -> float:
    """KV cache bytes one token writes: 2 (K and V) x layers x kv_heads x head_dim x bytes per element
    (grouped-query attention counted by its KV heads: Pope et al., "Efficiently Scaling Transformer
    Inference", 2022). Kept at a context, a sliding layer holds at most its window: :func:`kv_cache_bytes`."""
    return 2 * dims["layers"] * dims["kv_heads"] * dims["head_dim"] * bytes_per_element


def kv_cache_bytes(
    dims: dict,
    bytes_per_element: float,
    context: int,
    sequences: int = 1,
    sliding_tokens: int | None = None,
    full_tokens: int | None = None,
) -> int:
    """KV cache bytes of ``sequences`` sequences of ``context`` tokens each: a full-attention layer keeps
    ``context`` positions (or ``full_tokens``: what an engine allocates, e.g. padded), a sliding one
    ``min(context, sliding_tokens)`` (default: the window, what the model needs; an engine passes what it keeps,
    e.g. transformers' window - 1). 2 x kv_heads x head_dim x bytes per element per position and layer."""
    per_layer_position = 2 * dims["kv_heads"] * dims["head_dim"] * bytes_per_element
    window = dims.get("sliding_window") or 0
    keep = window if sliding_tokens is None else sliding_tokens
    full = context if full_tokens is None else full_tokens
    positions = sum(min(context, keep) if t == "sliding" and window else full for t in _layer_types(dims))
    return int(per_layer_position * positions * sequences)
