"""Routing page figures: processing mode and reason over time, cache-aware branches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from mmlens.figures.timeaxis import TIME_AXIS, bar_width_ms, utc
from mmlens.figures.token_layout import MARGIN

Point = tuple[float, float]


def mode_reason_figure(series: Mapping[tuple[str, ...], Sequence[Point]]) -> go.Figure:
    """``series`` keyed (target, model, mode, reason): requests per interval."""
    fig = go.Figure()
    width = bar_width_ms([p[0] for points in series.values() for p in points])
    for (target, model, mode, reason), points in sorted(series.items()):
        fig.add_trace(go.Bar(name=f"{mode} / {reason} · {model.split('/')[-1]}",
                             x=utc([p[0] for p in points]), y=[p[1] for p in points],
                             width=width, hovertext=f"{target}: {model}", legendgroup=mode))
    fig.update_layout(barmode="stack", showlegend=True, xaxis=TIME_AXIS,
                      title="Image requests by processing mode / reason "
                      "(smg_mm_processing_total, per interval, UTC)", height=320, margin=MARGIN)
    return fig


def _bars_per_target(counts_by_target: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """One bar trace per target: its counts by name, names sorted."""
    fig = go.Figure()
    for target, counts in sorted(counts_by_target.items()):
        names = sorted(counts)
        fig.add_trace(go.Bar(name=target, x=names, y=[counts[n] for n in names]))
    return fig


def branches_figure(branches: Mapping[str, Mapping[str, float]]) -> go.Figure:
    fig = _bars_per_target(branches)
    fig.update_layout(showlegend=True, title="Cache-aware policy branches (since router start)",
                      height=300, margin=MARGIN)
    return fig


def dynamo_events_figure(applied: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """``applied``: target → {"event_type/status": count}."""
    fig = _bars_per_target(applied)
    fig.update_layout(title="Dynamo KV events applied by type / status", height=280, margin=MARGIN)
    return fig
