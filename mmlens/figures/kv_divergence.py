"""Router view vs engine holdings over time: per worker, blocks the router believes resident
that the engine evicted (solid) and blocks the engine holds that the router does not know
(dotted); one marker per routed request for prediction-based points."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.figures.plain import PlainFigure
from mmlens.figures.timeaxis import TIME_AXIS, utc
from mmlens.figures.token_layout import MARGIN
from mmlens.figures.workers import faded, worker_colour

_DASH = {"event_plane": "solid", "index_gauge": "dash"}


def divergence_figure(points: Sequence[ViewPoint],
                      worker_names: Mapping[str, str] | None = None) -> PlainFigure:
    series: dict[tuple[str, str], list[ViewPoint]] = {}
    for p in points:
        series.setdefault(((worker_names or {}).get(p.worker, p.worker), p.source),
                          []).append(p)
    data: list[dict[str, Any]] = []
    for (worker, source), pts in sorted(series.items()):
        x = utc([p.ts for p in pts])
        colour = worker_colour(worker)
        if source == "prediction":
            data.append({
                "type": "scatter", "name": f"{worker} · predicted not cached", "x": x,
                "y": [p.router_only for p in pts], "mode": "markers",
                "marker": {"symbol": "x", "size": 9, "color": colour},
                "customdata": [p.request_id for p in pts],
                "hovertemplate": "%{customdata}: %{y} block(s) predicted, not cached"
                                 "<extra></extra>"})
            continue
        dash = _DASH.get(source, "solid")
        data.append({"type": "scatter", "name": f"{worker} · router only ({source})", "x": x,
                     "y": [p.router_only for p in pts], "mode": "lines",
                     "line": {"dash": dash, "color": colour}})
        data.append({"type": "scatter", "name": f"{worker} · engine only ({source})", "x": x,
                     "y": [p.engine_only for p in pts], "mode": "lines",
                     "line": {"dash": "dot", "color": faded(colour, 0.7)}})
    return PlainFigure({"data": data, "layout": {
        "title": {"text": "Router view vs engine holdings (blocks, UTC)"}, "height": 340,
        "yaxis": {"title": {"text": "blocks"}, "rangemode": "tozero"}, "margin": MARGIN,
        "xaxis": TIME_AXIS, "legend": {"orientation": "h", "y": -0.3}}})
