"""lablib.measure.workload.distinct_prompts: the one helper for prompts that share no prefix."""

import lablib
from lablib.measure.workload import DISTINCT_GAP, distinct_prompts, prompt_of_length


def _common_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_distinct_prompts_are_exact_cuts_that_share_no_prefix():
    model = lablib.prepare(log=lambda *_: None)
    prompts = distinct_prompts(model, 48, 6, start=100)
    assert [len(p) for p in prompts] == [48] * 6
    # the documented offsets: start, then every n + DISTINCT_GAP tokens of the corpus
    assert prompts[3] == prompt_of_length(model, 48, offset=100 + 3 * (48 + DISTINCT_GAP))
    longest = max(_common_prefix(a, b) for i, a in enumerate(prompts) for b in prompts[i + 1 :])
    assert longest < 4, f"two prompts share a {longest}-token prefix: a server's prefix cache could reuse it"
