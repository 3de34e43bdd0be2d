"""Lab 04's batch-invariance figure: where each prompt's greedy text changed with what shared its batch
(:mod:`lablib.studies.batch_invariance`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lablib.errors import LabError
from lablib.plots.style import titled

if TYPE_CHECKING:
    import plotly.graph_objects as go

_COLUMNS = ("concurrency", "prompt", "first_divergence", "same_tokens")


def _label(question, prompt: int, width: int = 34) -> str:
    if not isinstance(question, str):
        return f"prompt {prompt}"
    return question if len(question) <= width else question[: width - 1] + "…"


def parting_map(result) -> go.Figure:
    """Prompts (rows) by concurrent sequences (columns), a square each: green where the prompt's greedy ids in
    the batch equal its ids alone for every generated token, red where they part, labelled with the position and the
    engine's top-2 margin there (nats, run alone) and, on hover, the two tokens. ``result``: what
    :func:`lablib.studies.batch_invariance.batch_invariance` returns (or its ``table``)."""
    import pandas as pd
    import plotly.graph_objects as go

    table = getattr(result, "table", result)
    missing = [c for c in _COLUMNS if c not in getattr(table, "columns", ())]
    if missing:
        raise LabError(
            f"parting_map draws what batch_invariance(...) returns; it was given a {type(result).__name__} "
            f"without the columns {', '.join(missing)}"
        )
    if len(table) == 0:
        raise LabError("parting_map: the result has no rows (no prompt ran)")
    levels = sorted(int(c) for c in table["concurrency"].unique())
    prompts = sorted(int(p) for p in table["prompt"].unique())
    names = {}
    for p in prompts:
        q = table.loc[table["prompt"] == p, "question"].iloc[0] if "question" in table else None
        label = _label(q, p)
        # one row per prompt: a label two prompts share (the same question, or the same first 33 characters)
        names[p] = label if label not in names.values() else f"{label} (prompt {p})"
    total = getattr(result, "max_new_tokens", None)
    each = f" ({total} tokens each)" if total else ""
    cells = {"same": ([], [], [], []), "parted": ([], [], [], [])}  # x, y, text, hover
    for p in prompts:
        for c in levels:
            cell = table[(table["prompt"] == p) & (table["concurrency"] == c)]
            if cell.empty:
                continue
            r = cell.iloc[0]
            if pd.isna(r["first_divergence"]):
                kind, text, hover = "same", "", f"all {int(r['same_tokens'])} ids as alone"
            else:
                pos, margin = int(r["first_divergence"]), r.get("margin")
                known = margin is not None and not pd.isna(margin)
                kind, text = "parted", f"token {pos}" + (f", {margin:.2f} nats" if known else "")
                how = f"top-2 margin {margin:.3f} nats" if known else "no logits"
                alone, batched = r.get("alone_token"), r.get("batched_token")
                hover = f"parts at generated token {pos}: alone {alone!r}, batched {batched!r} ({how})"
            xs, ys, texts, hovers = cells[kind]
            xs.append(str(c)), ys.append(names[p]), texts.append(text), hovers.append(hover)
    fig = go.Figure()
    for kind, name, colour in (("same", "same ids as alone", "#7CC48A"), ("parted", "parts from alone", "#E07B6A")):
        xs, ys, texts, hovers = cells[kind]
        fig.add_scatter(
            x=xs,
            y=ys,
            mode="markers+text",
            name=name,
            text=texts,
            textposition="middle right",  # a parted cell's position and margin, beside its square
            marker=dict(symbol="square", size=22, color=colour),
            customdata=hovers,
            hovertemplate="%{y}<br>%{x} sequences in the batch: %{customdata}<extra></extra>",
            showlegend=True,
        )
    # room on the right of the last column for its labels
    fig.update_xaxes(
        type="category", categoryorder="array", categoryarray=[str(c) for c in levels], range=[-0.4, len(levels) - 0.1]
    )
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=[names[p] for p in prompts])
    return titled(
        fig,
        f"Greedy ids beside other prompts vs alone{each}: same, or the first that differs",
        x="sequences in the batch (the prompt and its neighbours)",
        y="prompt",
        yaxis_autorange="reversed",
        height=160 + 40 * len(prompts),
    )
