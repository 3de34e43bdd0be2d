"""Speculative-decoding figures (lab 10): pure plotly functions of tidy tables (no engine, no measurement).

:func:`speedup_vs_k` draws :func:`lablib.studies.decoding.speculative.speedup_table` (the measured TPOT speedup
over the draft length k, solid, next to the speedup the acceptance rate predicts, dashed; below 1, speculation
costs more than it buys); :func:`acceptance_by_position` draws
:func:`lablib.studies.decoding.speculative.position_table` (the share of draft tokens accepted at each position
of the draft). Each engine keeps its colour (:func:`lablib.plots.color`).
"""

from __future__ import annotations

from lablib.plots.style import color
from lablib.results.tables import need, nonempty

SOURCE_SPEEDUP = "lablib.studies.decoding.speculative.speedup_table"
SOURCE_POSITIONS = "lablib.studies.decoding.speculative.position_table"
DASHES = ("solid", "dot", "dashdot", "longdash")


def _frame(table):
    import pandas as pd

    return table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))


def _label(r, keys) -> str:
    parts = [str(r[k]) for k in keys if r.get(k) not in (None, "", "lookup")]
    return ", ".join(parts)


DODGE_K = 0.08  # speedup_vs_k: how far apart (in draft tokens) the series at one k are drawn


def speedup_vs_k(table, title: str | None = None):
    """TPOT speedup (plain TPOT / speculative TPOT) against the draft length k, one line per engine x method x
    draft x text x streams: measured (solid, filled markers) and predicted from its acceptance rate and draft
    cost (Leviathan et al. 2023; dashed, open markers). A grey line at 1: below it speculation does not pay."""
    import plotly.graph_objects as go

    df = _frame(table)
    cols = ["engine", "spec_method", "draft", "text_kind", "concurrency", "k", "tpot_speedup", "predicted_speedup"]
    need(df, cols, "speedup_vs_k", SOURCE_SPEEDUP)
    df = nonempty(df.dropna(subset=["tpot_speedup"]), "speedup_vs_k", f"no measured speedups; run {SOURCE_SPEEDUP}")
    fig = go.Figure()
    keys = ["engine", "spec_method", "draft", "text_kind", "concurrency"]
    groups = list(df.sort_values("k").groupby(keys, dropna=False, sort=False))
    # each series a little to the side of its k (a dodge, DODGE_K apart), so that runs at the same draft length
    # (quick mode has one k) do not hide each other's markers; the ticks and the hover say the real k
    shift = {i: (i - (len(groups) - 1) / 2) * DODGE_K for i in range(len(groups))}
    for i, (key, g) in enumerate(groups):
        r = dict(zip(keys, key))
        name = _label(r, ["engine", "spec_method", "draft", "text_kind"]) + (
            f", {int(r['concurrency'])} streams" if (r["concurrency"] or 1) > 1 else ""
        )
        c = color(r["engine"])
        alpha = g["acceptance"] if "acceptance" in g else [None] * len(g)
        hover = [
            f"{name}<br>k={k}<br>measured {m:.2f}x"
            + (f", predicted {p:.2f}x" if p == p and p is not None else "")
            + (f"<br>alpha {a:.2f}" if a == a and a is not None else "")
            for k, m, p, a in zip(g["k"], g["tpot_speedup"], g["predicted_speedup"], alpha)
        ]
        dash = DASHES[i % len(DASHES)]
        pred = g.dropna(subset=["predicted_speedup"])
        for part, y, line, marker, extra in (
            ("measured", "tpot_speedup", {"dash": dash}, {}, {"hovertext": hover, "hoverinfo": "text"}),
            ("predicted", "predicted_speedup", {"dash": "dash", "width": 1}, {"symbol": "circle-open"}, {}),
        ):
            d = g if part == "measured" else pred
            if len(d):
                fig.add_trace(
                    go.Scatter(
                        x=d["k"].astype(float) + shift[i],
                        y=d[y],
                        mode="lines+markers",
                        name=f"{name}: {part}",
                        line={"color": c, **line},
                        marker={"size": 9, **marker},
                        hoverinfo=extra.get("hoverinfo", "skip"),
                        hovertext=extra.get("hovertext"),
                    )
                )
    fig.add_hline(y=1, line={"color": "#999999", "width": 1})
    ks = sorted({int(k) for k in df["k"]})
    fig.update_xaxes(tickvals=ks, ticktext=[str(k) for k in ks], range=[ks[0] - 0.6, ks[-1] + 0.6])
    fig.update_layout(
        title=title
        or (
            "Speculative decoding: measured and predicted speedup"
            "<br><sup>filled: measured, open: predicted from its acceptance; the series at one k side by side</sup>"
        ),
        xaxis_title="draft length k (tokens per step)",
        yaxis_title="TPOT speedup (plain / speculative)",
        template="plotly_white",
    )
    return fig


def acceptance_by_position(positions, title: str | None = None):
    """The share of draft tokens accepted at each position of the draft (1 = the first drafted token), one line
    per engine x method x draft x k x text: a run stops at its first rejection, so the share falls with the
    position (alpha^j for i.i.d. acceptance)."""
    import plotly.graph_objects as go

    df = _frame(positions)
    cols = ["engine", "spec_method", "draft", "k", "text_kind", "position", "accepted_share", "drafts_at_position"]
    need(df, cols, "acceptance_by_position", SOURCE_POSITIONS)
    df = nonempty(df, "acceptance_by_position", f"no per-position counts; run {SOURCE_POSITIONS}")
    fig = go.Figure()
    keys = ["engine", "spec_method", "draft", "k", "text_kind"]
    for i, (key, g) in enumerate(df.sort_values("position").groupby(keys, dropna=False, sort=False)):
        r = dict(zip(keys, key))
        name = _label(r, ["engine", "spec_method", "draft", "text_kind"]) + f", k={r['k']}"
        fig.add_trace(
            go.Scatter(
                x=g["position"] + 1,
                y=g["accepted_share"],
                mode="lines+markers",
                name=name,
                line={"color": color(r["engine"]), "dash": DASHES[i % len(DASHES)]},
                hovertext=[
                    f"{name}<br>position {p + 1}: {s:.0%} of {n} drafts accepted"
                    for p, s, n in zip(g["position"], g["accepted_share"], g["drafts_at_position"])
                ],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title=title or "Acceptance by position in the draft",
        xaxis_title="position in the draft (1 = first drafted token)",
        yaxis_title="share accepted",
        yaxis_range=[0, 1.05],
        template="plotly_white",
    )
    return fig
