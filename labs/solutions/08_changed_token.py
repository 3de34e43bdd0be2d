# Solution · lab 08 · one changed token at the start.
#
# The KV of token i depends on every token before it (causal attention), so a
# cache is valid only up to the first token that differs. Change the first
# token and nothing can be reused (cached 0: the whole prompt is prefilled);
# change token 128 of 256 and the first 128 are reused. The order of a prompt
# therefore matters for caching: put what never changes first (instructions,
# tool definitions, documents), what changes per request last (the date, the
# user's name, the question). Providers' prompt-caching guides say the same.
import lablib
from lablib.engines.base import GenerationConfig

model = lablib.prepare()
llama = lablib.load_engine("llama.cpp", model, n_ctx=1024)
shared = lablib.prompt_of_length(model, 256, offset=3000)
question = lablib.chat_ids(model, [{"role": "user", "content": "What is the main idea of the text above?"}])
kept = llama.cache_prefix(shared + question)
cfg = GenerationConfig(max_new_tokens=4)
for where in (0, 128):
    changed = list(shared)
    changed[where] = lablib.prompt_of_length(model, 1, offset=7000)[0]  # another token of text
    tr = llama.generate(changed + question, cfg, prefix_cache=kept)
    print(
        f"token {where} changed: {tr.cached_tokens} of {tr.prompt_tokens} tokens cached, "
        f"{llama.engine_counters()['n_p_eval']} evaluated, TTFT {tr.ttft_s * 1000:.0f} ms"
    )
llama.close()
