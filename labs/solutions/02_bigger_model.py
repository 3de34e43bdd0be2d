# Solution · lab 02 · how fast would a bigger model decode on this machine?
#
# If decode is memory-bandwidth-bound, TPOT ≈ bytes read per step / the
# bandwidth the cores draw from memory. Measure that bandwidth once, with
# llama.cpp on the lab's model (GGUF file size / TPOT), then divide other
# models' sizes by it. Q4_1 stores 32 weights in 20 bytes (5 bits a weight,
# 0.625 bytes), float16 2 bytes, float32 4 bytes.
#
# Expect, on a laptop-class CPU drawing ~10-20 GB/s: a 1.7B model in Q4_1
# (~1.1 GB) at around 10-15 tokens/s, an 8B model in Q4_1 (~5 GB) at a few
# tokens/s, the same 8B in float16 (16 GB) at about one token/s, if it fits in
# memory at all. A 70B model in Q4_1 (~44 GB) does not fit in most laptops'
# memory; where it fits, expect well under one token/s.
# These are rough *ceilings* (a roofline): a step also has fixed costs and
# some arithmetic, so real engines land somewhat below the line, and a
# 0.1 GB model is a small sample of the memory system. A Mac's unified
# memory (100-800 GB/s) or a GPU's HBM (several TB/s) moves every line up by
# the same factor: that is the whole reason decode is faster there.
#
# What it printed on the 2-core machine the lab was written on (the measured
# bandwidth wanders from run to run; compare orders of magnitude):
#     lab model: 0.10 GB per step / 6.0 ms = 16.3 GB/s
#     this machine's RAM: 25 GB
#      SmolLM2-1.7B Q4_1:   1.1 GB -> at most  15.33 tokens/s (TPOT >= 65 ms); fits
#                8B Q4_1:   5.0 GB -> at most   3.26 tokens/s (TPOT >= 307 ms); fits
#             8B float16:  16.0 GB -> at most   1.02 tokens/s (TPOT >= 982 ms); fits
#               70B Q4_1:  43.8 GB -> at most   0.37 tokens/s (TPOT >= 2,685 ms); does NOT fit in memory
# The bandwidth came out at 16.3 and 15.6 GB/s in two runs on that machine
# (lab 02's bandwidth cell gets the same order); yours sets every line.
from pathlib import Path

import lablib
from lablib.machine.identity import hardware_info
from lablib.measure import sweep
from lablib.measure.workload import prompt_of_length

model = lablib.prepare()
df = sweep.side_by_side(model, engines=("llama.cpp",), ids=prompt_of_length(model, 32), max_new_tokens=64, reps=3)
tpot = df["tpot_s"].median()
weights = Path(model.gguf_path).stat().st_size
bandwidth = weights / tpot  # bytes per second
ram = hardware_info()["ram_bytes"]
print(f"lab model: {weights / 1e9:.2f} GB per step / {tpot * 1e3:.1f} ms = {bandwidth / 1e9:.1f} GB/s")
print(f"this machine's RAM: {ram / 1e9:.0f} GB\n")

candidates = {  # name: (parameters, bytes per weight)
    "SmolLM2-1.7B Q4_1": (1.7e9, 0.625),
    "8B Q4_1": (8e9, 0.625),
    "8B float16": (8e9, 2),
    "70B Q4_1": (70e9, 0.625),
}
for name, (params, bytes_per_weight) in candidates.items():
    size = params * bytes_per_weight
    fits = "fits" if size < 0.8 * ram else "does NOT fit in memory"
    print(
        f"{name:>18}: {size / 1e9:5.1f} GB -> at most {bandwidth / size:6.2f} tokens/s "
        f"(TPOT >= {size / bandwidth * 1e3:,.0f} ms); {fits}"
    )
