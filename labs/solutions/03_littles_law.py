# Solution · lab 03 · Little's law: concurrency = throughput x latency.
#
# In a closed loop, C clients each have exactly one request in flight (from
# submit to last token) nearly all the time. Little's law says the average
# number in the system equals the arrival rate times the average time spent
# in it:  C ≈ requests/s x mean e2e.  It holds whatever the engine does
# inside, serial queue or continuous batching: in serial mode e2e grows
# (queue wait) while requests/s stays flat; in batched mode e2e grows less
# and requests/s rises, and the product stays C.
#
# The product is exactly the average number of requests in flight over the
# run (first submit to last token). In batched mode it comes out at C: the C
# requests of equal length start together and finish together, so C are in
# flight until the very end. In serial mode it comes out a little *below* C:
# the clients finish one by one, so during the last requests fewer than C
# are in flight. With 4 requests per client the serial value is
# (7C + 1) / 8 (1.875 for C = 2, 3.625 for C = 4); more requests per client
# bring it closer to C.
# The practical use: a server answering 20 requests/s with a mean e2e of 2 s
# holds about 20 x 2 = 40 requests in flight, so it needs KV cache and batch
# slots for about 40 sequences.
#
# What it printed on the 2-core machine the lab was written on:
#        mode  concurrency  requests  requests_per_s  mean_e2e_s  requests_per_s_x_mean_e2e
#      serial            1         4           5.946       0.168                      1.000
#     batched            1         4           5.934       0.169                      1.000
#      serial            2         8           6.062       0.309                      1.876
#     batched            2         8           6.143       0.326                      2.000
#      serial            4        16           6.168       0.588                      3.624
#     batched            4        16           7.306       0.547                      4.000
# The times differ from run to run; the last column does not, because it is
# the average number of requests in flight over the run, whatever the speed.
import pandas as pd

import lablib
from lablib.measure import sweep

model = lablib.prepare()
levels = [1, 2, 4]
frames = [
    sweep.concurrency_sweep(
        model,
        engines=["llama.cpp"],
        concurrency=[c],
        modes=["serial", "batched"],
        requests=4 * c,
        prompt_tokens=32,
        max_new_tokens=16,
    )
    for c in levels
]  # 4 requests per client (one call per level: `requests` is per level)
df = pd.concat(frames, ignore_index=True)
runs = lablib.run_table(df)
mean_e2e = df.groupby("run_id")["e2e_s"].mean()
runs["mean_e2e_s"] = runs["run_id"].map(mean_e2e)
runs["requests_per_s_x_mean_e2e"] = runs["requests_per_s"] * runs["mean_e2e_s"]
print(
    runs[["mode", "concurrency", "requests", "requests_per_s", "mean_e2e_s", "requests_per_s_x_mean_e2e"]]
    .round(3)
    .to_string(index=False)
)
