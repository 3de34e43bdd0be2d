"""Logit math: log-probabilities, per-position statistics of two distributions, logits in blocks.

One home for what :mod:`lablib.studies.compare` (engine against engine, lab 04) and
:mod:`lablib.studies.quality` (a quantized file against its reference, lab 06) both compute:

- :func:`log_softmax`: log-probabilities (nats) from logits, float64;
- :func:`logit_stats`: per position, KL(ref || other), max |dlogp|, the argmax and top-k of each;
- :func:`logit_blocks` and :func:`last_logits`: teacher-forced logits streamed ``chunk`` positions at a
  time from an engine's :meth:`~lablib.engines.base.Engine.iter_logits`, so a caller never holds
  [positions, vocab] at once.
"""

from __future__ import annotations

import collections

TOP_K = 5  # the top-k ids and log-probs kept per position
LOGIT_CHUNK = 64  # positions per block: 64 x 49,152 floats x 8 bytes = 24 MiB a float64 array


def log_softmax(logits):
    """Log-softmax over the last axis (a [vocab] row or [n, vocab] rows), float64 (nats)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _top_k(lp, k: int):
    """Ids of the ``k`` largest values per row, largest first: a new [rows, k] array (a slice of a
    full argsort would keep the whole [rows, vocab] index array alive)."""
    import numpy as np

    part = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
    order = np.argsort(-np.take_along_axis(lp, part, -1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, -1)


def logit_stats(ref_logits, logits, k: int = TOP_K) -> dict:
    """Per-position comparison of two [positions, vocab] logit arrays.

    Returns arrays over positions: ``kl`` (KL(ref || other), nats),
    ``max_abs_dlogp``, ``argmax_ref``, ``argmax``, ``margin_ref`` (reference's
    top-1 minus top-2 log-prob), ``topk_ref``/``topk`` ids and their log-probs.
    """
    import numpy as np

    lp_ref, lp = log_softmax(ref_logits), log_softmax(logits)
    p_ref = np.exp(lp_ref)
    kl = (p_ref * (lp_ref - lp)).sum(axis=-1)
    del p_ref
    order_ref, order = _top_k(lp_ref, k), _top_k(lp, k)
    top2 = np.take_along_axis(lp_ref, order_ref[:, :2], axis=-1)
    return {
        "kl": kl,
        "max_abs_dlogp": np.abs(lp_ref - lp).max(axis=-1),
        "argmax_ref": order_ref[:, 0],
        "argmax": order[:, 0],
        "margin_ref": top2[:, 0] - top2[:, 1],
        "topk_ref": order_ref,
        "topk_ref_logp": np.take_along_axis(lp_ref, order_ref, -1),
        "topk": order,
        "topk_logp": np.take_along_axis(lp, order, -1),
    }


def logit_blocks(engine, ids: list[int], chunk: int = LOGIT_CHUNK):
    """Teacher-forced logits of ``ids`` through ``engine`` as float32 arrays of exactly ``chunk``
    positions (the last may be shorter), re-cut from the blocks of the engine's
    :meth:`~lablib.engines.base.Engine.iter_logits` (whose default slices :meth:`logits`). Raises
    NotImplementedError at the first block when the engine has no logits."""
    import numpy as np

    held, n = [], 0
    for block in engine.iter_logits(ids, chunk):
        held.append(block)
        n += len(block)
        while n >= chunk:
            rows = np.concatenate(held) if len(held) > 1 else held[0]
            yield rows[:chunk]
            held, n = ([rows[chunk:]] if len(rows) > chunk else []), len(rows) - chunk
    if n:
        yield np.concatenate(held) if len(held) > 1 else held[0]


def last_logits(engine, ids: list[int], chunk: int = LOGIT_CHUNK):
    """The logits of the last position of ``ids`` ([vocab], float32), streamed (never [positions, vocab])."""
    (last,) = collections.deque(logit_blocks(engine, ids, chunk), maxlen=1)  # earlier blocks dropped as they come
    return last[-1]
