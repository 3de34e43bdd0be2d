"""The transformers engine on whatever transformers 5.x is installed, where its API moved within the pin
(pyproject's ``transformers>=5.11,<6``; issue 37): batched mode's settings reach the continuous-batching manager
under that version's names (lablib.engines.hf.continuous_batching_config: page_size from 5.18, block_size
before), batched greedy decoding gives the ids serial decoding gives, and the KV cache reaches the forward under
its keyword (``cache`` from 5.24, ``past_key_values`` before: a wrong name is swallowed silently).

Meant to pass at both ends of the pin, the lowest transformers as well as the newest. Real model, real
transformers, a few tokens: seconds on two cores.
"""

import dataclasses

import numpy as np
import pytest

from lablib.engines.base import GenerationConfig
from lablib.engines.hf import CB_MIN_TRANSFORMERS, continuous_batching_config
from lablib.errors import LabError
from lablib.measure.closed_loop import run_closed_loop
from lablib.measure.workload import prompt_of_length


def test_the_pin_starts_where_batched_mode_works():
    """pyproject's floor for transformers is the lab's batched-mode floor, and the installed one is above it."""
    import tomllib
    from pathlib import Path

    import transformers
    from packaging.requirements import Requirement
    from packaging.version import Version

    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    (pin,) = [Requirement(r) for r in extra["optional-dependencies"]["transformers"] if r.startswith("transformers")]
    assert [Version(s.version) for s in pin.specifier if s.operator == ">="] == [Version(CB_MIN_TRANSFORMERS)]
    assert Version(transformers.__version__) >= Version(CB_MIN_TRANSFORMERS)


def test_the_session_hands_its_settings_to_the_manager(hf):
    """Page size, cache size, no safety margin, requests per batch: what the manager resolved is what the lab
    asked, under either name of the page size; the model gets its own attention back when the session closes."""
    attn = hf.hf.config._attn_implementation
    session = hf.batch_session(GenerationConfig(max_new_tokens=4), max_sequences=3, max_seq_tokens=40)
    try:
        cb = session.manager.continuous_batching_config
        fields = {f.name for f in dataclasses.fields(cb)}
        page = cb.page_size if "page_size" in fields else cb.block_size
        assert page == 32
        assert cb.num_blocks == 3 * (2 + 1)  # 40 tokens in pages of 32, plus one spare page, per sequence
        assert cb.allow_block_sharing is False and cb.max_requests_per_batch == 3
        scheduler = session.manager.batch_processor.scheduler
        assert scheduler.safety_margin == 0.0 and scheduler.max_requests_per_batch == 3
        assert "flash" not in hf.hf.config._attn_implementation  # the model's own attention, paged or not
        assert f"attn {hf.hf.config._attn_implementation}" in session.stats["impl"]
    finally:
        session.close()
    assert hf.hf.config._attn_implementation == attn


def test_an_unknown_setting_is_refused_by_name():
    from transformers import ContinuousBatchingConfig

    with pytest.raises(LabError, match=f"no not_a_setting; .*transformers >= {CB_MIN_TRANSFORMERS}"):
        continuous_batching_config(ContinuousBatchingConfig, page_size=32, not_a_setting=1)


def test_batched_greedy_ids_equal_serial_greedy_ids(hf, model):
    """Three prompts of different lengths, three at once in one paged cache, against one at a time."""
    cfg = GenerationConfig(max_new_tokens=5)
    prompts = [prompt_of_length(model, n, offset=131 * i) for i, n in enumerate((9, 17, 26))]
    run = run_closed_loop(hf, prompts, 3, "batched", cfg)
    assert run.stats.max_sequences_per_step == 3, run.stats
    batched = [t.token_ids for t in run.traces]
    serial = [hf.generate(p, cfg).token_ids for p in prompts]
    assert batched == serial
    assert all(len(ids) == 5 for ids in batched)


def test_chunked_logits_equal_one_pass(hf, model):
    """Teacher-forced logits in chunks of 16 over one cache equal one forward pass over all 40 positions: the
    cache reached the forward (without it, each chunk after the first would be computed without its context)."""
    ids = prompt_of_length(model, 40)
    chunked = np.concatenate(list(hf.iter_logits(ids, chunk=16)))
    whole = np.concatenate(list(hf.iter_logits(ids, chunk=64)))
    assert chunked.shape == whole.shape == (40, hf.n_vocab)
    np.testing.assert_allclose(chunked, whole, atol=1e-3)
