# Solution · lab 04 · a short factual completion: engine or model?
#
# "The capital of Italy is" is a plain text prompt (no chat template), five
# tokens. Config, tokenizer and template agree, as in worked example 1. At the
# first answer token the reference is sure: its two best tokens are about
# 1 nat apart (" Rome" is e^1 = 2.7 times likelier than the runner-up), far
# above the near-tie threshold of 0.5 nats, so llama.cpp's 4-bit arithmetic
# (mean KL 0.009 nats over the prompt) cannot flip it, and for the lab's 24
# tokens the greedy texts agree: the verdict is `none`. Give the engines 64
# tokens and they part at token 45, in the middle of a date, where the
# reference hesitated between "0" and "1" (margin 0.26 nats): a near-tie, the
# verdict `numerics`. The longer a greedy text, the likelier it meets a
# position where the model is unsure; the first divergence says where, and
# the margin there says whether arithmetic can explain it.
#
# What it printed on the 2-core machine the lab was written on (30 s):
#     --- max_new_tokens=24
#         config: config agrees
#      tokenizer: tokenizers agree
#       template: chat templates agree
#         logits: llama.cpp: argmax agrees at 100% of 5 positions, mean KL 0.0085, max |dlogp| 1.07
#     generation: greedy texts agree for 24 tokens
#     verdict: none | near tie: None
#     --- max_new_tokens=64
#         config: config agrees
#      tokenizer: tokenizers agree
#       template: chat templates agree
#         logits: llama.cpp: argmax agrees at 100% of 5 positions, mean KL 0.0085, max |dlogp| 1.07
#     generation: llama.cpp diverges from transformers at generated token 45: '1' vs '0' (reference top-2 margin 0.255 nats)
#     verdict: numerics | near tie: True
#     reference top-2 margin at the first answer token: 1.01 nats
#     llama.cpp's text: ' Rome.\n\nThe Roman Empire was a massive empire that spanned the Mediterranean region, from the
#     Mediterranean to the British Isles. It was founded by Romulus Augustus, who ruled Rome from 753 BCE to 510 CE. ...'
# (transformers wrote "500 CE" there.) The KL is the same in both runs: the
# logit check reads the prompt only, whatever the generation budget.
import lablib
from lablib.studies import compare as cmp

model = lablib.prepare()
engines = {name: lablib.load_engine(name, model) for name in ("transformers", "llama.cpp")}
try:
    for n in (24, 64):  # the lab's default budget, then a longer one: do the texts part further down?
        italy = cmp.compare(
            model,
            engines=["transformers", "llama.cpp"],
            prompt="The capital of Italy is",
            max_new_tokens=n,
            loaded=engines,
        )
        print(f"--- max_new_tokens={n}")
        for check in italy.checks:
            print(f"{check.name:>10}: {check.verdict}")
        print("verdict:", italy.verdict["layer"], "| near tie:", italy.verdict["near_tie"])
    # the reference's top-2 margin at each prompt position (nats); the last one picks the first answer token
    margins = italy.check("logits").details["stats"]["llama.cpp"]["margin_ref"]
    print("reference top-2 margin at the first answer token:", round(float(margins[-1]), 2), "nats")
    print("llama.cpp's text:", repr(italy.check("generation").table.set_index("engine").loc["llama.cpp", "text"]))
finally:
    for e in engines.values():
        e.close()
