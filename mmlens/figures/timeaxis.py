"""Time on an x axis: UTC datetimes, so Plotly spaces and formats the ticks for the span shown
(a handful of readable, level labels instead of one rotated string per point), and series
broken where they have no data instead of a line bridging the gap."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

# Ticks under a second apart get milliseconds, or two ticks would read the same (18:29:59 ×2).
TIME_AXIS: dict[str, Any] = {
    "type": "date", "tickangle": 0, "nticks": 8, "title": {"text": "UTC"},
    "tickformatstops": [{"dtickrange": [None, 1000], "value": "%H:%M:%S.%L"},
                        {"dtickrange": [1000, 86_400_000], "value": "%H:%M:%S"},
                        {"dtickrange": [86_400_000, None], "value": "%b %d"}]}
GAP_STEPS = 1.5  # a pause longer than this many steps breaks the line


def utc(ts: Sequence[float]) -> list[datetime]:
    """Unix times as naive UTC datetimes (Plotly shows them as given)."""
    return [datetime.fromtimestamp(t, UTC).replace(tzinfo=None) for t in ts]


def gapped(points: Sequence[tuple[float, float]], step: float | None = None,
           ) -> tuple[list[datetime | None], list[float | None]]:
    """x and y of a line with a break (None) wherever two consecutive points lie more than
    ``GAP_STEPS`` × ``step`` apart (``step``: the series' smallest spacing when not given)."""
    ts = [p[0] for p in points]
    if step is None:
        spacing = [b - a for a, b in pairwise(ts) if b > a]
        step = min(spacing) if spacing else 0.0
    xs: list[datetime | None] = []
    ys: list[float | None] = []
    for i, (t, v) in enumerate(points):
        if i and step and t - ts[i - 1] > GAP_STEPS * step:
            xs.append(None)
            ys.append(None)
        xs.append(utc([t])[0])
        ys.append(v)
    return xs, ys
