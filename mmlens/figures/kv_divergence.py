"""Router view vs engine holdings over time: per worker, blocks the router believes resident
that the engine evicted (solid) and blocks the engine holds that the router does not know
(dotted); one marker per routed request for prediction-based points."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.figures.svg_lines import LineChart, Series, clock
from mmlens.figures.workers import faded, worker_colour

_DASH = {"event_plane": "", "index_gauge": "8 4"}


def divergence_figure(points: Sequence[ViewPoint],
                      worker_names: Mapping[str, str] | None = None) -> LineChart:
    series: dict[tuple[str, str], list[ViewPoint]] = {}
    for p in points:
        series.setdefault(((worker_names or {}).get(p.worker, p.worker), p.source),
                          []).append(p)
    lines: list[Series] = []
    for (worker, source), pts in sorted(series.items()):
        colour = worker_colour(worker)
        if source == "prediction":
            lines.append(Series(
                f"{worker} · predicted not cached", tuple((p.ts, p.router_only) for p in pts),
                colour, line=False, marker="x", ids=tuple(p.request_id or "" for p in pts),
                hovers=tuple(f"{clock(p.ts)} UTC · {p.request_id}: {p.router_only} block(s) "
                             "predicted, not cached" for p in pts)))
            continue
        for what, dash, shade in (("router only", _DASH.get(source, ""), colour),
                                  ("engine only", "2 3", faded(colour, 0.7))):
            values = [p.router_only if what == "router only" else p.engine_only for p in pts]
            lines.append(Series(
                f"{worker} · {what} ({source})",
                tuple((p.ts, v) for p, v in zip(pts, values, strict=True)), shade, dash=dash,
                marker="", hovers=tuple(f"{clock(p.ts)} UTC · {worker}: {v} block(s) {what} "
                                        f"({source})" for p, v in zip(pts, values, strict=True))))
    return LineChart("Router view vs engine holdings (blocks, UTC)", tuple(lines), height=340,
                     y_title="blocks")
