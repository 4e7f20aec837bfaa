"""What if page figure: the token-weighted hit rate per minute of the recording, its baseline
replay and each scenario, one line each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from mmlens.figures.timeaxis import TIME_AXIS, gapped
from mmlens.figures.token_layout import MARGIN

Point = tuple[float, float]
RECORDED_STYLE = {"color": "#1f2933", "width": 3}
BASELINE_STYLE = {"color": "#7b8794", "dash": "dot"}


def minute_hit_rates(series: Mapping[str, Sequence[Point]]) -> go.Figure:
    """``series``: line name → (minute start, hit rate); "recorded" first and drawn heavy,
    the baseline dotted, the scenarios in Plotly's colours."""
    fig = go.Figure()
    for i, (name, points) in enumerate(series.items()):
        xs, ys = gapped(points, 60.0)
        style = RECORDED_STYLE if i == 0 else BASELINE_STYLE if i == 1 else {}
        fig.add_trace(go.Scatter(name=name, x=xs, y=ys, mode="lines+markers",
                                 connectgaps=False, line=style))
    fig.update_layout(title="Prefix hit rate per minute (token-weighted, UTC)",
                      yaxis={"range": [0, 1.05], "tickformat": ".0%"}, xaxis=TIME_AXIS,
                      showlegend=True, height=340, margin=MARGIN)
    return fig
