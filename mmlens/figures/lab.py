"""Lab figure: per step, the tokens the engine served from cache and those it computed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from mmlens.analysis.lab_plan import SEED
from mmlens.figures.token_layout import CACHED_COLOR, COMPUTED_COLOR, MARGIN

MISS_COLOR = "#cf1124"


def steps_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """``rows``: the Lab's result rows (step, router, worker, cached, computed, hit %,
    verdict). One stacked bar per step, labelled with its worker; hit % and verdict on top,
    misses in red."""
    routers = {r["router"] for r in rows}
    xs = [f"{r['step']}" + (f" · {r['router']}" if len(routers) > 1 else "")
          + f"<br>{r['worker']}" for r in rows]
    cached = [r.get("cached") or 0 for r in rows]
    computed = [r.get("computed") or 0 for r in rows]
    tops = [("failed" if r.get("error") else
             f"{r['hit %']}% · {r['verdict']}" if r.get("hit %") is not None else r["verdict"])
            for r in rows]
    colours = [MISS_COLOR if r["verdict"] not in ("hit", "unknown", SEED) else "#1f2933"
               for r in rows]
    hover = [f"{r['request']}<br>{r['why']}" for r in rows]
    fig = go.Figure([
        go.Bar(name="cached (served from the prefix cache)", x=xs, y=cached,
               marker={"color": CACHED_COLOR}, hovertext=hover, hoverinfo="text+y"),
        go.Bar(name="computed (prefilled)", x=xs, y=computed, marker={"color": COMPUTED_COLOR},
               text=tops, textposition="outside", textfont={"color": colours},
               hovertext=hover, hoverinfo="text+y"),
    ])
    top = max([c + p for c, p in zip(cached, computed, strict=True)] + [16])
    fig.update_layout(barmode="stack", title="Cached vs computed tokens per step",
                      yaxis={"title": "prompt tokens", "range": [0, top * 1.18]},
                      legend={"orientation": "h", "y": -0.25}, height=380, margin=MARGIN)
    return fig
