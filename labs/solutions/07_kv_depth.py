# Solution · lab 07 · does the KV cache move the points?
#
# Each decode step reads the weights once and the KV cache of every earlier
# token: bytes per step = W + L x kv. llama.cpp: W = 97 MB, kv = 23,040 bytes
# (float16), so at 8,192 tokens the cache (189 MB) is twice the weights and the
# bound falls about 3 x from depth 64. transformers: W = 538 MB, kv = 46,080
# bytes (float32): at 8,192 tokens the cache (377 MB) adds 70 %, so its bound
# falls less in relative terms: its weights were already the larger cost.
# Intensity barely moves (attention adds 69,120 FLOP per position, and the
# position costs 23 or 46 KB to read: 1.5-3 FLOP per byte, about decode's own),
# so the points slide down along the bandwidth slope rather than across.
#
# Measured, llama.cpp's TPOT rises from 64 to 1024 tokens by less than the
# bytes predict at first, because per-step fixed costs dilute it; on a shared
# machine the run-to-run noise can hide a 20 % change: repeat it.
import lablib
from lablib.machine import ceilings
from lablib.measure import sweep
from lablib.results import tables
from lablib.studies import roofline

model = lablib.prepare()
mach = ceilings.machine("this")
for engine in ("llama.cpp", "transformers"):
    prof = roofline.engine_profile(model, engine)
    base = None
    for depth in (64, 1024, 8192):
        cost = roofline.decode_cost(prof, depth)
        t = roofline.bound_seconds(cost, mach, prof["compute_dtype"])
        base = base or t["seconds"]
        print(
            f"{engine:>12} depth {depth:>5}: {cost['bytes'] / 1e6:6.0f} MB/step, {cost['intensity']:.2f} FLOP/byte, "
            f"bound {1 / t['seconds']:6.1f} tok/s ({t['seconds'] / base:.2f} x the step at 64)"
        )

df = sweep.context_sweep(
    model, engines=["llama.cpp"], prompt_tokens=[64, 1024], max_new_tokens=32, reps=2, progress=False
)
print(tables.bound_table(roofline.add_bound_columns(df, model, log=print)).round(1).to_string(index=False))
