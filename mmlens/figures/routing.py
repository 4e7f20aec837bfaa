"""Routing page figures: processing mode and reason over time, cache-aware branches. All are
read, not explored: inline SVG bars (``figures.svg``), so the Routing page loads no Plotly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import pairwise

from mmlens.figures.svg import SERIES_COLOURS, Bar, BarChart

Point = tuple[float, float]
MAX_TIME_SLOTS = 720  # 6 h of 30 s buckets


def _time_slots(ts: Sequence[float]) -> tuple[list[float], float]:
    """Every bucket from the first to the last at the buckets' spacing (an interval without
    requests is an empty slot, not squeezed out), and that spacing."""
    found = sorted(set(ts))
    spacing = [b - a for a, b in pairwise(found) if b > a]
    step = min(spacing) if spacing else 30.0
    n = round((found[-1] - found[0]) / step) + 1 if found else 0
    if n > MAX_TIME_SLOTS:
        return found, step
    return [found[0] + i * step for i in range(n)], step


def _clock(ts: float, step: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S" if step < 60 else "%H:%M")


def mode_reason_figure(series: Mapping[tuple[str, ...], Sequence[Point]]) -> BarChart:
    """``series`` keyed (target, model, mode, reason): requests per interval, stacked."""
    slots, step = _time_slots([p[0] for points in series.values() for p in points])
    by_ts = {t: _clock(t, step) for t in slots}
    bars, legend = [], []
    for i, ((target, model, mode, reason), points) in enumerate(sorted(series.items())):
        name = f"{mode} / {reason} · {model.split('/')[-1]}"
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        legend.append((name, colour))
        for ts, n in points:
            label = by_ts.get(ts) or _clock(ts, step)
            bars.append(Bar(label, n, hover=f"{name} at {label} UTC: {n:g} requests "
                            f"({target}: {model})", colour=colour, series=name))
    return BarChart("Image requests by processing mode / reason (smg_mm_processing_total, "
                    "per interval, UTC)", tuple(bars), height=320, stacked=True,
                    slots=tuple(by_ts.values()), time_axis=True, legend=tuple(legend))


def _bars_per_target(title: str, counts_by_target: Mapping[str, Mapping[str, float]],
                     height: int) -> BarChart:
    """One series per target, side by side: its counts by name, names sorted."""
    names = sorted({n for counts in counts_by_target.values() for n in counts})
    bars, legend = [], []
    for i, (target, counts) in enumerate(sorted(counts_by_target.items())):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        legend.append((target, colour))
        bars += [Bar(n, counts[n], f"{counts[n]:g}", f"{target}: {n} {counts[n]:g}", colour,
                     target) for n in names if n in counts]
    return BarChart(title, tuple(bars), height=height, slots=tuple(names),
                    legend=tuple(legend))


def branches_figure(branches: Mapping[str, Mapping[str, float]]) -> BarChart:
    return _bars_per_target("Cache-aware policy branches (since router start)", branches, 300)


def dynamo_events_figure(applied: Mapping[str, Mapping[str, float]]) -> BarChart:
    """``applied``: target → {"event_type/status": count}."""
    return _bars_per_target("Dynamo KV events applied by type / status", applied, 280)
