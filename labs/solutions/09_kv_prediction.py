# Solution · lab 09 · predict before you run: how many requests fit in the KV cache?
#
# vLLM's CPU build stores the KV cache in blocks of 128 tokens, and one block
# is its null block, so 9 blocks leave 8 usable. A request of 200 prompt
# tokens and 80 new ones needs ceil(280 / 128) = 3 blocks by its end; 8
# blocks hold 2 such requests (6 blocks) with 2 to spare, so 2 run at once
# without preemption (`fit_sequences`). A third would be admitted, since its
# prompt needs only 2 blocks (the 2 spare), and when the three grew into
# their third blocks one would have none: vLLM would preempt it (the second
# prediction table, with 3 sequences allowed). The lab's vLLM schedules 2
# sequences at most (`max_num_seqs=2`), so with 3 clients the third request
# never starts early: it *waits* for a slot, and nothing is preempted. All of
# this is arithmetic of the model's shape (KV bytes per token) and vLLM's
# rules, before any server runs; vLLM's own counters then agreed on every
# row: 1, 2 and 2 running, one request waiting at 3 clients, no preemption,
# 3/8 and 6/8 of the usable blocks used. It also printed its cache at start
# (`stated_kv_tokens` 1,152 = 9 blocks x 128, the null block included).
#
# The check starts vLLM (its CPU build, installed on first use as in lab 05)
# with the lab's configuration (2 sequences, 512 tokens), so it reuses the
# compiled model: one start, 1-2 minutes on two cores.
#
# What it printed on the 2-core machine the lab was written on (2 min):
#     prediction (arithmetic, no server):
#      concurrency  max_num_seqs  blocks_per_sequence  fit_sequences  predicted_running_max  predicted_waiting  predicted_preemption  predicted_kv_usage_max
#                1             2                    3              2                      1              False                 False                   0.375
#                2             2                    3              2                      2              False                 False                   0.750
#                3             2                    3              2                      2               True                 False                   0.750
#                1             3                    3              2                      1              False                 False                   0.375
#                2             3                    3              2                      2              False                 False                   0.750
#                3             3                    3              2                      3               True                  True                   1.000
#     vLLM, 2 sequences at most:
#                                 0      1      2
#     concurrency                 1      2      3
#     usable_blocks               8      8      8
#     blocks_per_sequence         3      3      3
#     fit_sequences               2      2      2
#     stated_kv_tokens         1152   1152   1152
#     predicted_kv_tokens      1152   1152   1152
#     predicted_running_max       1      2      2
#     running_max                 1      2      2
#     predicted_waiting       False  False   True
#     waiting_max                 0      0      1
#     predicted_preemption    False  False  False
#     preemptions                 0      0      0
#     predicted_kv_usage_max  0.375   0.75   0.75
#     kv_usage_max            0.375   0.75   0.75
import pandas as pd

import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

model = lablib.prepare()
BLOCKS, PROMPT, NEW = 9, 200, 80
keys = ["concurrency", "max_num_seqs", "blocks_per_sequence", "fit_sequences", "predicted_running_max"]
keys += ["predicted_waiting", "predicted_preemption", "predicted_kv_usage_max"]
plans = [
    {"concurrency": c, "max_num_seqs": s, **scheduler.kv_prediction(model, BLOCKS, PROMPT, NEW, c, s)}
    for s in (2, 3)  # the lab's vLLM schedules 2 at most; 3: what a third sequence would do
    for c in (1, 2, 3)
]
print("prediction (arithmetic, no server):")
print(pd.DataFrame(plans)[keys].to_string(index=False))

# the check, on the lab's vLLM configuration (2 sequences, 512 tokens: its compile cache is reused)
vllm = start_server("vllm", model, parallel=2, n_ctx=512, threads=1, options={"num_gpu_blocks": BLOCKS}, log=None)
try:
    kv = scheduler.kv_capacity(vllm, model, prompt_tokens=PROMPT, max_new_tokens=NEW, concurrencies=(1, 2, 3))
finally:
    vllm.stop()
print("vLLM, 2 sequences at most:")
print(kv[list(scheduler.KV_VIEW)].T.to_string())
