# Solution · lab 11 · a merged adapter in Q4_1
#
# llama-export-lora writes every merged tensor in F16: the merged file is 2.5x the Q4_1 base, and decode, which
# reads every weight each step, is slower than the base's (about 1.3-1.5x here). Quantized back to Q4_1 with
# llama.cpp's quantizer (lab 06), the merged file has the base's types and size again (Q4_1 79%, Q8_0 21%,
# 98.4 MB) and its TPOT is the base's: merged is free at run time again.
#
# But its answer is no longer the unmerged adapter's: here it parts from it at the first token, where merged F16
# only differed at a near tie. Q4_1 rounds each block of 32 weights to 16 levels; the rounding of W + scale*B@A is
# not the rounding of W plus an exact scale*B@A, and the adapter's change is of the size of that rounding (lab 06
# measures what such rounding does to the logits: KL). To ship a merged adapter quantized, merge into the
# full-precision weights (the F16 or BF16 model the Q4_1 file was made from) and quantize once; then compare the
# merged-quantized model's logits against the unmerged adapter's with lab 04's `compare`, as you would any
# quantized model against its reference.
#
# What it printed on the 2-core machine the lab was written on (LABLIB_QUICK=1):
#                 no adapter: TPOT 7.5 ms
#                r8 unmerged: TPOT 9.8 ms
#            r8 merged (F16): TPOT 10.9 ms
#      r8 merged, Q4_1 again: TPOT 7.1 ms
#   merged F16 / base TPOT: 1.46; merged Q4_1 / base: 0.96
#   Q4_1 merged first differs from unmerged at token 1
#   and from the base model at token 1
import statistics

import lablib
from lablib.engines.base import GenerationConfig
from lablib.model.adapters import make_adapter, merged_model
from lablib.studies import adapters as ad
from lablib.studies.quant import quantize_file, rung_model

model = lablib.prepare()
r8 = make_adapter(model, rank=8, forms=("gguf",))
f16 = merged_model(r8, "gguf")  # llama-export-lora: merged tensors in F16
q4 = quantize_file(f16, f16.replace(".gguf", "-Q4_1.gguf"), "Q4_1")  # back to the base's type
ids = lablib.prompt_of_length(model, 32)
cfg = GenerationConfig(max_new_tokens=32)


def measure(label, **kw):
    engine = lablib.load_engine("llama.cpp", kw.pop("on", model), n_ctx=512, **kw)
    try:
        engine.generate(ids, cfg)  # warm-up
        traces = [engine.generate(ids, cfg) for _ in range(3)]
    finally:
        engine.close()
    tpot = statistics.median(t.tpot_s for t in traces)
    print(f"{label:>24}: TPOT {tpot * 1e3:.1f} ms")
    return list(traces[0].token_ids), tpot


base_ids, base = measure("no adapter")
unmerged_ids, _ = measure("r8 unmerged", adapter=r8)
_, f16_tpot = measure("r8 merged (F16)", adapter=r8, merge_adapter=True)
q4_ids, q4_tpot = measure("r8 merged, Q4_1 again", on=rung_model(q4, model, "Q4_1 merged r8"))
print(f"merged F16 / base TPOT: {f16_tpot / base:.2f}; merged Q4_1 / base: {q4_tpot / base:.2f}")
print("Q4_1 merged first differs from unmerged at token", ad.first_difference(unmerged_ids, q4_ids))
print("and from the base model at token", ad.first_difference(base_ids, q4_ids))
