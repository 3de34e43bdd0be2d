"""transformers' compiled decoding (``load_engine("transformers", model, compile=True)``, issue 37 item 4) on the
real model: a static cache and the decode step compiled by torch.compile (mode "default" here on the CPU,
"reduce-overhead", CUDA graphs, on a GPU).

Greedy ids equal the eager engine's; the compile runs before a request's clock (t_submit is taken after it, so TTFT
and the queue wait leave it out) and is counted apart (``compile_s``), once per static cache length: a second
request of the same length compiles nothing (torch's own graph count unchanged), a longer one compiles a second
length. Combinations it cannot run are refused with one LabError, before anything compiles. Structure, not
timings: the compile's seconds and TTFT are only compared with each other (12-70 s against 0.1-0.5 s here).

One compiled engine for the module (each length compiles for about 70 s on 2 cores, 12-15 s once inductor's on-disk
cache holds its kernels); the eager engine is the session's ``hf``.
"""

from __future__ import annotations

import pytest

# setuptools' distutils shim settled at collection, before any test of this worker runs: in one fresh clone's run
# the first compile in a worker failed in _distutils_hack (stdlib distutils.core loaded instead of setuptools'),
# after other tests had run in that process; the engine imports it at load too (TransformersEngine._setup_compile)
import torch.utils.cpp_extension  # noqa: F401, I001

from lablib.engines import load_engine
from lablib.engines.base import Constraint, GenerationConfig
from lablib.errors import ContextOverflowError, LabError
from lablib.measure.workload import prompt_of_length
from lablib.results.trace import now
from lablib.studies.decoding.structured import REGEX

pytestmark = pytest.mark.engine
CFG = GenerationConfig(max_new_tokens=24)


def graphs() -> int:
    """Graphs torch.compile has made in this process (torch._dynamo's own count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.fixture(scope="module")
def compiled(model):
    e = load_engine("transformers", model, n_ctx=2048, compile=True)
    yield e
    e.close()


@pytest.fixture(scope="module")
def first(compiled, model):
    """The compiled engine's first request (it compiles the 256-token length): its trace, the time just before the
    call, and the counters after it."""
    before = now()
    trace = compiled.generate(prompt_of_length(model, 20), CFG)
    return trace, before, compiled.engine_counters()


def test_first_request_compiles_outside_its_clock_and_matches_eager(compiled, first, hf, model):
    trace, before, c = first
    assert c["static_cache_len"] == 256 and c["compiled_lengths"] == [256] and c["graphs_in_request"] == 0
    assert c["compile_s_request"] > 0 and c["compile_s"] == c["compile_s_request"] == compiled.compile_s
    # t_submit is taken after the compile: the queue wait and TTFT leave it out
    assert trace.t_submit - before >= c["compile_s_request"]
    assert trace.ttft_s < c["compile_s_request"] and trace.output_tokens == CFG.max_new_tokens
    assert trace.token_ids == hf.generate(prompt_of_length(model, 20), CFG).token_ids
    flags = compiled.info().flags["compile"]
    assert flags["mode"] == "default" and flags["dynamic"] is False and flags["compiled_lengths"] == [256]
    assert flags["compile_s"] == pytest.approx(c["compile_s"], abs=1e-3)
    # the request held the whole static cache, as kv_cache_bytes predicts for compile=True
    assert compiled.last_kv_bytes == compiled.kv_cache_bytes(model, 44, compile=True, n_ctx=2048) > 0
    assert compiled.kv_cache_bytes(model, 44, compile=True) == 2 * compiled.kv_cache_bytes(model, 128)


def test_same_length_compiles_nothing_and_sampling_and_constraints_run(compiled, first, hf, model):
    total, made = compiled.compile_s, graphs()
    ids = prompt_of_length(model, 100)  # another prompt length, the same static length (256)
    trace = compiled.generate(ids, CFG)
    c = compiled.engine_counters()
    assert c["static_cache_len"] == 256 and c["compile_s_request"] == 0.0 and c["compile_s"] == total
    assert graphs() == made and c["graphs_in_request"] == 0, "torch compiled again for a length it had"
    # threads stay those it loaded with: torch.compile guards on the count, so another engine's change is undone
    import torch

    assert compiled.auto_threads is False and compiled.info().flags["threads_auto"] is False
    torch.set_num_threads(1 if compiled.threads != 1 else 2)
    compiled.generate(ids, CFG)
    assert torch.get_num_threads() == compiled.threads and compiled.engine_counters()["graphs_in_request"] == 0
    assert trace.token_ids == hf.generate(ids, CFG).token_ids
    sampled = GenerationConfig(max_new_tokens=8, temperature=0.8, top_k=40, seed=3)
    assert compiled.generate(ids, sampled).output_tokens == 8
    constrained = GenerationConfig(max_new_tokens=12, ignore_eos=False, constraint=Constraint.regex(REGEX, "code"))
    q = hf.tokenize("A product code:")
    assert compiled.generate(q, constrained).token_ids == hf.generate(q, constrained).token_ids
    assert compiled.compile_s == total and graphs() == made


def test_longer_request_compiles_a_second_length(compiled, first, hf, model):
    total = compiled.compile_s
    ids = prompt_of_length(model, 300)  # 300 + 24 tokens: the 512-token length
    trace = compiled.generate(ids, CFG)
    c = compiled.engine_counters()
    assert c["static_cache_len"] == 512 and c["compiled_lengths"] == [256, 512]
    assert c["compile_s_request"] > 0 and c["compile_s"] == pytest.approx(total + c["compile_s_request"])
    assert trace.ttft_s < c["compile_s_request"]
    assert trace.token_ids == hf.generate(ids, CFG).token_ids
    made = graphs()
    compiled.generate(prompt_of_length(model, 20), CFG)  # back to 256: compiled already
    assert compiled.engine_counters()["compile_s_request"] == 0.0 and graphs() == made


def test_refusals_compile_nothing(compiled, first, model):
    lengths = list(compiled.compiled_lengths)
    cache = compiled.cache_prefix(prompt_of_length(model, 16))
    with pytest.raises(LabError, match="compile=True runs no prefix cache"):
        compiled.generate(prompt_of_length(model, 20), CFG, prefix_cache=cache)
    with pytest.raises(LabError, match="compile=True has no batched mode"):
        compiled.batch_session(CFG, 2, 256)
    with pytest.raises(ContextOverflowError):
        compiled.generate(prompt_of_length(model, 2040), CFG)
    assert compiled.compiled_lengths == lengths


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"compile": True, "draft": "bfloat16"}, "compile=True with draft=/prompt_lookup="),
        ({"compile": True, "prompt_lookup": 3}, "compile=True with draft=/prompt_lookup="),
        ({"static_cache_len": 512}, "static_cache_len=512 without compile=True"),
        ({"compile": True, "static_cache_len": 0}, "static_cache_len=0: expected a positive whole number"),
        ({"compile": "yes"}, "compile='yes': expected True"),
        ({"compile": True, "static_cache_len": 4096, "n_ctx": 2048}, "more than the context the lab enforces"),
    ],
)
def test_bad_load_options(model, kw, match):
    with pytest.raises(LabError, match=match):
        load_engine("transformers", model, **kw)


def test_fixed_static_length_refuses_a_longer_request(model):
    e = load_engine("transformers", model, n_ctx=2048, compile=True, static_cache_len=64)
    assert e.static_length(20, 24) == 64 and e.info().flags["compile"]["static_cache_len"] == 64
    with pytest.raises(LabError, match=r"more than the static cache this engine compiles for \(static_cache_len=64\)"):
        e.generate(prompt_of_length(model, 50), CFG)
    assert e.compiled_lengths == [] and e.compile_s == 0.0
    e.close()


def test_powers_of_two_up_to_n_ctx(compiled):
    assert [compiled.static_length(p, 24) for p in (1, 232, 233, 1000, 2024)] == [256, 256, 512, 1024, 2048]


def test_a_model_with_sliding_window_layers_is_refused_before_loading():
    """Gemma 3's sliding layers keep their position as a Python int in transformers' static cache, and torch.compile
    guards on it: compiled, every decode step made a new graph until torch's recompile limit, then ran eagerly while
    the engine still said it was compiled (found by trying it: 3 graphs inside the first measured request)."""
    from lablib.model.resolve import prepare

    gemma = prepare("gemma-3-270m", log=lambda *_: None)
    with pytest.raises(LabError, match="sliding-window layers recompile the decode step at every position"):
        load_engine("transformers", gemma, compile=True)
