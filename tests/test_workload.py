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


def test_prompt_helpers_take_a_model_by_name_and_refuse_what_is_no_prompt_in_one_message():
    """A notebook's slip: the model as its name, a length as text, token ids where text goes. Was: AttributeError
    "'str' object has no attribute 'hf_path'", TypeError from a comparison or a slice, the tokenizer's ValueError
    on its batch types; True ran as a 1-token prompt."""
    import numpy as np
    import pytest

    from lablib.errors import LabError

    model = lablib.prepare(log=lambda *_: None)
    # a name (or None, the default) is prepared as load_engine takes it: the same ids as the prepared model's
    assert prompt_of_length(str(model.source), 8) == prompt_of_length(model, 8) == prompt_of_length(None, 8)
    assert lablib.text_ids(None, "Hello there") == lablib.text_ids(model, "Hello there")
    assert prompt_of_length(model, np.int64(5)) == prompt_of_length(model, 5)
    for n in ("64", 2.5, True, 0):
        with pytest.raises(LabError, match=rf"n={n!r}: expected a prompt length in tokens, a whole number of at least"):
            prompt_of_length(model, n)
    with pytest.raises(LabError, match=r"offset=-1: expected a whole number of tokens into the corpus, 0 or more"):
        prompt_of_length(model, 4, offset=-1)
    with pytest.raises(LabError, match=r"text=\[1, 2\]: expected the prompt as text \(a str\); token ids go to"):
        lablib.text_ids(model, [1, 2])
    with pytest.raises(LabError, match=r"model=5: expected a model's name"):
        lablib.chat_ids(5, [{"role": "user", "content": "Hi"}])


def test_the_studies_a_notebook_calls_with_a_model_take_it_by_name_too():
    """roofline's weight figures, prefix.shared_prompts and anchors.batched_rows read a prepared model's files;
    given its name, None or a path they prepare it first, as load_engine does (was: AttributeError on 'hf_path',
    'path_for'), and refuse what is no model before running anything (batched_rows starts llama-batched-bench)."""
    import pytest

    from lablib.errors import LabError
    from lablib.studies import anchors, prefix, roofline

    model = lablib.prepare(log=lambda *_: None)
    assert roofline.weight_bytes_read(None, "llama.cpp") == roofline.weight_bytes_read(model, "llama.cpp")
    assert roofline.engine_profile(str(model.source), "llama.cpp") == roofline.engine_profile(model, "llama.cpp")
    assert prefix.shared_prompts(None, 16, 1) == prefix.shared_prompts(model, 16, 1)
    with pytest.raises(LabError, match=r"model=5: expected a model's name"):
        anchors.batched_rows(5, batches=(1,), pp=8, tg=2, threads=1)
