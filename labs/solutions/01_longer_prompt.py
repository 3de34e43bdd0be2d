# Solution · lab 01 · a longer prompt: which bar grows, prefill or decode?
#
# The chat prompt (37 tokens) against 512 tokens of the lab's prose,
# same engines, same number of output tokens. MLX is left out on Linux, where
# its CPU backend needs about half a minute per 512-token prefill; on a Mac
# (Apple silicon, Metal) it is included.
#
# Answer: prefill grows, decode barely moves.
# * Prefill processes every prompt token in one pass of matrix products
#   (compute-bound), so its time grows with the prompt: roughly in proportion
#   (14x the tokens, several times to about 14x the time; short prompts use
#   the cores badly, so the first tokens are relatively expensive and the
#   growth is less than proportional).
# * Decode makes one token per step, and each step reads all the weights
#   (memory-bandwidth-bound). The weights are the same whatever the prompt;
#   only the KV cache grew (about 46 KB per token in float32 for this model,
#   so ~24 MB at 512 tokens against ~540 MB of float32 weights), and each
#   step's attention looks at 512 earlier tokens instead of 37. TPOT rises by
#   a few to a few tens of percent, not 14-fold.
#
# What it printed on the 2-core machine the lab was written on (times wander
# from run to run; compare the growth factors):
#     transformers: prompt 37 -> 512 tokens | prefill 85 -> 768 ms (x9.1) | decode 582 -> 601 ms (x1.03)
#        llama.cpp: prompt 37 -> 512 tokens | prefill 82 -> 1119 ms (x13.6) | decode 90 -> 107 ms (x1.19)
# Prefill grew about 9-14x for 14x the tokens; decode (16 output tokens in
# quick mode, 64 otherwise) grew by 3-25% (a second run: x8.6 and x13.7 for
# prefill, x1.03 and x1.24 for decode). Another busy program on the cores
# can make any single number jump: rerun before reading much into it.
import platform

import lablib
from lablib import plots
from lablib.measure import sweep
from lablib.measure.workload import chat_ids, prompt_of_length

engines = ("transformers", "llama.cpp") + (("mlx",) if platform.system() == "Darwin" else ())
model = lablib.prepare()
short_ids = chat_ids(model, [{"role": "user", "content": "What is the capital of France?"}])
long_ids = prompt_of_length(model, 512)

short = sweep.side_by_side(model, engines=engines, ids=short_ids)
long = sweep.side_by_side(model, engines=engines, ids=long_ids)

cols = ["prompt_tokens", "prefill_s", "decode_s", "tpot_s"]
sm = short.groupby("engine", sort=False)[cols].median()
lm = long.groupby("engine", sort=False)[cols].median()
for engine in sm.index:
    print(
        f"{engine:>12}: prompt {sm.prompt_tokens[engine]:.0f} -> {lm.prompt_tokens[engine]:.0f} tokens | "
        f"prefill {sm.prefill_s[engine] * 1e3:.0f} -> {lm.prefill_s[engine] * 1e3:.0f} ms "
        f"(x{lm.prefill_s[engine] / sm.prefill_s[engine]:.1f}) | "
        f"decode {sm.decode_s[engine] * 1e3:.0f} -> {lm.decode_s[engine] * 1e3:.0f} ms "
        f"(x{lm.decode_s[engine] / sm.decode_s[engine]:.2f})"
    )

plots.prefill_decode_bars(long)  # in a notebook: the bars of the long prompt
