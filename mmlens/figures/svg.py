"""Plain bar charts drawn as inline SVG, for charts that are read, not explored.

A new browser tab evaluates Plotly's JavaScript (a 4.7 MB chunk) before it draws its first
Plotly chart; a bar chart that is only read (no zoom, no selection, no trace to hide) is inline
SVG instead, each bar's details in its native tooltip. Every bar carries its
label, series and value as data attributes, so tests read what is drawn."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

WIDTH = 1000  # viewBox units; the SVG scales to the column it is in
FONT = 'font-family="Source Sans, sans-serif"'
AXIS_COLOUR = "#5c6f82"
GRID_COLOUR = "#e4e7eb"
SLANT_AFTER = 12  # more slots than this: labels slanted so they do not run together
MAX_LABELS = 10  # on a time axis, at most this many slots are labelled
# Series that are not workers (workers keep ``figures.workers``' colours): Plotly's default
# colourway, so they read as the charts beside them.
MAX_TIME_SLOTS = 720  # 6 h of 30 s buckets
SERIES_COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692",
                  "#b6e880", "#ff97ff", "#fecb52")


@dataclass(frozen=True)
class Bar:
    label: str  # its slot on the x axis
    value: float
    text: str = ""  # printed above the bar (unstacked charts)
    hover: str = ""  # the bar's tooltip
    colour: str = "#3b6fd8"
    series: str = ""  # bars of one slot: side by side, or stacked


@dataclass(frozen=True)
class BarChart:
    title: str
    bars: tuple[Bar, ...]
    percent: bool = False  # values are shares: axis 0–100 %
    height: int = 300
    stacked: bool = False  # a slot's bars stack (else they stand side by side)
    slots: tuple[str, ...] = ()  # every slot in order, empty ones too (default: the bars')
    time_axis: bool = False  # slots are times: only every few are labelled, level
    legend: tuple[tuple[str, str], ...] = ()  # (series, colour) keys under the chart
    signed: bool = False  # negative values drawn down from zero (else drawn as zero)


def time_slots(ts: Sequence[float], default_step: float = 30.0,
               ) -> tuple[tuple[str, ...], dict[float, str]]:
    """The UTC clock time of every bucket from the first to the last at the buckets' spacing
    (an interval without data is an empty slot, not squeezed out; past ``MAX_TIME_SLOTS``
    only the buckets found), and each bucket's slot."""
    found = sorted(set(ts))
    if not found:
        return (), {}
    spacing = [b - a for a, b in pairwise(found) if b > a]
    step = min(spacing) if spacing else default_step
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"

    def clock(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime(fmt)

    n = round((found[-1] - found[0]) / step) + 1
    if n > MAX_TIME_SLOTS:
        return tuple(clock(t) for t in found), {t: clock(t) for t in found}
    slots = tuple(clock(found[0] + i * step) for i in range(n))
    return slots, {t: slots[round((t - found[0]) / step)] for t in found}


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def ticks(top: float, percent: bool) -> list[float]:
    if percent:
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    if top <= 0:
        return [0.0, 1.0]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _tick_text(v: float, percent: bool) -> str:
    if percent:
        return f"{v:.0%}"
    return f"{v:,.0f}" if v == int(v) else f"{v:,.2g}"


def _slots(chart: BarChart) -> list[str]:
    if chart.slots:
        return list(chart.slots)
    return list(dict.fromkeys(b.label for b in chart.bars))


def _reach(chart: BarChart, slots: list[str], extreme: Callable[..., float]) -> float:
    """How far the bars reach from zero, up (``max``) or down (``min``): a slot's bars of
    that sign stack when ``stacked``."""
    if not chart.stacked:
        return extreme([b.value for b in chart.bars] + [0.0])
    sums = dict.fromkeys(slots, 0.0)
    for b in chart.bars:
        sums[b.label] = sums.get(b.label, 0.0) + extreme(0.0, b.value)
    return extreme([*sums.values(), 0.0])


def bar_chart_html(chart: BarChart) -> str:
    """The chart as one line of HTML (title, SVG, legend), every value escaped, for
    ``mmlens.figures.inserted``."""
    slots = _slots(chart)
    slanted = len(slots) > SLANT_AFTER and not chart.time_axis
    left, right, top_px = 56, 12, 22
    bottom = 96 if slanted else 34
    h = chart.height
    plot_w, plot_h = WIDTH - left - right, h - top_px - bottom
    high = _reach(chart, slots, max)
    low = _reach(chart, slots, min) if chart.signed else 0.0
    axis = ticks(max(high, -low), chart.percent)
    if low < 0:  # the same step below zero, down to the lowest stack
        step = axis[1]
        axis = [-step * i for i in range(math.ceil(-low / step - 1e-9), 0, -1)] + [
            step * i for i in range(math.ceil(high / step - 1e-9) + 1)]
    y_max = max(axis[-1] * (1.05 if chart.percent else 1.0), 1e-9)
    y_min = min(axis[0], 0.0)

    def y_of(v: float) -> float:
        v = v if chart.signed else max(0.0, v)
        return top_px + plot_h * (y_max - v) / (y_max - y_min)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" '
             f'width="100%" role="img" aria-label="{esc(chart.title)}" {FONT} '
             'font-size="13">']
    for t in axis:
        y = y_of(t)
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{GRID_COLOUR}"/><text x="{left - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end" fill="{AXIS_COLOUR}">'
                     f"{_tick_text(t, chart.percent)}</text>")
    slot_w = plot_w / max(1, len(slots))
    index = {s: i for i, s in enumerate(slots)}
    per_slot: dict[str, list[Bar]] = {}
    for b in chart.bars:
        per_slot.setdefault(b.label, []).append(b)
    base = y_of(0.0)
    foot = y_of(y_min)  # slot labels under the lowest bar
    every = max(1, math.ceil(len(slots) / MAX_LABELS)) if chart.time_axis else 1
    for label, bars in per_slot.items():
        i = index.get(label)
        if i is None:
            continue
        cx = left + slot_w * (i + 0.5)
        width = min(slot_w * 0.8, 120.0)
        each = width if chart.stacked else width / len(bars)
        up = down = 0.0  # a stack's top and (signed) bottom so far
        for j, b in enumerate(bars):
            x = cx - width / 2 + (0 if chart.stacked else j * each)
            start = (up if b.value >= 0 else down) if chart.stacked else 0.0
            end = start + b.value
            y_top, y_bottom = y_of(max(start, end)), y_of(min(start, end))
            if chart.stacked and b.value >= 0:
                up = end
            elif chart.stacked and chart.signed:
                down = end
            tip = b.hover or f"{b.series or b.label}: {b.text or f'{b.value:g}'}"
            parts.append(f'<g data-label="{esc(b.label)}" data-series="{esc(b.series)}" '
                         f'data-value="{b.value!r}"><title>{esc(tip)}</title>'
                         f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{each:.1f}" '
                         f'height="{max(0.0, y_bottom - y_top):.1f}" fill="{esc(b.colour)}"/>')
            if b.text and not chart.stacked and not slanted:
                parts.append(f'<text x="{x + each / 2:.1f}" y="{y_top - 5:.1f}" '
                             f'text-anchor="middle" fill="#1f2933">{esc(b.text)}</text>')
            parts.append("</g>")
    for i, label in enumerate(slots):
        if i % every:
            continue
        cx = left + slot_w * (i + 0.5)
        if slanted:
            parts.append(f'<text transform="translate({cx:.1f},{foot + 12:.1f}) rotate(-40)" '
                         f'text-anchor="end" fill="{AXIS_COLOUR}" font-size="12">'
                         f"{esc(label)}</text>")
        else:
            parts.append(f'<text x="{cx:.1f}" y="{foot + 18:.1f}" text-anchor="middle" '
                         f'fill="{AXIS_COLOUR}">{esc(label)}</text>')
    parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{base:.1f}" y2="{base:.1f}" '
                 f'stroke="{AXIS_COLOUR}"/></svg>')
    title = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0 0.6rem">'
             f"{esc(chart.title)}</div>")
    legend = legend_html(chart.legend)
    return (f'<div class="mmlens-chart" data-chart-title="{esc(chart.title)}">{title}'
            + "".join(parts) + legend + "</div>")


def legend_html(legend: Sequence[tuple[str, str]]) -> str:
    """(series, colour) keys in a row under a chart ("" for none)."""
    keys = "".join(f'<span style="margin-right:1.2rem;white-space:nowrap">'
                   f'<span style="display:inline-block;width:0.8rem;height:0.8rem;'
                   f'background:{esc(colour)};margin-right:0.3rem;vertical-align:-0.1rem">'
                   f"</span>{esc(name)}</span>" for name, colour in legend)
    return (f'<div style="font-size:0.85rem;color:#31333f;margin:0 0 0.5rem 3.5rem">'
            f"{keys}</div>" if keys else "")
