"""The lab's one definition of sampling, and its reference implementation (numpy).

Every engine and mode draws the next token the same way (:data:`DEFINITION`):

1. ``temperature`` 0: greedy, the token with the highest logit (argmax). Nothing else applies.
2. otherwise, on the logits of the last position (float, [vocab]):
   a. temperature: logits / temperature
   b. top-k (``top_k`` 0 = off): keep the ``top_k`` highest tempered logits
   c. top-p (``top_p`` 1 = off): softmax of what is left; keep the smallest set of most
      probable tokens whose probability sums to at least ``top_p`` (a token is kept when the
      tokens more probable than it hold less than ``top_p``; at least one token)
   d. softmax over the tokens kept, draw one.

This is the order of transformers' own warpers (TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper) and of vLLM; llama.cpp gets it as a sampler chain (temp, top_k, top_p,
dist) and mlx-lm as a composition of its filters (mlx-lm's ``make_sampler`` applies top-p
*before* the temperature, a different distribution, so it is not used for sampling).
Nothing else applies: no repetition/presence/frequency penalty, min-p, typical-p, minimum
length, suppressed or forced tokens, whatever a model folder or a library default asks for.
"""

from __future__ import annotations

DEFINITION = (
    "greedy (argmax) if temperature == 0; else logits / temperature -> top-k (0 = off) -> "
    "top-p on the softmax of what is left (smallest most-probable set with mass >= top_p; 1 = off) "
    "-> softmax -> draw; no penalties or other filters"
)


def probabilities(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """The next-token distribution of :data:`DEFINITION` for one position's ``logits``
    ([vocab], any float): a float64 numpy array [vocab] summing to 1 (one-hot when greedy)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    p = np.zeros_like(x)
    if temperature == 0:
        p[int(np.argmax(x))] = 1.0
        return p
    x = x / temperature
    order = np.argsort(-x, kind="stable")  # most probable first
    keep = order if not top_k or top_k >= x.size else order[:top_k]
    z = np.exp(x[keep] - x[keep[0]])
    q = z / z.sum()
    if top_p < 1.0:
        above = np.concatenate(([0.0], np.cumsum(q)[:-1]))  # mass of the tokens more probable
        n = max(1, int((above < top_p).sum()))
        keep, q = keep[:n], q[:n] / q[:n].sum()
    p[keep] = q
    return p


def check_draws(draws, expected, allowed=None, alpha: float = 1e-3, min_expected: float = 5.0) -> dict:
    """Do ``draws`` (token ids) come from ``expected`` (probabilities [vocab], e.g. from
    :func:`probabilities` on the engine's own logits)? Pearson's chi-square goodness-of-fit test.

    Bins: each token whose expected count ``N p`` is at least ``min_expected``, one bin pooling
    the rest of the support (merged into the smallest bin when its own expected count is below
    ``min_expected``). ``allowed`` (bool [vocab], default: the support ``expected > 0``) is what a
    correct engine may draw at all; tokens allowed but outside the support (a near-boundary
    token, kept or cut by a rounding difference) count in the pooled bin. The test fails when
    any draw is outside ``allowed`` (a filter the definition does not have, or one missing) or
    when the statistic exceeds the chi-square quantile 1 - ``alpha`` for (bins - 1) degrees
    of freedom (Wilson and Hilferty's approximation, 1931): under the right distribution a
    false alarm has probability about ``alpha`` (asymptotically; each bin expects >= 5 draws).

    Returns {ok, n, bins, chi2, limit, outside (draws not allowed), top (expected vs observed
    counts of the binned tokens)}.
    """
    import math
    from statistics import NormalDist

    import numpy as np

    draws = np.asarray(draws, dtype=np.int64)
    p = np.asarray(expected, dtype=np.float64)
    n = len(draws)
    allowed = p > 0 if allowed is None else np.asarray(allowed, dtype=bool)
    outside = int((~allowed[draws]).sum())
    counts = np.bincount(draws, minlength=p.size)
    singles = np.flatnonzero(n * p >= min_expected)
    singles = singles[np.argsort(-p[singles])]
    obs = [float(counts[t]) for t in singles]
    exp = [n * float(p[t]) for t in singles]
    rest_mask = allowed.copy()
    rest_mask[singles] = False
    rest_obs, rest_exp = float(counts[rest_mask].sum()), n * float(p[rest_mask].sum())
    if rest_exp >= min_expected or not obs:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:  # too little left to stand alone: pool it with the least probable single token
        obs[-1] += rest_obs
        exp[-1] += rest_exp
    obs, exp = np.array(obs), np.array(exp)
    chi2 = float(((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum())
    df = max(len(obs) - 1, 1)
    z = NormalDist().inv_cdf(1 - alpha)
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    top = [{"token": int(t), "expected": round(n * float(p[t]), 1), "observed": int(counts[t])} for t in singles]
    return {
        "ok": outside == 0 and chi2 <= limit,
        "n": n,
        "bins": len(obs),
        "chi2": chi2,
        "limit": limit,
        "outside": outside,
        "top": top,
    }
