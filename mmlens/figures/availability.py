"""Available vs achieved: token-weighted hit rates per router over time (achieved solid,
available dashed; Plotly, a line per router to hide or compare), and avoidable prefill tokens
per minute stacked by cause (SVG bars)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmlens.analysis.availability.aggregate import HitRatePoint
from mmlens.analysis.availability.view import CAUSE_TEXT
from mmlens.figures.plain import PlainFigure
from mmlens.figures.svg import SERIES_COLOURS, Bar, BarChart, time_slots
from mmlens.figures.timeaxis import TIME_AXIS, gapped
from mmlens.figures.token_layout import MARGIN

CAUSE_COLORS = {"load_spill": "#e8a33d", "content_blind": "#d1495b", "stale_index": "#8e6c8a",
                "count_drift": "#2e86ab", "unattributed": "#9aa5b1", "evicted": "#3b8f5a",
                "unexplained": "#5c6770"}


def achieved_vs_available_figure(points: Sequence[HitRatePoint]) -> PlainFigure:
    by_group: dict[str, list[HitRatePoint]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p)
    data: list[dict[str, Any]] = []
    for group, pts in sorted(by_group.items()):
        x, achieved = gapped([(p.t, p.achieved) for p in pts], 60.0)
        _, available = gapped([(p.t, p.available) for p in pts], 60.0)
        requests = _requests(pts, achieved)
        data.append({"type": "scatter", "name": f"{group} · achieved", "x": x, "y": achieved,
                     "mode": "lines+markers", "customdata": requests,
                     "hovertemplate": "achieved %{y:.1%} (%{customdata} requests)"
                                      "<extra></extra>"})
        data.append({"type": "scatter", "name": f"{group} · available", "x": x,
                     "y": available, "mode": "lines+markers", "line": {"dash": "dash"},
                     "customdata": requests,
                     "hovertemplate": "available %{y:.1%} (%{customdata} requests)"
                                      "<extra></extra>"})
    return PlainFigure({"data": data, "layout": {
        "title": {"text": "Achieved vs available hit rate per router (token-weighted, UTC)"},
        "yaxis": {"range": [0, 1.05], "tickformat": ".0%"}, "height": 320,
        "xaxis": TIME_AXIS, "showlegend": True, "margin": MARGIN}})


def _requests(pts: Sequence[HitRatePoint], ys: Sequence[float | None]) -> list[int | None]:
    """Each point's request count, aligned with a gapped series (None at its breaks)."""
    counts = iter(p.requests for p in pts)
    return [None if y is None else next(counts) for y in ys]


def avoidable_figure(rows: Sequence[tuple[float, str, float]]) -> BarChart:
    """``rows``: (bucket start, cause, avoidable tokens per minute), stacked by cause; read,
    not explored: SVG bars."""
    slots, label_of = time_slots([r[0] for r in rows], 60.0)
    causes = list(dict.fromkeys(cause for _, cause, _ in rows))
    colour = {c: CAUSE_COLORS.get(c, SERIES_COLOURS[i % len(SERIES_COLOURS)])
              for i, c in enumerate(causes)}
    bars = tuple(Bar(label_of[t], per_min, hover=f"{label_of[t]} UTC · "
                     f"{CAUSE_TEXT.get(cause, cause)}: {per_min:.0f} tokens/min",
                     colour=colour[cause], series=cause) for t, cause, per_min in rows)
    return BarChart("Avoidable prefill tokens per minute, by cause (UTC)", bars, height=320,
                    stacked=True, slots=slots, time_axis=True,
                    legend=tuple((c, colour[c]) for c in causes))
