"""Lab 11's adapter figures, from :func:`lablib.studies.adapters.cost_table` (one row per engine x rank x arm) and
:func:`lablib.studies.adapters.multi_table` (one row per server x clients x adapter mix).

:func:`adapter_cost_bars`: TPOT (and TTFT) per engine for no adapter, each rank unmerged and merged, each engine in
its own colour, the arms told apart by their pattern; :func:`multi_lora_lines`: a server's output tokens per second
against its clients, one line per adapter mix (none, same, distinct), each server in its own colour.
"""

from __future__ import annotations

from lablib.plots.style import SERVER_LINE_COLORS, color, titled
from lablib.results.tables import need

SOURCE_COST = "lablib.studies.adapters.cost_table"
SOURCE_MULTI = "lablib.studies.adapters.multi_table"
ARM_PATTERN = {"none": "", "unmerged": "/", "merged": "."}
MIX_DASH = {"none": "dot", "same": "dash", "distinct": "solid"}


def _frame(table):
    import pandas as pd

    return table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))


def _arm_label(rank, arm) -> str:
    return "no adapter" if arm == "none" else f"rank {int(rank)} {arm}"


def adapter_cost_bars(table, metric: str = "tpot_s", title: str | None = None):
    """``metric`` (``tpot_s`` or ``ttft_s``, drawn in ms) per engine, one bar per arm: no adapter, then each rank
    unmerged (/) and merged (.); the label above a bar is its ms and its ratio to the engine's no-adapter bar."""
    import plotly.graph_objects as go

    df = _frame(table)
    need(df, ["engine", "adapter_rank", "adapter_arm", metric], "adapter_cost_bars", SOURCE_COST)
    fig = go.Figure()
    arms = list(dict.fromkeys(_arm_label(r, a) for r, a in zip(df["adapter_rank"], df["adapter_arm"])))
    for engine, g in df.groupby("engine", sort=False):
        none = g[g.adapter_arm == "none"][metric]
        base = float(none.iloc[0]) if len(none) else None
        xs = [_arm_label(r, a) for r, a in zip(g["adapter_rank"], g["adapter_arm"])]
        ys = [v * 1e3 if v == v and v is not None else None for v in g[metric]]
        fig.add_bar(
            x=xs,
            y=ys,
            name=engine,
            marker={"color": color(engine), "pattern": {"shape": [ARM_PATTERN.get(a, "") for a in g["adapter_arm"]]}},
            text=[
                f"{y:.1f}" + (f"<br>x{y / (base * 1e3):.2f}" if base and a != "none" else "") if y is not None else ""
                for y, a in zip(ys, g["adapter_arm"])
            ],
            textposition="outside",
            offsetgroup=engine,
        )
    name = {"tpot_s": "TPOT", "ttft_s": "TTFT"}.get(metric, metric)
    titled(
        fig,
        title or f"What an adapter costs each decode step: {name} per engine",
        "adapter (/ applied on the fly, . merged into the weights)",
        f"{name} (ms)",
        barmode="group",
        legend_title="engine",
    )
    fig.update_xaxes(categoryorder="array", categoryarray=arms)
    return fig


def multi_lora_lines(table, title: str | None = None):
    """Output tokens per second of a server's closed loop against its clients, one line per server x adapter mix:
    every request on the base model (dotted), all on one adapter (dashed), each in flight on a different adapter
    (solid)."""
    import plotly.graph_objects as go

    df = _frame(table)
    need(df, ["engine", "concurrency", "adapter_mix", "output_tps"], "multi_lora_lines", SOURCE_MULTI)
    df = df[df.adapter_mix.isin(list(MIX_DASH))]
    fig = go.Figure()
    servers = list(dict.fromkeys(df["engine"]))
    for (server, mix), g in df.sort_values("concurrency").groupby(["engine", "adapter_mix"], sort=False):
        c = SERVER_LINE_COLORS[servers.index(server) % len(SERVER_LINE_COLORS)]
        fig.add_scatter(
            x=list(g["concurrency"]),
            y=list(g["output_tps"]),
            mode="lines+markers",
            name=f"{server}, {'no adapter' if mix == 'none' else mix + ' adapter' + ('s' if mix == 'distinct' else '')}",
            line={"color": c, "dash": MIX_DASH[mix]},
        )
    titled(
        fig,
        title or "Many adapters at once: does the server batch them?",
        "clients (requests in flight)",
        "output tokens per second (all clients)",
        legend_title="server, adapters",
    )
    fig.update_xaxes(tickmode="array", tickvals=sorted(set(int(c) for c in df["concurrency"])))
    return fig
