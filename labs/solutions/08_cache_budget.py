# Solution · lab 08 · how many conversations fit in 8 GB of prefix cache?
#
# KV bytes per token = 2 x layers x KV heads x head size x bytes per value.
# SmolLM2-135M (30 layers, 3 KV heads of 64) in float16: 23,040 bytes a token,
# 46 MB per 2,000-token conversation: about 170 conversations in 8 GB.
# Llama-3.1-8B (32 layers, 8 KV heads of 128) in float16: 131,072 bytes a
# token, 262 MB per conversation: about 30. With an 8-bit KV cache (llama.cpp's
# --cache-type-k/v q8_0, vLLM's kv_cache_dtype fp8) the bytes halve and twice
# as many fit. Grouped-query attention is what keeps these numbers sane: with
# one KV head per query head (32) Llama-3.1-8B would keep 4 x as much.
from lablib.model import shape

BUDGET, TOKENS = 8e9, 2000
for name, bytes_per_value, label in (
    ("SmolLM2-135M", 2, "float16"),
    ("Llama-3.1-8B", 2, "float16"),
    ("Llama-3.1-8B", 1, "8-bit"),
):
    per_token = shape.kv_bytes_per_token(shape.model_dims(name), bytes_per_value)
    per_conv = per_token * TOKENS
    print(
        f"{name:>13} {label:>7}: {per_token:>9,.0f} bytes a token, {per_conv / 1e6:6.0f} MB a conversation, "
        f"{int(BUDGET // per_conv):>4} conversations in 8 GB"
    )
