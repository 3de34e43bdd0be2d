# Solution · lab 09 · answer before you think
#
# The lab's chats, twice on fresh llama-servers (2 slots): with the lab's think
# time (3 s in quick mode) and with 0.5 s, so that each turn is sent before
# the last answer is done (an answer takes seconds here). Each turn's prompt
# is the conversation so far; `seen_prefix_tokens` is the most any cache
# could reuse (what earlier requests held, in whole blocks of the server's
# cache).
#
# With 3 s, caching on: from turn 1 on every turn reuses its whole bound
# (cached = seen = the previous turn's prompt), because the slot that
# answered the last turn is free again and still holds it; TTFT stays level
# (3.2 s, 2.2 s), while with caching off it climbs turn after turn (6.3 s,
# 13.3 s): each turn prefills everything and the queue builds. (Each row is
# the median over the two sessions, with two the mean of both: seen 64 at
# turn 0 is 0 for the first session and the 128-token system prompt for the
# second.) With 0.5 s, cached tokens fall below the bound: at turn 1 the two
# sessions reused 128 tokens between them (median 64) of a bound of 160
# each: at most the shared system prompt another request left in a slot,
# not the session's own last turn, which was still being answered; at turn 2
# 160 of 204 (as much as turn 0's prompt, not turn 1's). A turn sent while its session's last turn is still
# running cannot reuse that turn on llama-server (reuse needs the earlier
# request finished and its slot free). With all turns overlapping, the two
# slots are never idle: TTFT climbs with the queue in both arms (on: 6.2,
# 8.1, 9.1 s; off: 10.3, 13.4, 16.9 s), and caching still saves, but less
# than when the user thinks for a while. (vLLM's paged cache shares a block
# as soon as it is computed, while its request still runs: start vLLM with
# prefix_caching=True to see the difference; not done here, a vLLM start
# costs minutes.)
#
# What it printed on the 2-core machine the lab was written on (85 s):
#     --- think time 3.0 s
#     prefix_cache  turn  requests  errors  prompt_tokens  cached_tokens  seen_prefix_tokens  ttft_p50_s  ttft_max_s
#               on     0         2       0          160.0            0.0                64.0       3.052       3.684
#               on     1         2       0          204.0          160.0               160.0       3.157       3.417
#               on     2         2       0          248.0          204.0               204.0       2.210       2.481
#              off     0         2       0          160.0            0.0                64.0       2.589       3.415
#              off     1         2       0          204.0            0.0               160.0       6.297       7.218
#              off     2         2       0          248.0            0.0               204.0      13.284      14.759
#     --- think time 0.5 s
#     prefix_cache  turn  requests  errors  prompt_tokens  cached_tokens  seen_prefix_tokens  ttft_p50_s  ttft_max_s
#               on     0         2       0          160.0           64.0                64.0       6.197       8.165
#               on     1         2       0          204.0           64.0               160.0       8.069       9.286
#               on     2         2       0          248.0          160.0               204.0       9.121      10.203
#              off     0         2       0          160.0            0.0                64.0      10.289      15.439
#              off     1         2       0          204.0            0.0               160.0      13.408      17.789
#              off     2         2       0          248.0            0.0               204.0      16.882      20.413
# At turn 0 with 0.5 s the second session did find the shared system prompt
# (128 tokens, its bound; median 64), which it missed with 3 s: which request
# finds what in which slot depends on the other session's timing, run to run.
import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

model = lablib.prepare()
d = scheduler.quick_defaults()
for think in (d["chat_think_s"], 0.5):  # the lab's think time, then a user who sends before reading
    srv = start_server("llama-server", model, parallel=2, n_ctx=1024, threads=1)
    try:
        rows, turns = scheduler.multi_turn(
            srv,
            model,
            n_sessions=d["chat_sessions"],
            turns=d["chat_turns"],
            system_tokens=d["chat_system_tokens"],
            question_tokens=d["chat_question_tokens"],
            answer_tokens=d["chat_answer_tokens"],
            think_time_s=think,
        )
    finally:
        srv.stop()
    print(f"--- think time {think} s")
    print(turns.round(3).to_string(index=False))
