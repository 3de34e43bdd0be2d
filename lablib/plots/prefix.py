"""Prefix-caching figures (lab 08): pure plotly functions of tidy rows (no engine, no measurement).

:func:`ttft_vs_shared` draws :func:`lablib.studies.prefix.shared_prefix` rows (TTFT against the shared
prefix's length, with and without reuse); :func:`chat_turns` draws :func:`lablib.studies.prefix.chat` rows
(TTFT per turn); :func:`kept_memory` draws :func:`lablib.studies.prefix.memory_table` (bytes the kept caches
hold). Each engine keeps its colour (:func:`lablib.plots.color`); reuse is a solid line, no reuse
a dashed one.
"""

from __future__ import annotations

from lablib.plots.style import color, engine_order, titled
from lablib.results.tables import PREFIX_AXES, need, nonempty, prefix_medians

REUSE_DASH = {True: "solid", False: "dash"}
REUSE_NAME = {True: "reuse", False: "no reuse"}


def _lines(med, axis: str, x_title: str, title: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for engine in engine_order(med):
        for reuse in (False, True):
            g = med[(med["engine"] == engine) & (med["reuse"] == reuse)]
            if not len(g):
                continue
            hover = [
                f"{engine}, {REUSE_NAME[reuse]}<br>{x_title} {x}<br>TTFT {t * 1000:.0f} ms<br>"
                f"prompt {p:.0f} tokens, {c:.0f} cached" + (f", {s:.1f}x faster" if s == s else "")
                for x, t, p, c, s in zip(g[axis], g["ttft_s"], g["prompt_tokens"], g["cached_tokens"], g["speedup"])
            ]
            fig.add_trace(
                go.Scatter(
                    x=g[axis],
                    y=g["ttft_s"] * 1000,
                    mode="lines+markers",
                    name=f"{engine}, {REUSE_NAME[reuse]}",
                    line={"color": color(engine), "dash": REUSE_DASH[reuse]},
                    marker={"symbol": "circle" if reuse else "circle-open", "size": 9},
                    hovertext=hover,
                    hoverinfo="text",
                )
            )
    return titled(fig, title, x=x_title, y="TTFT, median (ms, log)", yaxis_type="log")


def ttft_vs_shared(df, title: str | None = None):
    """TTFT (median, ms, log axis) against the shared prefix's length (tokens), one line per engine
    with reuse (solid) and without (dashed). Needs the rows of :func:`lablib.studies.prefix.shared_prefix`."""
    med = prefix_medians(df, "prefix_shared")
    return _lines(
        med, PREFIX_AXES["prefix_shared"], "shared prefix (tokens)", title or "TTFT with and without prefix reuse"
    )


def chat_turns(df, title: str | None = None):
    """TTFT (median, ms, log axis) per chat turn, one line per engine with the previous turns' cache
    kept (solid) and without (dashed). Needs the rows of :func:`lablib.studies.prefix.chat`."""
    med = prefix_medians(df, "prefix_chat")
    fig = _lines(med, PREFIX_AXES["prefix_chat"], "turn", title or "A chat: TTFT per turn, previous turns kept or not")
    fig.update_xaxes(dtick=1)
    return fig


def kept_memory(table, title: str | None = None):
    """Bytes the kept prefix caches hold (MB) against their length (tokens): measured (markers)
    and the count from the model's shape (lines), per engine. Needs :func:`lablib.studies.prefix.memory_table`."""
    import plotly.graph_objects as go

    source = "lablib.studies.prefix.memory_table"
    cols = ["engine", "tokens", "kept_bytes", "formula_bytes"]
    need(nonempty(table, "kept_memory", f"expected a table from {source}"), cols, "kept_memory", source)
    fig = go.Figure()
    for engine in engine_order(table):
        g = table[table["engine"] == engine].sort_values("tokens")
        formula = dict(mode="lines", line={"color": color(engine), "dash": "dot"})
        measured = dict(
            mode="markers",
            marker={"color": color(engine), "size": 10},
            hovertext=[
                f"{engine}: {n} tokens, {b / 1e6:.2f} MB kept ({b / n / 1e3:.1f} KB a token)"
                for n, b in zip(g["tokens"], g["kept_bytes"])
            ],
            hoverinfo="text",
        )
        for col, name, look in (
            ("formula_bytes", "2 x layers x KV heads x head size x bytes", formula),
            ("kept_bytes", "measured", measured),
        ):
            fig.add_trace(go.Scatter(x=g["tokens"], y=g[col] / 1e6, name=f"{engine}, {name}", **look))
    return titled(fig, title or "What a kept prefix cache costs", x="cached tokens", y="KV cache kept (MB)")
