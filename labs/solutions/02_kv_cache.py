# Solution · lab 02 · how much should TPOT rise with the prompt? The KV cache's share.
#
# Each decode step reads all the weights *and* the KV cache of every earlier
# token. From the model's config, one token's KV cache is
#     layers x 2 (K and V) x kv_heads x head_dim x bytes per value
#   = 30 x 2 x 3 x 64 values = 11,520 values per token for SmolLM2-135M:
#     46 KB in float32 (transformers), 23 KB in float16 (llama.cpp's default
#     cache type; lablib.engines.memory counts it the same way).
# If decode were *only* bytes, TPOT would grow like the bytes read per step:
#     TPOT(long) / TPOT(short) ≈ (weights + KV(long)) / (weights + KV(short)).
# At 1024 tokens the cache is ~47 MB (float32) against ~540 MB of float32
# weights (+8%), and ~24 MB (float16) against the ~0.1 GB GGUF (+20% or so).
# So the prediction is a gentle rise, relatively larger for llama.cpp, whose
# weights are small, than for transformers.
#
# The measured rise is usually *larger* than this byte count: attention also
# does arithmetic over every cached position (a dot product and a softmax per
# head and layer), and a 135M model has so few weights that this work is not
# negligible. The byte count is a floor, not the whole story; with a big model
# (GBs of weights) the weights dominate even more, until the context reaches
# tens of thousands of tokens, where the KV cache overtakes them.
#
# What it printed on the 2-core machine the lab was written on (times wander
# from run to run, and another busy program on the cores distorts them;
# compare the ratios):
#     {'layers': 30, 'kv_heads': 3, 'head_dim': 64}: 11520 cached values per token
#     transformers: weights 538 MB, KV at 1024 tokens 47 MB | TPOT 39.4 -> 44.0 ms |
#                   rise predicted from bytes x1.08, measured x1.12
#        llama.cpp: weights 98 MB, KV at 1024 tokens 24 MB | TPOT 5.9 -> 8.4 ms |
#                   rise predicted from bytes x1.22, measured x1.41
# A second run measured x1.11 (transformers) and x1.57 (llama.cpp). Both rose
# more than the bytes alone predict, and llama.cpp rose more than
# transformers, as predicted. Expect the same order on your machine; the
# exact factors move by several percent from run to run, more when another
# program is busy on the cores.
import lablib
from lablib.engines import ENGINES
from lablib.engines.memory import kv_cache_bytes, weights_bytes
from lablib.measure import sweep
from lablib.model.shape import model_shape

SHORT, LONG = 64, 1024
engines = ["transformers", "llama.cpp"]
model = lablib.prepare()
shape = model_shape(model)  # layers, kv_heads, head_dim from the model's config.json
print(f"{shape}: {2 * shape['layers'] * shape['kv_heads'] * shape['head_dim']} cached values per token")

df = sweep.context_sweep(model, engines=engines, prompt_tokens=[SHORT, LONG], max_new_tokens=32, reps=3)
tpot = df.groupby(["engine", "prompt_tokens"])["tpot_s"].median()

for engine in engines:
    cls = ENGINES[engine]  # the engine's facts: format read, KV bytes per value
    weights = weights_bytes(model, cls)  # the file each step reads: GGUF, or float32 safetensors
    kv_short, kv_long = kv_cache_bytes(model, cls, SHORT), kv_cache_bytes(model, cls, LONG)
    predicted = (weights + kv_long) / (weights + kv_short)
    measured = tpot[engine, LONG] / tpot[engine, SHORT]
    print(
        f"{engine:>12}: weights {weights / 1e6:.0f} MB, KV at {LONG} tokens {kv_long / 1e6:.0f} MB | "
        f"TPOT {tpot[engine, SHORT] * 1e3:.1f} -> {tpot[engine, LONG] * 1e3:.1f} ms | "
        f"rise predicted from bytes x{predicted:.2f}, measured x{measured:.2f}"
    )
