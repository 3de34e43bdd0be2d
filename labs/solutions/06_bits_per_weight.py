# Solution · lab 06 · bits per weight from the block layout
#
# A "legacy" llama.cpp quant stores weights in blocks of 32. Q8_0: 32 signed
# bytes and one 16-bit scale, 34 bytes for 32 weights = 8.5 bits/weight.
# Q4_0: 32 four-bit values (16 bytes) and a 16-bit scale = 4.5. Q4_1 adds a
# 16-bit minimum = 5.0. Q5_0: 4 bits + 1 high bit each (20 bytes) and a scale
# = 5.5. The tensors of each type hold exactly that. The *file* has more bits
# per weight than its name: the token embedding (49,152 x 576 weights, 21% of
# the model; the output layer shares it) stays Q8_0 in every rung, because
# llama.cpp keeps the output tensor at high precision and this model ties the
# two. So a "Q4_0" of this model is 5.35 bits/weight, and its file is 87.5 MiB,
# not the 72 MiB that 135M x 4.5 / 8 predicts. On a bigger model with the
# same vocabulary the embedding is a smaller share and the file's bpw comes
# closer to the name's. The norms stay F32 (a few thousand weights: 0%).
#
# What it printed on the 2-core machine the lab was written on (under a
# second with the lab's ladder cached; seconds per rung otherwise):
#     Q8_0: predicted 8.5 bits/weight, Q8_0 tensors 8.50 (100% of the weights); whole file 8.51 bits/weight,
#           138.1 MiB (params x predicted / 8: 136.3 MiB); mix: Q8_0 100%, F32 0%
#           not Q8_0: {}
#     Q5_0: predicted 5.5 bits/weight, Q5_0 tensors 5.50 (79% of the weights); whole file 6.14 bits/weight,
#           100.1 MiB (params x predicted / 8: 88.2 MiB); mix: Q5_0 79%, Q8_0 21%, F32 0%
#           not Q5_0: {'Q8_0': ['token_embd.weight']}
#     Q4_1: predicted 5.0 bits/weight, Q4_1 tensors 5.00 (79% of the weights); whole file 5.74 bits/weight,
#           93.8 MiB (params x predicted / 8: 80.2 MiB); mix: Q4_1 79%, Q8_0 21%, F32 0%
#           not Q4_1: {'Q8_0': ['token_embd.weight']}
#     Q4_0: predicted 4.5 bits/weight, Q4_0 tensors 4.50 (79% of the weights); whole file 5.35 bits/weight,
#           87.5 MiB (params x predicted / 8: 72.2 MiB); mix: Q4_0 79%, Q8_0 21%, F32 0%
#           not Q4_0: {'Q8_0': ['token_embd.weight']}
import lablib
from lablib.studies import quant

model = lablib.prepare()
ref = quant.reference(model)  # the F32 GGUF every rung is made from
home = quant.quant_home(model.sha256)
predicted = {"Q8_0": 8.5, "Q5_0": 5.5, "Q4_1": 5.0, "Q4_0": 4.5}  # (bits x 32 + 16-bit scale (+ 16-bit min)) / 32
for qtype, guess in predicted.items():
    rec = quant.rung(ref, qtype, home, model.sha256)  # cached after the lab's ladder (else: seconds to make)
    by_type = {g["type"]: g for g in quant.tensor_types(rec["path"])}
    own = by_type.get(qtype)
    print(
        f"{qtype}: predicted {guess} bits/weight, {qtype} tensors {own['bpw']:.2f} "
        f"({100 * own['n_elements'] / rec['parameters']:.0f}% of the weights); whole file {rec['bpw']:.2f} bits/weight, "
        f"{rec['bytes'] / 2**20:.1f} MiB (params x predicted / 8: {rec['parameters'] * guess / 8 / 2**20:.1f} MiB); "
        f"mix: {quant.type_mix(rec['types'])}"
    )
    others = {t: g["tensors"] for t, g in by_type.items() if t not in (qtype, "F32")}  # F32: the norms
    print(f"      not {qtype}: {others}")
