"""Affinity page figure: image identity → worker Sankey."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from mmlens.analysis.request_view import short_id
from mmlens.figures.token_layout import IMAGE_COLORS, MARGIN


def affinity_sankey(links: Sequence[tuple[str, str, int]],
                    sizes: dict[str, str] | None = None,
                    worker_names: Mapping[str, str] | None = None) -> go.Figure:
    images = list(dict.fromkeys(i for i, _, _ in links))
    workers = sorted({w for _, w, _ in links})
    sizes = sizes or {}
    names = worker_names or {}
    labels = [f"{short_id(i)} {sizes.get(i, '')}".strip() for i in images]
    labels += [names.get(w, w) for w in workers]
    index = {("i", i): n for n, i in enumerate(images)}
    index.update({("w", w): len(images) + n for n, w in enumerate(workers)})
    colors = [IMAGE_COLORS[n % len(IMAGE_COLORS)] for n in range(len(images))]
    colors += ["#52606d"] * len(workers)
    fig = go.Figure(go.Sankey(
        textfont={"color": "#1f2933", "size": 12, "shadow": "none"},
        node={"label": labels, "color": colors, "pad": 12, "thickness": 14},
        link={"source": [index[("i", i)] for i, _, _ in links],
              "target": [index[("w", w)] for _, w, _ in links],
              "value": [n for _, _, n in links],
              "customdata": [i for i, _, _ in links],
              "hovertemplate": "image %{customdata}<br>→ %{target.label}: %{value} request(s)"
                               "<extra></extra>"}))
    fig.update_layout(title="Image identity → worker (requests)",
                      height=max(300, 24 * len(images) + 80), margin=MARGIN)
    return fig
