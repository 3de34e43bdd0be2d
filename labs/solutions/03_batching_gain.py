# Solution · lab 03 · from how many clients does continuous batching pay here?
#
# llama.cpp alone, batched mode, 1, 2, 4 and 8 clients, 32 output tokens each.
# For each level: output tokens/s against one client (the gain), and TPOT
# against one client (what a step carrying C sequences costs).
#
# Reading it: if a step with C sequences cost the same as a step with one
# (purely memory-bandwidth-bound: the weights are read once per step for all
# sequences), TPOT would stay flat and throughput would grow C-fold. If it
# cost C times as much (compute-bound), TPOT would grow C-fold and throughput
# would stay flat. On two CPU cores llama.cpp is close to compute-bound: TPOT
# about doubles from 1 to 2 clients and grows about 5x at 8, so throughput
# rises only modestly, not at all at 2 clients and about 1.2-1.5x at 4 to 8.
# The arithmetic of C sequences quickly fills two cores. On a GPU the same
# table shows TPOT almost flat up to dozens of sequences, and throughput
# rising nearly C-fold. TTFT p95 grows with C (the C prompts of a wave are
# prefilled together, a compute-bound pass C times as long), yet stays far
# below serial mode's, where the last client waits for C - 1 whole answers.
#
# What it printed on the 2-core machine the lab was written on (a quiet
# machine matters: llama.cpp's threads wait for each other at every step, so
# another busy program distorts these numbers most; compare ratios):
#                  output_tps  throughput_gain  tpot_p50_s  tpot_growth  ttft_p95_s
#     concurrency
#     1               121.677            1.000       0.006        1.000       0.076
#     2               119.148            0.979       0.013        2.116       0.137
#     4               156.007            1.282       0.018        2.913       0.271
#     8               185.705            1.526       0.028        4.532       0.523
# No gain at 2 clients (a step with two sequences cost twice one), 1.3x at 4,
# 1.5x at 8. Expect the same shape on a laptop, with gains that vary by tens of percent from run to run (a second
# run here: 0.91x at 2, 1.20x at 4, 1.40x at 8, with TPOT x2.3, x3.2, x5.2).
import lablib
from lablib.measure import sweep

model = lablib.prepare()
df = sweep.concurrency_sweep(
    model, engines=["llama.cpp"], concurrency=[1, 2, 4, 8], modes=["batched"], prompt_tokens=32, max_new_tokens=32
)
runs = lablib.run_table(df).set_index("concurrency")
one = runs.loc[1]
runs["throughput_gain"] = runs["output_tps"] / one["output_tps"]
runs["tpot_growth"] = runs["tpot_p50_s"] / one["tpot_p50_s"]
print(runs[["output_tps", "throughput_gain", "tpot_p50_s", "tpot_growth", "ttft_p95_s"]].round(3).to_string())
