"""plotly figures. Each engine keeps one color everywhere; axes carry units; hover shows numbers."""
from __future__ import annotations

ENGINE_COLORS = {"transformers": "#F2A900", "llama.cpp": "#3D7DCA", "mlx": "#2CA58D"}
PHASE_OPACITY = {"prefill": 1.0, "decode": 0.55}


def color(engine: str) -> str:
    return ENGINE_COLORS.get(engine, "#888888")


def prefill_decode_bars(df, title: str | None = None):
    """Stacked bars, one per engine side by side: median prefill time and median
    decode time (first to last token) of the requests in ``df``, seconds."""
    import plotly.graph_objects as go

    med = df.groupby("engine", sort=False)[["prefill_s", "decode_s", "prompt_tokens", "output_tokens"]].median()
    engines = list(med.index)
    fig = go.Figure()
    for phase in ("prefill", "decode"):
        fig.add_bar(
            name=phase, x=engines, y=med[f"{phase}_s"],
            marker_color=[color(e) for e in engines], marker_opacity=PHASE_OPACITY[phase],
            marker_pattern_shape="" if phase == "prefill" else "/",
            customdata=med[["prompt_tokens", "output_tokens"]].to_numpy(),
            hovertemplate=(f"<b>%{{x}}</b><br>{phase}: %{{y:.3f}} s<br>prompt %{{customdata[0]:.0f}} tokens, "
                           "output %{customdata[1]:.0f} tokens<extra></extra>"),
        )
    n_in, n_out = int(med["prompt_tokens"].iloc[0]), int(med["output_tokens"].iloc[0])
    fig.update_layout(barmode="stack", template="plotly_white", legend_title_text="phase",
                      title=title or f"Prefill ({n_in} prompt tokens) and decode ({n_out} output tokens), median",
                      yaxis_title="time (s)", xaxis_title="engine")
    return fig
