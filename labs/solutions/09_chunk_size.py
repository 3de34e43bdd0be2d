# Solution · lab 09 · chunk size
#
# llama-server fills each step with the next token of every decoding slot
# (here 2 short streams) and then prompt tokens up to its batch size `-b`. So
# the long prompt (256 tokens in quick mode, 1024 in full) is prefilled in
# ceil(256 / (b - 2)) steps: 9 at b = 32, 5 at b = 64, 2 at b = 256 (one
# step of 254 prompt tokens, then the rest). Each step gives the short streams
# one token, so their worst gap (`short_itl_during_max_s`) is about one step:
# a decode plus one chunk of prompt. A smaller chunk, a smaller gap: 0.66 s at
# b = 32 against 2.3 s at b = 256, where the step held nearly the whole
# prompt. The long request pays: `long_ttft_s` grew from 2.4 s (b = 256) to
# 4.3 s (b = 32), since every step has a fixed cost (the short streams'
# decode, the server's bookkeeping, one pass over all the weights), and 9
# steps pay it 9 times. For a chat service whose users stream answers, choose
# a small chunk (64-128 here; a GPU server's budget is a few hundred to a few
# thousand tokens): every user already reading keeps a smooth stream, and a
# newcomer waits a little longer for the first token. For a batch job of long
# documents, where no one watches a stream, choose a large one: the fewest
# steps and the best prefill throughput.
#
# What it printed on the 2-core machine the lab was written on (60 s; a busy
# machine, so the times move from run to run, the step counts do not):
#      batch_tokens  long_prompt_tokens  prefill_steps_predicted  short_tokens_during_min  short_itl_before_p50_s  short_itl_during_max_s  long_ttft_s
#                32                 256                        9                        9                   0.037                   0.657        4.285
#                64                 256                        5                        5                   0.035                   0.747        2.826
#               256                 256                        2                        2                   0.032                   2.310        2.410
# The short streams got exactly one token per predicted step. At b = 32 and
# b = 64 the worst gaps are close (0.66 s and 0.75 s): on a shared machine
# one slow step decides the maximum.
import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

model = lablib.prepare()
d = scheduler.quick_defaults()
runs = []
for batch in (32, d["hol_batch"], 256):  # 64 is the lab's small batch in quick mode (128 in full)
    srv = start_server("llama-server", model, parallel=3, n_ctx=1024, threads=1, options={"batch": batch})
    try:
        runs.append(scheduler.hol_blocking(srv, model, long_prompt_tokens=d["hol_prompt_tokens"]))
    finally:
        srv.stop()
hol = scheduler.hol_table(runs)
cols = [
    "batch_tokens",
    "long_prompt_tokens",
    "prefill_steps_predicted",
    "short_tokens_during_min",
    "short_itl_before_p50_s",
    "short_itl_during_max_s",
    "long_ttft_s",
]
print(hol[cols].round(3).to_string(index=False))
