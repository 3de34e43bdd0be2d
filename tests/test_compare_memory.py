"""compare stays within memory: the logit checks stream over positions (never positions x
vocabulary), and the memory guard covers a whole comparison before any engine loads."""

import tracemalloc

import numpy as np
import pytest

from lablib.errors import LabError
from lablib.measure.workload import prompt_of_length
from lablib.studies import compare as cmp, logits


@pytest.fixture(scope="module")
def llamas(model):
    """Two llama.cpp engines (one thread each); the second decodes 100 tokens per batch, so its
    logits come in blocks that are not the comparison's 64-position blocks."""
    from lablib.engines import load_engine

    a = load_engine("llama.cpp", model, n_ctx=1024, threads=1)
    b = load_engine("llama.cpp", model, n_ctx=1024, n_batch=100, threads=1)
    yield a, b
    a.close()
    b.close()


def test_streamed_statistics_equal_the_whole_array_ones(model, llamas):
    a, b = llamas
    ids = prompt_of_length(model, 300)  # 4 blocks of 64 and one of 44
    check = cmp.check_logits({"a": a, "b": b}, "a", ids)
    got = check.details["stats"]["b"]
    want = logits.logit_stats(a.logits(ids), b.logits(ids))
    assert set(got) == set(want) and len(got["kl"]) == 300
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-9, err_msg=key)
    assert check.table.iloc[0]["positions"] == 300


def _peak_mib(fn) -> float:
    """Peak of the memory Python and numpy allocate while ``fn`` runs (tracemalloc), MiB."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_logit_check_memory_does_not_grow_with_positions(model, llamas):
    """Before: about 2.4 MiB per position (float32 logits of two engines, float64 statistics);
    streamed: the same peak at 256 and 1,024 positions (4x as many: held whole, about 0.6 GiB more)."""
    a, b = llamas
    short = _peak_mib(lambda: cmp.check_logits({"a": a, "b": b}, "a", prompt_of_length(model, 256)))
    long = _peak_mib(lambda: cmp.check_logits({"a": a, "b": b}, "a", prompt_of_length(model, 1024)))
    per_position = 49152 * (2 * 4 + 8)  # bytes one position would cost held whole
    assert long - short < 0.05 * (1024 - 256) * per_position / 2**20  # < 5 % of what holding them costs
    assert long < 64 * 49152 * 8 * 12 / 2**20  # a few float64 blocks of 64 positions


def test_the_last_position_logits_are_streamed(model, llamas):
    a, _ = llamas
    ids = prompt_of_length(model, 200)
    np.testing.assert_array_equal(logits.last_logits(a, ids), a.logits(ids)[-1])


def test_the_logit_part_of_the_estimate_does_not_grow_with_tokens(model):
    from lablib.engines import ENGINES
    from lablib.engines.memory import compare_bytes, kv_cache_bytes

    names = ["transformers", "llama.cpp", "mlx"]
    engines = [ENGINES[n] for n in names]
    short, long = compare_bytes(model, engines, 256), compare_bytes(model, engines, 4096)
    assert short["logits"] == long["logits"] > 0
    assert short["weights"] == long["weights"] > 0
    kv = sum(kv_cache_bytes(model, ENGINES[e], 4096 - 256) for e in ("transformers", "mlx"))
    assert long["kv_cache"] - short["kv_cache"] == kv  # llama.cpp's is reserved at load, for its n_ctx
    assert compare_bytes(model, engines, 4096, loaded=names)["weights"] == 0


def test_compare_checks_memory_before_loading_any_engine(model, monkeypatch):
    from lablib.machine import limits

    monkeypatch.setattr(limits, "available_ram_bytes", lambda: 300 * 2**20)
    with pytest.raises(
        LabError,
        match=r"memory: comparing transformers, llama.cpp on 2056 tokens needs about "
        r"\d+ MiB .* but 300 MiB is available\. To fit: compare fewer engines",
    ):
        cmp.compare(model, engines=["transformers", "llama.cpp"], ids=prompt_of_length(model, 2048), max_new_tokens=8)


def test_compare_refuses_a_prompt_longer_than_a_context(model, llamas):
    a, _ = llamas
    with pytest.raises(LabError, match=r"context overflow on llama.cpp: prompt 2045 \+ output 8 = 2053"):
        cmp.compare(
            model,
            engines=["llama.cpp"],
            reference="llama.cpp",
            ids=[1] + [28] * 2044,
            max_new_tokens=8,
            loaded={"llama.cpp": a},
        )
