"""Routing page figures: processing mode and reason over time, cache-aware branches. All are
read, not explored: inline SVG bars (``figures.svg``), so the Routing page loads no Plotly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mmlens.figures.svg import SERIES_COLOURS, Bar, BarChart, time_slots

Point = tuple[float, float]


def mode_reason_figure(series: Mapping[tuple[str, ...], Sequence[Point]]) -> BarChart:
    """``series`` keyed (target, model, mode, reason): requests per interval, stacked."""
    slots, by_ts = time_slots([p[0] for points in series.values() for p in points])
    bars, legend = [], []
    for i, ((target, model, mode, reason), points) in enumerate(sorted(series.items())):
        name = f"{mode} / {reason} · {model.split('/')[-1]}"
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        legend.append((name, colour))
        for ts, n in points:
            label = by_ts[ts]
            bars.append(Bar(label, n, hover=f"{name} at {label} UTC: {n:g} requests "
                            f"({target}: {model})", colour=colour, series=name))
    return BarChart("Image requests by processing mode / reason (smg_mm_processing_total, "
                    "per interval, UTC)", tuple(bars), height=320, stacked=True,
                    slots=slots, time_axis=True, legend=tuple(legend))


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
