# Solution · lab 06 · how low can the KL go?
#
# Q4_1 re-quantized from the F32 reference gives back the shipped Q4_1 blocks
# bit for bit (the reference *is* those blocks, dequantized), so its weights
# are exactly the reference's. Its KL is still not 0: in a quantized matrix
# product llama.cpp rounds the *activations* to 8 bits too (Q8_1 for Q4_1,
# Q8_0 for Q8_0) and multiplies integers, while the F32 file multiplies
# floats. That floor, 0.003 nats here, is about as large as Q8_0's whole KL
# (0.004): Q8_0 is not "lossless" against this reference, because the
# reference's weights sit on Q4_1's grid (16 levels per block, with a
# minimum), which Q8_0's grid (256 levels, symmetric, no minimum) does not
# contain: every weight moves by up to half a Q8_0 step, plus the same 8-bit
# activations. Both stay below KL 0.01 with 95% top-1 agreement; Q4_0, whose
# grid has no minimum either but only 16 levels, moves the weights by up to
# half a 4-bit step: KL 0.26, top-1 70%, perplexity +23%. Against an original
# BF16 model (no grid in the weights) Q8_0 would be the one close to the floor.
#
# What it printed on the 2-core machine the lab was written on (26 s: the
# reference's log-probs and the rungs were cached by the lab's ladder):
#     type     bpw     ppl  kl_mean  kl_p99   top1  dp_top_abs_mean
#      F32 32.0000 22.6078   0.0000  0.0000 1.0000           0.0000
#     Q8_0  8.5061 23.1366   0.0041  0.0113 0.9524           0.0148
#     Q4_1  5.7437 22.6866   0.0031  0.0109 0.9524           0.0135
#     Q4_0  5.3491 27.7622   0.2646  0.6832 0.6984           0.1171
#     Q4_1 (the shipped blocks, bit for bit) against Q8_0: KL 0.0031 vs 0.0041 nats
# Quick mode scores 2 chunks of 128 tokens, full mode 4 of 512: few
# positions in quick mode, so top-1 moves in coarse steps.
import pandas as pd

import lablib
from lablib.studies import ladder

model = lablib.prepare()
rows = ladder.run_ladder(["Q8_0", "Q4_1", "Q4_0"], model=model, speed=False, log=lambda m: None)
df = pd.DataFrame(rows)
print(df[["type", "bpw", "ppl", "kl_mean", "kl_p99", "top1", "dp_top_abs_mean"]].round(4).to_string(index=False))
kl = df.set_index("type")["kl_mean"]
print(f"Q4_1 (the shipped blocks, bit for bit) against Q8_0: KL {kl['Q4_1']:.4f} vs {kl['Q8_0']:.4f} nats")
