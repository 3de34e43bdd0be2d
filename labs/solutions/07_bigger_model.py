# Solution · lab 07 · how fast would Llama-3.1-8B decode here, and elsewhere?
#
# Decode is bandwidth-bound on every machine in the table: the bound is the
# bandwidth divided by the bytes one step reads (the weights, plus the KV
# cache). Llama-3.1-8B in Q4_1 is about 4.7 GB of weights (5 bits a weight for
# its 7.5 billion matrix weights), in F16 about 15 GB. So on this machine
# (roughly 10-20 GB/s, measured above) the Q4_1 model is allowed 2-4 tokens/s
# and the F16 one well under 1; an L4 (300 GB/s) about 60 and 20; an M2 Max
# (400 GB/s) about 85 and 27. All fit in an M2 Max's 96 GB; an L4's 24 GB
# holds the Q4_1 weights and the F16 ones (15 GB) with little room left for a
# KV cache; this machine's RAM holds both.
#
# Real engines land below the bound: compare each engine's decode_pct_of_bound
# in the sweep above. If llama.cpp reached, say, 60 % of its bound on the
# 135M model, expect about 60 % of the 8B bound too (a bigger model's step is
# longer, so fixed per-step costs weigh less: the fraction usually rises).
from lablib import machine as hardware
from lablib.machine.accelerators import ACCELERATORS
from lablib.studies import roofline

memory = {
    "this": hardware.hardware_info()["ram_bytes"],
    "L4": ACCELERATORS["L4"]["memory_bytes"],
    "Apple M2 Max (38-core GPU)": ACCELERATORS["Apple M2 Max (38-core GPU)"]["memory_bytes"],
}
for machine, mem in memory.items():
    for fmt in ("Q4_1", "F16"):
        p = roofline.predict("Llama-3.1-8B", fmt=fmt, prompt_tokens=512, machine_name=machine)
        fits = "fits" if p["weight_bytes"] < mem else "does NOT fit"
        print(
            f"{machine:>28} {fmt:>5}: {p['weight_bytes'] / 1e9:5.1f} GB, decode <= {p['decode_tps']:7.1f} tok/s "
            f"({p['decode_bound']}-bound), prefill <= {p['prefill_tps']:9.0f} tok/s; {fits}"
        )
