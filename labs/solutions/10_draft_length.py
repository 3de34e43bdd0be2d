# Solution · lab 10 · the best draft length
#
# The prediction first: with alpha = 0.8 and a draft costing c = 0.5 of a target step,
# (1 - 0.8^(k+1)) / (1 - 0.8) tokens per pass over k * 0.5 + 1 passes' worth of time:
# k = 1: 1.80 / 1.5 = 1.20x; k = 2: 2.44 / 2.0 = 1.22x; k = 4: 3.36 / 3.0 = 1.12x; k = 6: 3.95 / 4.0 = 0.99x.
# The curve is flat and peaks early: each extra draft token costs c for sure but adds a token only with
# probability alpha^j, so with a draft that costs half a target step a short draft is best, and a long one
# loses. (With a free draft, c = 0, the prediction grows with k towards 1 / (1 - alpha) = 5 tokens a pass.)
#
# Measured, alpha is not the same at every k: the first drafted token is the easiest to guess (it follows
# the target's own last token), later ones follow the draft's own guesses, so the acceptance rate over a
# long draft is lower than over a short one. On this CPU the measured speedup also falls short of the
# prediction: the formula assumes checking k + 1 tokens costs one target pass, and on two cores a pass of
# a small model grows with the positions it computes.
#
# In the run below every measured speedup is under 1: on two CPU cores a Q4_0 draft of this 135M model costs
# 0.55 of a target step, and checking k + 1 positions costs more than one; the measured speedup still falls
# with k as the prediction does, and alpha falls with k (1.00, 0.67, 0.44).
#
# What it printed on the 2-core machine the lab was written on (LABLIB_QUICK=1: 3 requests of 12 tokens per arm):
#   predicted: {1: 1.2, 2: 1.22, 4: 1.12, 6: 0.99}
#   k=1: alpha 1.00, tokens per pass 1.71, speedup 0.74x, predicted 1.29x (c 0.55)
#   k=2: alpha 0.67, tokens per pass 2.00, speedup 0.64x, predicted 1.01x (c 0.55)
#   k=4: alpha 0.44, tokens per pass 2.40, speedup 0.52x, predicted 0.55x (c 0.55)
import lablib
from lablib.studies.decoding import speculative as sp

model = lablib.prepare()
print("predicted:", {k: round(sp.predicted_speedup(0.8, k, 0.5), 2) for k in (1, 2, 4, 6)})
rows = sp.run(engines="llama-server", ks="1,2,4", texts="prose", model=model, log=lambda m: None)
for r in sp.speedup_table(rows):
    print(
        f"k={r['k']}: alpha {r['acceptance']:.2f}, tokens per pass {r['tokens_per_pass']:.2f}, "
        f"speedup {r['tpot_speedup']:.2f}x, predicted {r['predicted_speedup']:.2f}x (c {r['draft_cost']:.2f})"
    )
