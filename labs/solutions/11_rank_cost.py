# Solution · lab 11 · what the rank costs
#
# The prediction from the shape: a rank-16 adapter on every projection of SmolLM2-135M holds 4,884,480
# numbers (19.5 MB in float32) and adds 3.6% to the matrix FLOPs of a decoded token; rank 8 adds 1.8%, rank 64
# 14.5%. If arithmetic set the price, TPOT would grow by those shares.
#
# Measured, the cost starts high and then grows with the rank: going from no adapter to rank 8 costs ~20%
# (ten times its FLOPs share), doubling to rank 16 adds a few points more, and rank 64 (8x the FLOPs of rank 8)
# adds ~45 points more. The first adapter pays for the number of operations (two more small matrix products per
# adapted weight, 420 per token here, each with its own call, its own read of x and write of the result);
# the rank then adds the bytes of A and B, read every step, and their FLOPs. On a larger model the operation count
# is the same and the base step is longer, so the fixed part shrinks as a share of the step.
#
# What it printed on the 2-core machine the lab was written on (LABLIB_QUICK=1: 32-token prompt, 16 tokens,
# every arm loaded at once and measured in turn, medians of 3):
#      adapter_rank  bytes_f32  flops_share
#   0             8    9768960     0.018161
#   1            16   19537920     0.036321
#   2            64   78151680     0.145285
#      adapter_rank adapter_arm  tpot_s  tpot_vs_none
#   0           NaN        none  0.0086        1.0000
#   1           8.0    unmerged  0.0102        1.1968
#   3          16.0    unmerged  0.0108        1.2604
#   5          64.0    unmerged  0.0140        1.6430
import pandas as pd

import lablib
from lablib.studies import adapters as ad

model = lablib.prepare()
print(pd.DataFrame(ad.size_table(model, ranks=(8, 16, 64)))[["adapter_rank", "bytes_f32", "flops_share"]])
rows = ad.in_process_rows("llama.cpp", model, ranks=(8, 16, 64), reps=3, log=lambda m: None)
table = pd.DataFrame(ad.cost_table(rows))
print(table.query("adapter_arm != 'merged'")[["adapter_rank", "adapter_arm", "tpot_s", "tpot_vs_none"]].round(4))
