# Solution · lab 09 · the same traffic, four times faster
#
# time_scale=0.25 keeps every request and its lengths and squeezes the gaps
# between arrivals to a quarter. The slice the lab replays in quick mode is
# already a burst (10 requests within 3 s, on two slots that need some 20 s
# for all of them), so at the trace's own speed it queues already: 6
# waiting at most, TTFT p50 5 s. Four times faster, the same 10 requests come
# within 0.8 s: nearly all of them are queued before the first finishes (7
# waiting), the median request waits behind more of the others (TTFT p50
# 5.1 -> 11.5 s), p99 rises less (20.4 -> 23.7 s: the last request waited for
# nearly all the work either way), and the server needs longer after the last
# arrival to finish (`drain_s` 20.6 -> 24.3 s): the same work, which now
# starts from a full queue. The client kept up in both runs (send lag p99 of
# 2-5 ms, `kept_up` True): the queueing is the server's. A longer slice
# (full mode: 40 requests) has gaps between its bursts where the server
# drains; squeezing the time shrinks those gaps too, so expect a larger
# difference there than in this one burst.
#
# What it printed on the 2-core machine the lab was written on (63 s):
#     time_scale 1.0: arrivals over 3.0 s, most waiting 6.0, requests 10, errors 0, schedule_lag_p99_s 0.002,
#         kept_up True, drain_s 20.553, ttft_p50_s 5.09, ttft_p99_s 20.357
#     time_scale 0.25: arrivals over 0.8 s, most waiting 7.0, requests 10, errors 0, schedule_lag_p99_s 0.005,
#         kept_up True, drain_s 24.275, ttft_p50_s 11.453, ttft_p99_s 23.654
import lablib
from lablib.engines.servers import start_server
from lablib.studies import scheduler

model = lablib.prepare()
d = scheduler.quick_defaults()
keys = ["requests", "errors", "schedule_lag_p99_s", "kept_up", "drain_s", "ttft_p50_s", "ttft_p99_s"]
for time_scale in (1.0, 0.25):
    srv = start_server("llama-server", model, parallel=2, n_ctx=1024, threads=1)
    try:
        rows, samples, summary = scheduler.trace_replay(
            srv,
            model,
            start=d["replay_start"],
            count=d["replay_count"],
            length_scale=d["replay_length_scale"],
            time_scale=time_scale,
        )
    finally:
        srv.stop()
    waiting = samples.loc[samples["metric"] == "waiting", "value"]
    span = rows["t_scheduled"].max() - rows["t_scheduled"].min()
    print(
        f"time_scale {time_scale}: arrivals over {span:.1f} s, most waiting {waiting.max() if len(waiting) else None}, "
        + ", ".join(f"{k} {round(summary[k], 3) if isinstance(summary[k], float) else summary[k]}" for k in keys)
    )
