"""Lab 10's structured-output figures, from :func:`lablib.studies.decoding.structured.structured_table` (one row
per engine x schema): TPOT with and without the constraint, and the share of outputs that validate."""

from __future__ import annotations

from lablib.plots.style import color
from lablib.results.tables import need


def _bars(table, free: str, constrained: str, title: str, ytitle: str, scale: float = 1.0, digits: int = 2):
    import plotly.graph_objects as go

    need(table, ("engine", "schema", free, constrained), title, "lablib.studies.decoding.structured.structured_table")
    fig = go.Figure()
    for engine, g in table.groupby("engine", sort=False):
        for col, arm, pattern in ((free, "without", ""), (constrained, "with", "/")):
            ys = [v * scale for v in g[col]]
            fig.add_bar(
                x=list(g["schema"]),
                y=ys,
                text=[f"{y:.{digits}f}" for y in ys],  # a bar of 0 (no valid output) still says so
                textposition="outside",
                name=f"{engine}, {arm} constraint",
                marker={"color": color(engine), "pattern": {"shape": pattern}},
                offsetgroup=f"{engine} {arm}",
            )
    fig.update_layout(title=title, barmode="group", xaxis_title="schema", yaxis_title=ytitle, legend_title="engine")
    return fig


def tpot_with_without(table):
    """TPOT (ms per output token) per engine and schema, without the constraint and with it."""
    return _bars(table, "tpot_free_s", "tpot_constrained_s", "What a grammar costs each step", "TPOT (ms)", 1e3, 0)


def valid_share(table):
    """The share of outputs (0..1) that parse and validate against the schema (jsonschema), without and with it."""
    fig = _bars(table, "valid_free", "valid_constrained", "What a grammar buys", "valid share (0..1)")
    fig.update_yaxes(range=[0, 1.15])  # room for the labels above a bar of 1
    return fig
