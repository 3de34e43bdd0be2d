# Solution · lab 00 · TTFT or TPOT: which differs most between llama.cpp and transformers?
#
# The same chat prompt ("What is the capital of France?", 37 prompt tokens
# with the chat template) through both engines, 32 output tokens, one warm-up and 3 measured
# requests each, as `lablib run --engine ... --max-new-tokens 32` does once.
#
# Answer: TPOT differs most. With a short prompt, TTFT is one short prefill
# pass, and both engines get through it in about a tenth of a second (float32
# matrix products in PyTorch keep up with llama.cpp's 4-bit kernels there).
# TPOT is a decode step: one pass over *all* the weights for one token, so it
# is set by the bytes read per step. llama.cpp reads the 4-bit Q4_1 file
# (about 0.1 GB), transformers the float32 weights (about 0.54 GB), and
# `transformers.generate` adds Python overhead at every step on a model this
# small. Expect transformers' TPOT to be several times llama.cpp's, while the
# TTFTs are within a factor of about two of each other (on a short prompt,
# either engine may have the lower TTFT).
#
# What it printed on the 2-core machine the lab was written on (times wander
# from run to run; the ratios are what to compare):
#                   prompt_tokens  ttft_s  tpot_s  decode_tps
#     llama.cpp                37  0.0870  0.0056    179.6609
#     transformers             37  0.0928  0.0385     25.9879
#     TTFT transformers / llama.cpp: 1.07x
#     TPOT transformers / llama.cpp: 6.91x
#     differs most: TPOT (decode)
# Other runs there gave TTFT 0.9-1.0x and TPOT 6.2-6.9x. Measure on a quiet
# machine: with other programs busy on both cores, llama.cpp suffers most
# (its threads wait for each other at every step). Runs under load there gave
# llama.cpp a TPOT of 32 ms, and once 3.4 s, instead of 6 ms: llama.cpp then
# looks slower than transformers, and the comparison means nothing.
import lablib
from lablib.measure import sweep

model = lablib.prepare()
df = sweep.side_by_side(model, engines=("llama.cpp", "transformers"), max_new_tokens=32, reps=3)
table = df.groupby("engine", sort=False)[["prompt_tokens", "ttft_s", "tpot_s", "decode_tps"]].median()
table["prompt_tokens"] = table["prompt_tokens"].astype(int)
print(table.round(4).to_string())

ratio = table.loc["transformers"] / table.loc["llama.cpp"]
print(f"\nTTFT transformers / llama.cpp: {ratio['ttft_s']:.2f}x")
print(f"TPOT transformers / llama.cpp: {ratio['tpot_s']:.2f}x")
# "differs" either way: a ratio of 0.5 is as far apart as 2
factor = {name: max(r, 1 / r) for name, r in ratio[["ttft_s", "tpot_s"]].items()}
print("differs most:", "TPOT (decode)" if factor["tpot_s"] > factor["ttft_s"] else "TTFT (prefill)")
