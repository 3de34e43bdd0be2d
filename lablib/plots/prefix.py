"""Prefix-caching figures (lab 08): pure plotly functions of tidy rows (no engine, no measurement).

:func:`ttft_vs_shared` draws :func:`lablib.studies.prefix.shared_prefix` rows (TTFT against the shared
prefix's length, with and without reuse); :func:`chat_turns` draws :func:`lablib.studies.prefix.chat` rows
(TTFT per turn); :func:`kept_memory` draws :func:`lablib.studies.prefix.memory_table` (bytes the kept caches
hold). Each engine keeps its colour (:func:`lablib.plots.color`); reuse is a solid line, no reuse
a dashed one.
"""

from __future__ import annotations

from lablib.plots.style import ENGINE_SYMBOL, color, engine_order, log_ticks, titled
from lablib.results.tables import PREFIX_AXES, need, nonempty, prefix_medians

REUSE_DASH = {True: "solid", False: "dash"}
REUSE_NAME = {True: "reuse", False: "no reuse"}
REUSE_KEY = "dashed, open: no reuse, every prompt prefilled whole; solid: the kept cache copied in, the rest prefilled"


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
    titled(fig, title, x=x_title, y="TTFT, median (ms, log)")
    # ticks written out (200, 300, 500, 700 ms): plotly's own put a bare "2" and "5" between the decades; at most 5 in
    # the data's range, so that a figure of notebook height spaces them apart
    return fig.update_yaxes(**log_ticks(med["ttft_s"].to_numpy(dtype=float) * 1000, max_ticks=5))


def ttft_vs_shared(df, title: str | None = None):
    """TTFT (median, ms, log axis) against the shared prefix's length (tokens), one line per engine
    with reuse (solid) and without (dashed). Needs the rows of :func:`lablib.studies.prefix.shared_prefix`."""
    med = prefix_medians(df, "prefix_shared")
    return _lines(
        med,
        PREFIX_AXES["prefix_shared"],
        "shared prefix (tokens)",
        title or f"TTFT with and without prefix reuse<br><sup>{REUSE_KEY}</sup>",
    )


def chat_turns(df, title: str | None = None):
    """TTFT (median, ms, log axis) per chat turn, one line per engine with the previous turns' cache
    kept (solid) and without (dashed). Needs the rows of :func:`lablib.studies.prefix.chat`."""
    med = prefix_medians(df, "prefix_chat")
    fig = _lines(
        med,
        PREFIX_AXES["prefix_chat"],
        "turn",
        title or f"A chat: TTFT per turn, previous turns kept or not<br><sup>{REUSE_KEY}</sup>",
    )
    fig.update_xaxes(dtick=1)
    return fig


# kept_memory's measured points: a size per engine, largest first in the engines' order, so that engines that keep the
# same bytes (transformers and mlx, both float32) show each its own marker, one around the other, where one would hide
# the other
MEMORY_MARKER_SIZES = (15, 11, 9)


def kept_memory(table, title: str | None = None):
    """Bytes the kept prefix caches hold (MB) against their length (tokens): measured (markers, in the engine's symbol)
    and the count from the model's shape (dotted lines, ``counted``), per engine. Engines that store the same dtype
    keep the same bytes, so their lines coincide: the measured markers differ in symbol and size, one visible around
    the other. Needs :func:`lablib.studies.prefix.memory_table`."""
    import plotly.graph_objects as go

    source = "lablib.studies.prefix.memory_table"
    cols = ["engine", "tokens", "kept_bytes", "formula_bytes"]
    need(nonempty(table, "kept_memory", f"expected a table from {source}"), cols, "kept_memory", source)
    fig = go.Figure()
    for i, engine in enumerate(engine_order(table)):
        g = table[table["engine"] == engine].sort_values("tokens")
        formula = dict(mode="lines", line={"color": color(engine), "dash": "dot"}, legendgroup=engine)
        measured = dict(
            mode="markers",
            marker={
                "color": color(engine),
                "size": MEMORY_MARKER_SIZES[min(i, len(MEMORY_MARKER_SIZES) - 1)],
                "symbol": ENGINE_SYMBOL.get(engine, "circle"),
                "line": {"width": 1, "color": "white"},
            },
            legendgroup=engine,
            hovertext=[
                f"{engine}: {n} tokens, {b / 1e6:.2f} MB kept ({b / n / 1e3:.1f} KB a token)"
                for n, b in zip(g["tokens"], g["kept_bytes"])
            ],
            hoverinfo="text",
        )
        for col, name, look in (("formula_bytes", "counted", formula), ("kept_bytes", "measured", measured)):
            fig.add_trace(go.Scatter(x=g["tokens"], y=g[col] / 1e6, name=f"{engine}, {name}", **look))
    return titled(
        fig,
        title
        or (
            "What a kept prefix cache costs"
            "<br><sup>dotted: counted, 2 × layers × KV heads × head size × bytes per value a token; markers: what each"
            " engine kept (engines of one dtype coincide)</sup>"
        ),
        x="cached tokens",
        y="KV cache kept (MB)",
    )
