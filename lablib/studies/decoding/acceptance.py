"""Lab 10, what speculation's counters say: acceptance, tokens per target pass and the speedup Leviathan et al.
predict from them, per request and per engine x method x draft x k x text x concurrency. Pure functions of an
engine's counters and the rows :mod:`lablib.studies.decoding.speculative` measures (dicts); no engine here.

The prediction (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
eq. 1 and Theorem 3.8): with acceptance rate alpha (i.i.d. per token), ``k`` drafted tokens per step and a draft
costing ``c`` target passes per token, a step yields (1 - alpha^(k+1)) / (1 - alpha) tokens and costs k*c + 1
target passes: speedup = tokens per step / cost per step (:func:`predicted_speedup`).
"""

from __future__ import annotations

import statistics

from lablib.checks import csv_list, whole
from lablib.errors import LabError

BURST_GAP_S = 1e-3  # token stamps closer than this (s) arrived together: one verified run (a decode step is >= 5 ms)
NONE = "none"  # spec_method of the plain rows


# --- the prediction ----------------------------------------------------------------------------------------
def _alpha(alpha) -> float:
    a = float(alpha)
    if not 0 <= a <= 1:
        raise LabError(f"acceptance rate alpha={alpha!r}: expected a share from 0 to 1 (accepted / drafted tokens)")
    return a


def check_k(k) -> int:
    """``k`` (draft tokens per step) as an int >= 1; LabError otherwise (k=0 is no speculation: the plain rows)."""
    return whole(k, "draft length k", "a whole number of draft tokens per step, at least 1 (k=0: no speculation)")


def parse_ks(ks) -> list[int]:
    """Draft lengths from a list or a comma-separated string ("2,4"), each checked by :func:`check_k`."""
    if isinstance(ks, str):
        ks = csv_list(ks, "ks")
    if isinstance(ks, int):
        ks = [ks]
    out = [check_k(int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k) for k in (ks or [])]
    if not out:
        raise LabError(f"draft lengths {ks!r}: expected at least one, e.g. 2,4")
    return list(dict.fromkeys(out))


def expected_tokens_per_pass(alpha, k) -> float:
    """Tokens a speculative step yields in expectation: (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023,
    eq. 1), k + 1 at alpha = 1."""
    a, k = _alpha(alpha), check_k(k)
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(alpha, k, c) -> float:
    """Leviathan et al.'s expected walltime improvement: tokens per step / (k*c + 1), ``c`` the draft's cost per
    token relative to one target pass (0: free, a lookup)."""
    if c is None or float(c) < 0:
        raise LabError(f"draft cost c={c!r}: expected 0 or more (draft TPOT / target TPOT)")
    return expected_tokens_per_pass(alpha, k) / (check_k(k) * float(c) + 1)


def _median_tpot(rows) -> float | None:
    """The median TPOT (s) of the ``rows`` that have one: a request whose tokens all came at one instant (one
    verified run holding every token) has none (:attr:`lablib.results.trace.RequestTrace.decode_unseen`)."""
    vals = [r["tpot_s"] for r in rows if r.get("tpot_s") is not None and r["tpot_s"] == r["tpot_s"]]
    return statistics.median(vals) if vals else None


# --- rows ----------------------------------------------------------------------------------------------------
def arrivals(t_tokens) -> tuple[int, int]:
    """(arrivals, most tokens in one): token stamps less than :data:`BURST_GAP_S` apart are one arrival."""
    if not t_tokens:
        return 0, 0
    sizes = [1]
    for a, b in zip(t_tokens, t_tokens[1:]):
        if b - a < BURST_GAP_S:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return len(sizes), max(sizes)


def first_divergence(a, b) -> int | None:
    """The first index where token lists ``a`` and ``b`` differ (the shorter's length if one is a prefix of the
    other and they differ in length); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def spec_fields(counters: dict, output_tokens: int) -> dict:
    """The speculative columns from an engine's counters: ``draft_n``, ``draft_n_accepted``, ``acceptance``
    (accepted / drafted; None when the engine does not say how many it drafted), ``target_passes`` (as counted,
    else output - accepted), ``tokens_per_pass`` (output / (output - accepted), or the engine's own where it counts
    it: mlx, whose last round can end at the budget without a token of its own), per pass drafted and accepted."""
    drafted, accepted = counters.get("draft_n"), counters.get("draft_n_accepted")
    if drafted is not None and accepted is not None and not 0 <= accepted <= drafted:
        raise LabError(
            f"speculation counters drafted={drafted}, accepted={accepted}: expected 0 <= accepted <= drafted"
        )
    passes = output_tokens - accepted if accepted is not None else None
    return {
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "acceptance": (accepted / drafted) if drafted else None,
        "target_passes": counters.get("target_passes", passes),
        "tokens_per_pass": counters.get("tokens_per_pass") or ((output_tokens / passes) if passes else None),
        "drafted_per_pass": counters.get("drafted_per_pass"),
        "accepted_per_pass": counters.get("accepted_per_pass"),
    }


def _metric_delta(before: dict, after: dict) -> dict:
    out = {k: int(after[k] - before.get(k, 0)) for k in ("draft_n", "draft_n_accepted") if k in after}
    if "drafts" in after:
        out["drafts"] = int(after["drafts"] - before.get("drafts", 0))
    if "accepted_by_position" in after:
        b = before.get("accepted_by_position", {})
        out["accepted_by_position"] = {p: int(v - b.get(p, 0)) for p, v in after["accepted_by_position"].items()}
    return out


def _runs_from_positions(counters: dict, k) -> dict:
    """Per-draft-run counts from counters by position (vLLM: ``drafts`` runs, accepted tokens at each position):
    a run stops at its first rejection, so ``accepted_by_position[j]`` runs accepted more than j tokens, and the
    i-th run accepted #{j: accepted_by_position[j] > i}. Drafted per run: k when the counts say every run drafted
    k (draft_n == drafts x k), else unknown (None). Only the runs' order is lost."""
    n, pos = int(counters["drafts"]), counters["accepted_by_position"]
    accepted = [sum(1 for v in pos.values() if v > i) for i in range(n)]
    full = k and counters.get("draft_n") == n * k
    return {"accepted_per_pass": accepted, "drafted_per_pass": [k] * n if full else None}


# --- tables ------------------------------------------------------------------------------------------------
GROUP = ("engine", "spec_method", "draft", "target", "k", "text_kind", "concurrency")


def _key(r: dict, cols) -> tuple:
    """A row's group: its ``cols``, the engine named by the server it ran on where it ran on one (an http row's
    ``server``: llama-server, vllm), concurrency 1 when unset."""
    out = {c: r.get(c) for c in cols}
    out["engine"] = r.get("server") or r.get("engine")
    if "concurrency" in out:
        out["concurrency"] = int(out["concurrency"] or 1)
    return tuple(out[c] for c in cols)


def speedup_table(rows) -> list[dict]:
    """One row per engine x method x draft x k x text x concurrency: alpha (summed accepted / summed drafted),
    tokens per pass (median), the medians of TPOT and e2e (s) with and without speculation (the same engine,
    target, text and concurrency) and their ratios (``tpot_speedup`` = plain / speculative), the draft's KL and
    cost c, the predicted tokens per pass and speedup (:func:`predicted_speedup`) and measured over predicted."""
    rows = [r for r in rows if not r.get("error")]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_key(r, GROUP), []).append(r)
    plain = {
        (key[0], key[3], key[5], key[6]): g for key, g in groups.items() if (key[1] or NONE) == NONE
    }  # engine, target, text, concurrency
    out = []
    for key, g in groups.items():
        if (key[1] or NONE) == NONE:
            continue
        base = plain.get((key[0], key[3], key[5], key[6]))
        rec = dict(zip(GROUP, key))
        drafted = [r["draft_n"] for r in g if r.get("draft_n") is not None]
        accepted = [r["draft_n_accepted"] for r in g if r.get("draft_n_accepted") is not None]
        alpha = sum(accepted) / sum(drafted) if drafted and sum(drafted) else None
        tpot = _median_tpot(g)  # None: every request's tokens came in one verified run (no decode seen)
        e2e = statistics.median(r["e2e_s"] for r in g)
        cost = g[0].get("draft_cost")
        tpp = [r["tokens_per_pass"] for r in g if r.get("tokens_per_pass") is not None]
        rec.update(
            requests=len(g),
            acceptance=alpha,
            tokens_per_pass=statistics.median(tpp) if tpp else None,
            tpot_s=tpot,
            e2e_s=e2e,
            draft_kl=g[0].get("draft_kl"),
            draft_cost=cost,
            same_as_plain=all(r.get("same_as_plain") is not False for r in g),
        )
        if base:
            rec["plain_tpot_s"] = _median_tpot(base)
            rec["plain_e2e_s"] = statistics.median(r["e2e_s"] for r in base)
            if tpot and rec["plain_tpot_s"]:
                rec["tpot_speedup"] = rec["plain_tpot_s"] / tpot
            rec["e2e_speedup"] = rec["plain_e2e_s"] / e2e
        if alpha is not None and key[4] and cost is not None:
            rec["predicted_tokens_per_pass"] = expected_tokens_per_pass(alpha, key[4])
            rec["predicted_speedup"] = predicted_speedup(alpha, key[4], cost)
            if "tpot_speedup" in rec:
                rec["speedup_ratio"] = rec["tpot_speedup"] / rec["predicted_speedup"]
        out.append(rec)
    return out


def position_table(rows) -> list[dict]:
    """Acceptance by position in the draft, where the engine's counters allow: per engine x method x draft x k x
    text, for position j = 0..k-1, ``drafts_at_position`` (draft runs that held a token at j) and
    ``accepted_share`` (the share of them whose token at j was accepted: a run stops at its first rejection)."""
    acc: dict[tuple, dict[int, list[int]]] = {}
    for r in rows:
        if r.get("error") or (r.get("spec_method") or NONE) == NONE:
            continue
        key = _key(r, GROUP[:6])
        slot = acc.setdefault(key, {})
        if r.get("drafted_per_pass") and r.get("accepted_per_pass") is not None:
            for d, a in zip(r["drafted_per_pass"], r["accepted_per_pass"]):
                for j in range(d):
                    n = slot.setdefault(j, [0, 0])
                    n[0] += 1
                    n[1] += int(j < a)
    return [
        {**dict(zip(GROUP[:6], key)), "position": j, "drafts_at_position": n[0], "accepted_share": n[1] / n[0]}
        for key, slot in acc.items()
        for j, n in sorted(slot.items())
        if n[0]
    ]


def format_table(table: list[dict]) -> str:
    """The speedup table as text: engine x method x draft x k x text: alpha, tokens per pass, measured TPOT
    speedup, predicted speedup, their ratio, e2e speedup, the draft's KL and cost c, same output."""

    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    head = (
        f"{'engine':<13} {'method':<13} {'draft':<9} {'k':>2} {'text':<10} {'par':>3} {'alpha':>5} {'tok/pass':>8} "
        f"{'speedup':>7} {'predict':>7} {'ratio':>5} {'e2e_x':>5} {'KL':>6} {'c':>5} same"
    )
    lines = [head]
    for r in table:
        lines.append(
            f"{r['engine']:<13} {r['spec_method']:<13} {str(r['draft']):<9} {r['k']:>2} {r['text_kind']:<10} "
            f"{r['concurrency'] or 1:>3} {f(r.get('acceptance')):>5} {f(r.get('tokens_per_pass')):>8}"
            f" {f(r.get('tpot_speedup')):>7} {f(r.get('predicted_speedup')):>7} "
            f"{f(r.get('speedup_ratio')):>5} {f(r.get('e2e_speedup')):>5} {f(r.get('draft_kl'), '.3f'):>6} "
            f"{f(r.get('draft_cost')):>5} {'yes' if r.get('same_as_plain') else 'NO'}"
        )
    return "\n".join(lines)
