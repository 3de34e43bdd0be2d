"""lablib.studies.quality: the statistics of llama.cpp's perplexity tool, checked on values worked by hand."""

import math

import numpy as np
import pytest

from lablib.errors import LabError
from lablib.studies import quality
from lablib.studies.logits import log_softmax


def logp(*rows):
    return np.log(np.array(rows, dtype=np.float64))


def test_kl_ppl_top1_dp_by_hand():
    ref = logp([0.5, 0.25, 0.25], [0.9, 0.05, 0.05])
    q = logp([0.25, 0.5, 0.25], [0.9, 0.05, 0.05])
    targets = [1, 0]
    s = quality.token_stats(ref, q, targets)
    # KL(ref||q), row 0: 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0 = 0.25 ln 2
    assert s["kl"] == pytest.approx([0.25 * math.log(2), 0.0], abs=1e-12)
    assert s["nll"] == pytest.approx([-math.log(0.5), -math.log(0.9)])
    assert s["nll_ref"] == pytest.approx([-math.log(0.25), -math.log(0.9)])
    assert list(s["same_top"]) == [False, True]
    assert s["dp"] == pytest.approx([0.25, 0.0])  # p_q(target) - p_ref(target)
    assert s["dp_top"] == pytest.approx([-0.25, 0.0])  # at the reference's top token
    out = quality.summarize([s])
    assert out["ppl"] == pytest.approx(math.exp((-math.log(0.5) - math.log(0.9)) / 2))
    assert out["ppl_ref"] == pytest.approx(math.exp((-math.log(0.25) - math.log(0.9)) / 2))
    assert out["kl_mean"] == pytest.approx(0.125 * math.log(2))
    assert out["kl_max"] == pytest.approx(0.25 * math.log(2))
    assert out["top1"] == 0.5 and out["n_tokens"] == 2
    assert out["dp_top_abs_mean"] == pytest.approx(0.125)
    assert out["dp_rms"] == pytest.approx(math.sqrt(0.25**2 / 2))


def test_log_softmax_of_large_logits_is_stable_and_normalized():
    x = np.array([[1000.0, 1000.0, 0.0], [-5.0, 0.0, 5.0]])
    lp = log_softmax(x)
    assert np.isfinite(lp).all()
    assert np.exp(lp).sum(axis=1) == pytest.approx([1.0, 1.0])
    assert lp[0, 0] == pytest.approx(math.log(0.5))


def test_chunks_follow_llama_perplexity():
    ids = list(range(100, 100 + 5 * 32 + 7))
    chunks = quality.perplexity_chunks(ids, 32, bos=1)
    assert len(chunks) == 5 and all(len(c) == 32 for c in chunks)
    assert chunks[1][0] == 1 and chunks[1][1:] == ids[33:64]  # first token of each chunk becomes BOS
    assert quality.perplexity_chunks(ids, 32, n_chunks=2)[1] == ids[32:64]
    sl = quality.scored_positions(32)
    assert (sl.start, sl.stop) == (16, 31)  # logits at 16..30 predict tokens 17..31


def test_too_short_text_is_refused_with_the_rule():
    with pytest.raises(LabError, match="needs at least 64"):
        quality.perplexity_chunks(list(range(50)), 32)


LLAMA_PERPLEXITY_TAIL = """
====== Perplexity statistics ======
Mean PPL(Q)                   :  23.128917 ±   5.146844
Mean PPL(base)                :  22.605751 ±   5.005790
====== KL divergence statistics ======
Mean    KLD:   0.003999 ±   0.000294
Maximum KLD:   0.023700
99.9%   KLD:   0.023161
99.0%   KLD:   0.015781
====== Token probability statistics ======
Mean    Δp: -0.111 ± 0.152 %
RMS Δp    :  1.326 ± 0.189 %
Same top p: 96.032 ± 1.746 %
"""


def test_parse_llama_perplexity_output():
    out = quality.parse_kld_output(LLAMA_PERPLEXITY_TAIL)
    assert out == pytest.approx(
        {
            "ppl": 23.128917,
            "ppl_ref": 22.605751,
            "kl_mean": 0.003999,
            "kl_max": 0.0237,
            "kl_p99": 0.015781,
            "top1": 0.96032,
            "dp_mean": -0.00111,
            "dp_rms": 0.01326,
        }
    )


def test_pareto_front_keeps_only_undominated_rungs():
    import pandas as pd

    from lablib.plots.quant import pareto_front, quality_vs_size, type_mix

    df = pd.DataFrame(
        {
            "type": ["A", "B", "C", "D"],
            "bytes": [100, 200, 300, 400],
            "kl_mean": [0.5, 0.6, 0.1, 0.01],
            "engine": "llama.cpp",
            "tensor_types": ['[{"type": "Q8_0", "n_elements": 3}, {"type": "F32", "n_elements": 1}]'] * 4,
        }
    )
    assert list(pareto_front(df, "bytes", "kl_mean", higher_is_better=False)["type"]) == ["A", "C", "D"]
    fig = quality_vs_size(df)
    assert list(fig.data[-1].x) == [100, 300, 400]
    bars = {b.name: list(b.y) for b in type_mix(df).data}
    assert bars == {"Q8_0": [75.0] * 4, "F32": [25.0] * 4}
