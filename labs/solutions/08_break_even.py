# Solution · lab 08 · when does reuse stop paying?
#
# With reuse, TTFT is about the prefill of the question's turn (19 tokens here)
# plus the restore of the cached KV (llama.cpp copies 23 KB a token: a memory
# copy, microseconds per token) plus the first sampling step. Without reuse it
# is the prefill of the system turn (S + 5 tokens) and the question's turn
# together. For a prefill whose cost grows with its tokens the speedup is about
# (S + 5 + 19) / 19: 1.5 at S = 4, 1.7 at S = 8, 2.1 at S = 16, 2.9 at S = 32.
# One run here (median of 9 requests each) measured 1.4, 1.6, 2.0 and 2.8:
# slightly below the proportion, because a prefill call has a fixed cost that
# reuse does not remove. On llama.cpp, with its cheap restore, reuse paid even
# at S = 4; the gain of a few milliseconds is, though, within the run-to-run
# noise of a shared machine, and a server also pays to find the prefix (vLLM
# hashes whole blocks of 16 tokens and never caches a partial block).
# The prediction "TTFT with reuse ~ TTFT of the question's turn alone" holds to
# within that noise.
import lablib
from lablib.engines.base import GenerationConfig
from lablib.results import tables
from lablib.studies import prefix

model = lablib.prepare()
df = prefix.shared_prefix(model, engines=["llama.cpp"], shared_tokens=[4, 8, 16, 32], reps=3, progress=False)
print(tables.prefix_medians(df).round(3).to_string(index=False))

shared, (ids,) = prefix.shared_prompts(model, 4, questions=1)
question = ids[len(shared) :]  # the question's turn alone
llama = lablib.load_engine("llama.cpp", model, n_ctx=512)
cfg = GenerationConfig(max_new_tokens=4)
llama.generate(question, cfg)  # warm-up
alone = sorted(llama.generate(question, cfg).ttft_s for _ in range(3))[1]
llama.close()
print(f"prediction: TTFT with reuse ~ TTFT of the {len(question)}-token question turn alone = {alone * 1000:.0f} ms")
