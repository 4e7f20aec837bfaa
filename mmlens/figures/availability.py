"""Available vs achieved: token-weighted hit rates per router over time (achieved solid,
available dashed), and avoidable prefill tokens per minute stacked by cause; both SVG."""

from __future__ import annotations

from collections.abc import Sequence

from mmlens.analysis.availability.aggregate import HitRatePoint
from mmlens.analysis.availability.view import CAUSE_TEXT
from mmlens.figures.svg import SERIES_COLOURS, Bar, BarChart, time_slots
from mmlens.figures.svg_lines import LineChart, Series, clock

CAUSE_COLORS = {"load_spill": "#e8a33d", "content_blind": "#d1495b", "stale_index": "#8e6c8a",
                "count_drift": "#2e86ab", "unattributed": "#9aa5b1", "evicted": "#3b8f5a",
                "unexplained": "#5c6770"}


def achieved_vs_available_figure(points: Sequence[HitRatePoint]) -> LineChart:
    """Per router, achieved (solid) and available (dashed) hit rate per minute, each point's
    request count in its tooltip; a minute without requests breaks the lines."""
    by_group: dict[str, list[HitRatePoint]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p)
    lines: list[Series] = []
    for i, (group, pts) in enumerate(sorted(by_group.items())):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        for what, dash in (("achieved", ""), ("available", "6 4")):
            values = [getattr(p, what) for p in pts]
            lines.append(Series(f"{group} · {what}", tuple(
                (p.t, v) for p, v in zip(pts, values, strict=True)), colour, dash=dash,
                hovers=tuple(f"{clock(p.t)} UTC · {group}: {what} {v:.1%} ({p.requests} "
                             "requests)" for p, v in zip(pts, values, strict=True))))
    return LineChart("Achieved vs available hit rate per router (token-weighted, UTC)",
                     tuple(lines), percent=True, step=60.0)


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
