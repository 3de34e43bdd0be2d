"""Lab 04's figures: what a comparison stored (:mod:`lablib.studies.compare`): KL per position, top-k at the divergence."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import color, log_ticks, titled

if TYPE_CHECKING:
    import plotly.graph_objects as go


def _check(comparison, name: str, figure: str):
    """The check ``name`` of ``comparison`` (what ``lablib.compare`` returns); LabError naming what ``figure`` was
    given otherwise (was: AttributeError "'DataFrame' object has no attribute 'check'")."""
    if not callable(getattr(comparison, "check", None)):
        raise LabError(
            f"{figure} draws a comparison, what lablib.compare(...) returns; it was given a "
            f"{type(comparison).__name__}: pass the comparison itself"
        )
    return comparison.check(name)


def kl_per_position(comparison, engine: str) -> go.Figure:
    """KL(reference || engine) of the next-token distribution at each prompt position (nats),
    with the positions where the argmax differs marked. ``comparison``: lablib.studies.compare.compare()."""
    import numpy as np
    import plotly.graph_objects as go

    stats = _check(comparison, "logits", "kl_per_position").details.get("stats", {})
    if engine not in stats:
        raise LabError(f"no logit comparison for {engine!r} (have: {', '.join(stats) or 'none'})")
    s = stats[engine]
    pos = np.arange(len(s["kl"]))
    flip = s["argmax"] != s["argmax_ref"]
    fig = go.Figure()
    fig.add_scatter(
        x=pos,
        y=s["kl"],
        mode="lines+markers",
        name=f"KL, {engine}",
        line_color=color(engine),
        customdata=np.stack([s["margin_ref"], s["argmax_ref"], s["argmax"]], axis=1),
        hovertemplate=(
            "position %{x}<br>KL %{y:.4f} nats<br>reference top-2 margin "
            "%{customdata[0]:.3f} nats<br>argmax ref %{customdata[1]:.0f}, "
            f"{engine} %{{customdata[2]:.0f}}<extra></extra>"
        ),
    )
    if flip.any():
        fig.add_scatter(
            x=pos[flip],
            y=s["kl"][flip],
            mode="markers",
            name="argmax differs",
            marker=dict(symbol="x", size=11, color="#C0392B"),
            hoverinfo="skip",
        )
    titled(
        fig,
        f"Next-token KL divergence, reference vs {engine}",
        x="prompt position (predicts the next token)",
        y="KL (nats)",
    )
    # ticks written out (1e-06, 0.0001): plotly's own write 10n and 1μ, SI prefixes nobody reads as nats
    return fig.update_yaxes(**log_ticks(s["kl"]))


def topk_at_divergence(comparison, engine: str, k: int | None = None) -> go.Figure:
    """The reference's and ``engine``'s top-k next tokens (probabilities) where their greedy
    texts part, as :func:`lablib.studies.compare.check_generation` stored them (``k``: at most the
    stored number, default all of them)."""
    import plotly.graph_objects as go

    gen = _check(comparison, "generation", "topk_at_divergence")
    ref_name = gen.details["reference"]
    stored = gen.details.get("topk", {}).get(engine)
    if stored is None:
        raise LabError(f"{engine} does not diverge from the reference {ref_name}: no top-k to show")
    pos = stored["position"]
    fig = go.Figure()
    for name in (ref_name, engine):
        top = stored.get(name)
        if top is None:
            raise LabError(f"{name} exposes no logits: no top-k stored at the divergence")
        n = len(top["ids"]) if k is None else min(k, len(top["ids"]))
        fig.add_bar(
            name=name,
            x=[math.exp(lp) for lp in top["logp"][:n]],
            y=[f"{piece!r} ({t})" for piece, t in zip(top["pieces"][:n], top["ids"][:n])],
            orientation="h",
            marker_color=color(name),
            hovertemplate=f"{name}<br>%{{y}}: p = %{{x:.3f}}<extra></extra>",
        )
    shown = len(fig.data[0].x)
    return titled(
        fig,
        f"Top-{shown} next tokens at generated position {pos}",
        x="probability",
        y="token (id)",
        barmode="group",
        yaxis_autorange="reversed",
    )
