# Solution · lab 05 · which server hides a cache?
#
# Both servers run the same llama.cpp library, and both are sent the same
# three prompts: a shared 512-token start, then 16 tokens of each request's
# own. llama-cpp-python's server keeps the KV cache of the last prompt it
# computed and reuses the longest matching prefix, always (there is no switch
# to turn it off), and its stream does not say so: `cached_tokens` is missing
# (NaN). So requests 1 and 2 prefill only their own 16 tokens, and their TTFT
# falls to a few percent of the first's. llama-server could do the same, but
# the lab sends every request `cache_prompt: false` (its rule: no measured
# request reuses another's KV cache), and llama-server reports what it reused
# (`timings.cache_n`): 0 tokens, and TTFT stays within the noise of the first.
# The lesson for benchmarking: a server that reuses a cache silently makes
# prefill look 20 times faster than it is, and only TTFT gives it away, so
# send prompts that share no prefix, or use a server whose counters say what
# it reused (llama-server's cache_n, vLLM's prefix_cache_hits).
#
# What it printed on the 2-core machine the lab was written on (36 s; a busy
# machine, so the prefill of 528 tokens on one thread took about 6 s):
#               server  request prefix  prompt_tokens  ttft_s  cached_tokens
#     llama-cpp-python        0   cold            528   6.327            NaN
#     llama-cpp-python        1 shared            528   0.241            NaN
#     llama-cpp-python        2 shared            528   0.221            NaN
#         llama-server        0   cold            528   5.891            0.0
#         llama-server        1 shared            528   5.410            0.0
#         llama-server        2 shared            528   5.614            0.0
#     TTFT of requests 1 and 2 over request 0's:
#     request              1     2
#     server
#     llama-cpp-python  0.04  0.03
#     llama-server      0.92  0.95
import lablib
from lablib.build.llama import BuildError, llama_tool
from lablib.engines.servers import start_server
from lablib.studies import serving

model = lablib.prepare()
servers = [start_server("llama-cpp-python", model, threads=1)]
try:
    try:
        llama_tool("llama-server")
        servers.append(start_server("llama-server", model, parallel=4, threads=1))
    except BuildError as e:
        print(f"no llama-server here: {e}")
    # a shared prompt of 512 tokens, then 16 of each request's own, three times per server
    demo = serving.prefix_cache_demo(model, servers, shared_tokens=512, own_tokens=16)
    print(
        demo[["server", "request", "prefix", "prompt_tokens", "ttft_s", "cached_tokens"]]
        .round(3)
        .to_string(index=False)
    )
    ttft = demo.pivot(index="server", columns="request", values="ttft_s")
    print("TTFT of requests 1 and 2 over request 0's:")
    print((ttft[[1, 2]].div(ttft[0], axis=0)).round(2).to_string())
finally:
    for s in servers:
        s.stop()
