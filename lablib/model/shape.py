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
- KV cache: 2 (K and V) x layers x kv_heads x head_dim x bytes per element, per token.
"""

from __future__ import annotations

from pathlib import Path

from lablib.errors import LabError
from lablib.model.formats import read_config

DIMS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied", "mlp_matrices")

# Shapes of published models, from each one's config.json on the Hugging Face hub (for what-if), in the
# order of DIMS.
_PUBLISHED = {
    "SmolLM2-135M": (30, 576, 9, 3, 64, 1536, 49152, True, 3),
    "SmolLM2-360M": (32, 960, 15, 5, 64, 2560, 49152, True, 3),
    "SmolLM2-1.7B": (24, 2048, 32, 32, 64, 8192, 49152, True, 3),
    "Llama-3.1-8B": (32, 4096, 32, 8, 128, 14336, 128256, False, 3),
    "Llama-3.1-70B": (80, 8192, 64, 8, 128, 28672, 128256, False, 3),
}
PRESETS = {name: dict(zip(DIMS, figures)) for name, figures in _PUBLISHED.items()}


def model_dims(model) -> dict:
    """{layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied, mlp_matrices} of ``model``:
    a ResolvedModel (its HF or MLX config.json: Llama-style names, or GPT-2-style n_layer / n_head /
    n_embd; ``text_config`` for multimodal models), a name of :data:`PRESETS`, or such a dict (returned
    checked). ``vocab`` is 0 when the config does not say. Raises LabError when a figure is missing."""
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
        return {"tied": True, "mlp_matrices": 3, **model}
    return _config_dims(model)


def _config_dims(model) -> dict:
    """:func:`model_dims` of a ResolvedModel, from its config.json."""
    folder = model.hf_path or model.mlx_path
    if not folder:
        raise LabError(f"{model.source}: no config.json to read the model's shape from; run `lablib prepare`")
    cfg = read_config(folder)
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
        raise LabError(
            f"{Path(folder) / 'config.json'}: cannot tell the model's layers, attention heads and "
            "hidden size (num_hidden_layers/n_layer, num_attention_heads/n_head, hidden_size/n_embd); "
            "expected a transformer decoder's config"
        )
    head_dim = first("head_dim") or hidden // heads
    hidden = hidden or heads * head_dim
    gated = cfg.get("intermediate_size") is not None  # Llama's gated MLP names its width; GPT-2's does not
    return {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": first("num_key_value_heads") or heads,
        "head_dim": head_dim,
        "intermediate": cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden,
        "vocab": first("vocab_size") or 0,
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "mlp_matrices": 3 if gated else 2,
    }


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
    """FLOPs one token spends per attended position: 4 x layers x heads x head_dim (q.k and the sum of v)."""
    return 4 * dims["layers"] * dims["heads"] * dims["head_dim"]


def flops_per_token(dims: dict, context: int) -> dict:
    """FLOPs of one decoded token attending ``context`` positions: {weights, attention, total}."""
    w = 2 * matmul_weights(dims)["total"]
    a = attention_flops_per_position(dims) * context
    return {"weights": w, "attention": a, "total": w + a}


def prefill_flops(dims: dict, prompt_tokens: int) -> dict:
    """FLOPs of a prefill of ``prompt_tokens`` tokens (causal; LM head for the last token only):
    {weights, attention, total}."""
    m = matmul_weights(dims)
    p = prompt_tokens
    w = 2 * (m["total"] - m["lm_head"]) * p + 2 * m["lm_head"]
    a = attention_flops_per_position(dims) * p * (p + 1) // 2
    return {"weights": w, "attention": a, "total": w + a}


def kv_bytes_per_token(dims: dict, bytes_per_element: float) -> float:
    """KV cache bytes one token keeps: 2 (K and V) x layers x kv_heads x head_dim x bytes per element
    (grouped-query attention counted by its KV heads: Pope et al., "Efficiently Scaling Transformer
    Inference", 2022)."""
    return 2 * dims["layers"] * dims["kv_heads"] * dims["head_dim"] * bytes_per_element
