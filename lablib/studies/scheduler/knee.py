"""The saturation knee (lab 09): the rate where throughput stops following the offered load and latency turns
up, found from a rate sweep's table by a stated rule (:data:`KNEE_RULE`, :func:`find_knee`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lablib.errors import LabError

if TYPE_CHECKING:
    import pandas as pd


# --- the saturation knee -------------------------------------------------------------------------------------
KNEE_RULE = (
    "the knee is the lowest swept rate x_i (i >= 1) at which (a) throughput has stopped following the offered "
    "load: the throughput gained over the last step, (T_i - T_(i-1)) / (x_i - x_(i-1)), is below flat x the "
    "light-load slope T_0 / x_0 (below saturation an open loop's throughput is proportional to its rate), and "
    "(b) latency has turned up: L_i > rise x the light-load latency, the lowest L_j of the rates below it (j < i: "
    "the best the server did before, so one slow run at the lowest rate does not hide the rise)"
)


def kneedle(x, y) -> int | None:
    """The index of the knee of a concave, increasing curve (throughput against rate) by the Kneedle method
    (Satopaa, Albrecht, Irwin, Raghavan, "Finding a 'Kneedle' in a Haystack: Detecting Knee Points in
    System Behavior", ICDCS Workshops 2011), offline and without smoothing: x and y scaled to [0, 1], the
    point farthest above the chord from the first to the last (the largest y_n - x_n); None for fewer than
    3 points or a flat or straight curve (no point above the chord)."""
    if len(x) < 3 or len(x) != len(y):
        return None
    x0, x1, y0, y1 = min(x), max(x), min(y), max(y)
    if x1 == x0 or y1 == y0:
        return None
    diff = [(b - y0) / (y1 - y0) - (a - x0) / (x1 - x0) for a, b in zip(x, y)]
    best = max(range(len(diff)), key=lambda i: diff[i])
    return best if diff[best] > 1e-9 else None


def find_knee(
    table,
    x: str = "rate",
    throughput: str = "output_tps",
    latency: str = "ttft_p99_s",
    flat: float = 0.5,
    rise: float = 2.0,
) -> dict:
    """The saturation knee of a rate sweep's ``table`` (one row per rate: ``x``, ``throughput``, ``latency``;
    a DataFrame or dicts, e.g. :func:`lablib.studies.serving.rate_sweep_table` or ``lablib bench``'s
    summaries), by :data:`KNEE_RULE` with the fractions ``flat`` (0..1) and ``rise`` (> 1).

    Returns a dict: ``x`` (the knee's rate, None when the sweep has none), ``row`` (its row of ``table``, a
    dict, or None), ``index`` (its position in the sorted table), ``rule`` (the rule in words, with the
    fractions), ``reason`` (why this row, or why none: what the numbers say), ``kneedle_x`` (the Kneedle
    knee of throughput against rate, :func:`kneedle`, a cross-check: it marks the corner, the last rate
    still on the straight part, so it is usually the rate just below the rule's knee) and ``steps``: a
    DataFrame, one row per rate: x, throughput, latency, ``throughput_gain`` (the step's slope over the
    light-load slope; NaN for the first rate), ``latency_growth`` (L_i over the lowest latency of the rates
    below it; NaN for the first rate), ``is_knee``. LabError for
    missing columns, fewer than 3 rates, rates not positive or repeated, or a bad ``flat``/``rise``."""
    import pandas as pd

    from lablib.results.tables import need

    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    need(df, (x, throughput, latency), "find_knee", "a rate sweep (lablib.studies.serving.rate_sweep_table)")
    if isinstance(flat, bool) or not isinstance(flat, (int, float)) or not 0 < flat < 1:
        raise LabError(f"flat={flat!r}: expected a fraction of the light-load slope between 0 and 1 (e.g. 0.5)")
    if isinstance(rise, bool) or not isinstance(rise, (int, float)) or not rise > 1 or not math.isfinite(rise):
        raise LabError(f"rise={rise!r}: expected a factor of the light-load latency above 1 (e.g. 2)")
    d = df[[x, throughput, latency]].astype(float)
    if d.isna().any().any():
        bad = d[d.isna().any(axis=1)].index.tolist()
        raise LabError(f"find_knee: rows {bad} have no {x}, {throughput} or {latency}: expected numbers in every row")
    order = d[x].sort_values(kind="stable").index
    d = d.loc[order]
    xs, ts, ls = d[x].tolist(), d[throughput].tolist(), d[latency].tolist()
    if len(xs) < 3:
        raise LabError(f"find_knee: {len(xs)} rates; expected 3 or more (a knee needs a bend)")
    if xs[0] <= 0 or not all(math.isfinite(v) for v in xs):
        raise LabError(
            f"find_knee: {x} from {xs[0]} to {xs[-1]}; expected finite rates above 0 (inf: use a finite rate)"
        )
    if len(set(xs)) != len(xs):
        raise LabError(f"find_knee: repeated {x} values {sorted(xs)}: expected one row per rate (a median of repeats)")
    if ts[0] <= 0 or ls[0] <= 0:
        raise LabError(
            f"find_knee: at the lowest rate {xs[0]} {throughput}={ts[0]} and {latency}={ls[0]}; expected both above 0"
        )
    light = ts[0] / xs[0]
    gains = [float("nan")] + [((ts[i] - ts[i - 1]) / (xs[i] - xs[i - 1])) / light for i in range(1, len(xs))]
    growth = [float("nan")] + [ls[i] / min(ls[:i]) for i in range(1, len(ls))]
    knee = next((i for i in range(1, len(xs)) if gains[i] < flat and growth[i] > rise), None)
    kn = kneedle(xs, ts)
    steps = pd.DataFrame(
        {
            x: xs,
            throughput: ts,
            latency: ls,
            "throughput_gain": gains,
            "latency_growth": growth,
            "is_knee": [i == knee for i in range(len(xs))],
        }
    )
    rule = KNEE_RULE.replace("below flat", f"below {flat:g}").replace("rise x", f"{rise:g} x")
    if knee is None:
        flat_at = [xs[i] for i in range(1, len(xs)) if gains[i] < flat]
        risen_at = [xs[i] for i in range(1, len(xs)) if growth[i] > rise]
        if not flat_at and not risen_at:
            reason = (
                f"no knee up to {x}={xs[-1]:g}: throughput still follows the rate and latency stays within "
                f"{rise:g}x of its lowest below; sweep higher rates"
            )
        else:
            reason = (
                f"no knee: throughput flattens at {flat_at or 'no rate'} but latency exceeds {rise:g}x its "
                f"light-load value at {risen_at or 'no rate'}, never both at once (a noisy sweep: more requests "
                "per rate, or a finer rate step)"
            )
        row = None
    else:
        reason = (
            f"at {x}={xs[knee]:g} the step from {xs[knee - 1]:g} gained {gains[knee]:.2f}x the light-load slope "
            f"({light:.3g} {throughput} per unit of {x}), below {flat:g}, while {latency} is "
            f"{growth[knee]:.1f}x its light-load value ({ls[knee]:.3g} against {min(ls[:knee]):.3g}, the lowest below "
            f"{xs[knee]:g}), above {rise:g}"
        )
        row = df.loc[order[knee]].to_dict()
    return {
        "x": xs[knee] if knee is not None else None,
        "row": row,
        "index": knee,
        "rule": rule,
        "reason": reason,
        "kneedle_x": xs[kn] if kn is not None else None,
        "steps": steps,
    }


def rate_sweep(
    server,
    model,
    rates,
    requests: int = 6,
    prompt_tokens: int = 32,
    max_new_tokens: int = 16,
    arrival: str = "constant",
    seed: int = 0,
    metrics_interval_s: float = 0.1,
    max_duration_s: float = 120.0,
) -> pd.DataFrame:
    """An open-loop rate sweep of ``server`` (a RunningServer) for :func:`find_knee`: one row per rate of
    ``rates`` (requests/s, swept upwards), ``requests`` distinct prompts of ``prompt_tokens`` for exactly
    ``max_new_tokens`` each, arriving ``arrival`` (constant by default: below capacity no request waits
    for another, so waiting begins where the server saturates), each run sampled on its ``/metrics``.

    Each row: ``rate``, ``output_tps``, ``ttft_p50_s``, ``ttft_p99_s``, ``e2e_p50_s``, ``errors`` and the
    server's ``running_max``, ``waiting_max``, ``kv_usage_max``, ``preemptions`` (None without /metrics).
    The request rows are in ``attrs["rows"]``, the samples (with ``rate``) in ``attrs["server_rows"]``."""
    from lablib.studies.serving import rate_sweep_table

    rates = sorted(float(r) for r in rates)
    if not rates:
        raise LabError("rates=[]: expected requests-per-second values, e.g. [0.5, 1, 2, 4, 8]")
    df = rate_sweep_table(
        [server],
        model,
        rates,
        requests=requests,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        max_duration_s=max_duration_s,
        seed=seed,
        metrics_interval_s=metrics_interval_s,
        arrival=arrival,
    )
    cols = ["rate", "output_tps", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "errors"]
    out = df[cols + ["running_max", "waiting_max", "kv_usage_max", "preemptions"]].copy()
    out.attrs = df.attrs
    return out
