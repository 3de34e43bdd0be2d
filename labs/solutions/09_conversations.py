# Solution · lab 09 · conversations, not neighbours
#
# Requests 1, 10, 66, 133 and 137 of Mooncake's trace hold three
# conversations: 133 goes on from 66, 137 from 1, and every request starts
# with the trace's first block (a common system prompt). Replayed twenty
# times faster (time_scale=0.05), on a fresh llama-server with 2 slots, with
# prompt caching on and then off. A perfect cache could now take 31% of the
# prompt tokens (168 of 540: 137 shares 112 tokens, 14 scaled blocks, with 1;
# 133 shares 40 with 66; 10 and 66 share the first block, 8 tokens), against
# a few percent for the lab's slice of neighbours, which seldom hold two
# turns of one conversation. llama-server reached 160 (30%): 133 and 137 got
# all of their bound (the turns they go on from had finished long before,
# even twenty times faster), 66 got its 8, and 10 got none of its 8: it
# arrived 0.15 s after request 1, whose prompt was still being computed, and
# a slot that is still computing is no cache for another request. TTFT p50
# fell from 4.1 s (off) to 3.8 s (on); p99 did not fall (5.1 s on against
# 4.6 s off): with 5 requests the p99 is the slowest one, request 10, which
# reused nothing either way, and the machine's noise. `same_output`: 3 of 5
# requests answered the same tokens with and without the cache (reused keys
# and values computed in batches of another size can flip a near tie).
#
# What it printed on the 2-core machine the lab was written on (27 s):
#                                0         1
#     prefix_cache              on       off
#     requests                   5         5
#     errors                     0         0
#     prompt_tokens            540       540
#     reusable_tokens          168       168
#     perfect_hit_rate    0.311111  0.311111
#     seen_prefix_tokens       168       168
#     cached_tokens            160         0
#     hit_rate            0.296296       0.0
#     cached_above_bound         0         0
#     ttft_p50_s          3.781848  4.118912
#     ttft_p99_s          5.069668  4.625916
#     same_output                3         3
#      trace_index  prompt_tokens  reusable_tokens  seen_prefix_tokens  usage_cached_tokens  ttft_s
#                1            115                0                   0                    0   1.418
#               10            212                8                   8                    0   5.087
#               66             42                8                   8                    8   4.650
#              133             48               40                  40                   40   3.782
#              137            123              112                 112                  112   3.781
import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

model = lablib.prepare()
srv = start_server("llama-server", model, parallel=2, n_ctx=1024, threads=1)
try:
    rows, reuse = scheduler.prefix_reuse(srv, model, requests=[1, 10, 66, 133, 137], time_scale=0.05)
finally:
    srv.stop()
print(reuse[list(scheduler.REUSE_VIEW)].T.to_string())
on = rows[rows["prefix_cache"] == "on"]
cols = ["trace_index", "prompt_tokens", "reusable_tokens", "seen_prefix_tokens", "usage_cached_tokens", "ttft_s"]
print(on[[c for c in cols if c in on]].round(3).to_string(index=False))
