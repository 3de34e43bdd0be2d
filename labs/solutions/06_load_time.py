# Solution · lab 06 · does a file 5.5 times larger load 5.5 times slower?
#
# No. llama.cpp memory-maps a GGUF: "loading" maps the file into the
# process's address space and builds the model's bookkeeping; the weights are
# read only when a computation first touches them (a page fault per 4 KiB
# page, served from the operating system's page cache, or from disk the first
# time). On this machine the files are in the page cache (the lab and its
# tests read them often), so both load in about a second, whatever their
# size, and the first request costs about what the later ones do. After a
# reboot (a cold page cache) the first request of the F32 file would also
# read 515 MiB from disk, about a second on an SSD, more on a network disk:
# that is what memory mapping postpones, to the first request.
#
# The requests themselves show the other half of the lab: prefill (64 tokens
# at once, compute-bound) was *faster* on F32 (llama.cpp's batched F32 matrix
# products are well-optimised; for Q4_1 it first dequantizes, which costs
# arithmetic), while decode (one token, memory-bound: every weight read
# once) was faster on Q4_1, 1.5-2x, not 5.5x: at this model size per-token
# fixed costs and caches matter as much as bytes.
#
# What it printed on the 2-core machine the lab was written on (11 s; a busy
# machine, and a second run moves the load times by a factor of 2):
#     Q4_1 (shipped)     93.8 MiB  load 0.95 s  TTFT first request 0.999 s, later 1.037 s  TPOT 33.2 ms
#     F32 (reference)   514.8 MiB  load 0.69 s  TTFT first request 0.492 s, later 0.483 s  TPOT 49.9 ms
# (an earlier version of this script, on a busier moment: loads 1.21 s and
# 2.43 s, TTFT 1.54 s and 0.65 s, TPOT 37 ms and 78 ms.)
import time

import lablib
from lablib.engines.base import GenerationConfig
from lablib.studies import quant

model = lablib.prepare()
ref = quant.reference(model)  # the F32 GGUF
files = {"Q4_1 (shipped)": model, "F32 (reference)": quant.rung_model(ref, model, "F32")}
ids = list(range(1000, 1064))  # 64 prompt tokens, any ids will do
cfg = GenerationConfig(max_new_tokens=8, ignore_eos=True)
for label, m in files.items():
    t0 = time.perf_counter()
    engine = lablib.load_engine("llama.cpp", m, n_ctx=256)
    load_s = time.perf_counter() - t0
    try:
        first = engine.generate(ids, cfg)  # the first request touches every weight page
        later = sorted((engine.generate(ids, cfg) for _ in range(3)), key=lambda t: t.ttft_s)
        second = later[1]  # the median of three more
        print(
            f"{label:<16} {quant.file_facts(m.gguf_path)['bytes'] / 2**20:6.1f} MiB  load {load_s:.2f} s  "
            f"TTFT first request {first.ttft_s:.3f} s, later {second.ttft_s:.3f} s  TPOT {second.tpot_s * 1000:.1f} ms"
        )
    finally:
        engine.close()
