"""Plain bar charts drawn as inline SVG, for pages whose charts need no chart library.

A new browser tab evaluates Plotly's JavaScript (a 4.7 MB chunk) before it draws its first
Plotly chart; a bar chart that is only read (no zoom, no selection, no legend to toggle) is
SVG in a Markdown block instead, each bar's details in its native tooltip. Every bar carries
its label and value as data attributes, so tests read what is drawn."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

WIDTH = 1000  # viewBox units; the SVG scales to the column it is in
FONT = 'font-family="Source Sans, sans-serif"'
AXIS_COLOUR = "#5c6f82"
GRID_COLOUR = "#e4e7eb"
ROTATE_AFTER = 12  # more bars than this: labels slanted so they do not run together


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str = ""  # printed above the bar
    hover: str = ""  # the bar's tooltip
    colour: str = "#3b6fd8"


@dataclass(frozen=True)
class BarChart:
    title: str
    bars: tuple[Bar, ...]
    percent: bool = False  # values are shares: axis 0–100 %
    height: int = 300


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _ticks(top: float, percent: bool) -> list[float]:
    if percent:
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    if top <= 0:
        return [0.0, 1.0]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step + 0.999) + 1)]


def _tick_text(v: float, percent: bool) -> str:
    if percent:
        return f"{v:.0%}"
    return f"{v:,.0f}" if v == int(v) else f"{v:,.2g}"


def bar_chart_html(chart: BarChart) -> str:
    """The chart as one line of HTML (a title and an SVG), for ``st.markdown(...,
    unsafe_allow_html=True)``: one line, so Markdown reads it as a raw HTML block and leaves
    its text alone."""
    bars = chart.bars
    slanted = len(bars) > ROTATE_AFTER
    left, right, top_px = 56, 12, 22
    bottom = 96 if slanted else 34
    h = chart.height
    plot_w, plot_h = WIDTH - left - right, h - top_px - bottom
    ticks = _ticks(max([b.value for b in bars] + [0.0]), chart.percent)
    y_max = ticks[-1] * (1.05 if chart.percent else 1.0)

    def y_of(v: float) -> float:
        return top_px + plot_h * (1 - max(0.0, v) / y_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" '
             f'width="100%" role="img" aria-label="{_esc(chart.title)}" {FONT} '
             'font-size="13">']
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{GRID_COLOUR}"/><text x="{left - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end" fill="{AXIS_COLOUR}">'
                     f"{_tick_text(t, chart.percent)}</text>")
    slot = plot_w / max(1, len(bars))
    width = min(slot * 0.8, 120.0)
    base = y_of(0.0)
    for i, b in enumerate(bars):
        cx = left + slot * (i + 0.5)
        y = y_of(b.value)
        tip = b.hover or f"{b.label}: {b.text or b.value}"
        parts.append(f'<g data-label="{_esc(b.label)}" data-value="{b.value!r}">'
                     f"<title>{_esc(tip)}</title>"
                     f'<rect x="{cx - width / 2:.1f}" y="{y:.1f}" width="{width:.1f}" '
                     f'height="{max(0.0, base - y):.1f}" fill="{_esc(b.colour)}"/>')
        if b.text and not slanted:
            parts.append(f'<text x="{cx:.1f}" y="{y - 5:.1f}" text-anchor="middle" '
                         f'fill="#1f2933">{_esc(b.text)}</text>')
        if slanted:
            parts.append(f'<text transform="translate({cx:.1f},{base + 12:.1f}) rotate(-40)" '
                         f'text-anchor="end" fill="{AXIS_COLOUR}" font-size="12">'
                         f"{_esc(b.label)}</text>")
        else:
            parts.append(f'<text x="{cx:.1f}" y="{base + 18:.1f}" text-anchor="middle" '
                         f'fill="{AXIS_COLOUR}">{_esc(b.label)}</text>')
        parts.append("</g>")
    parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{base:.1f}" y2="{base:.1f}" '
                 f'stroke="{AXIS_COLOUR}"/></svg>')
    title = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0 0.6rem">'
             f"{_esc(chart.title)}</div>")
    return (f'<div class="mmlens-chart" data-chart-title="{_esc(chart.title)}">{title}'
            + "".join(parts) + "</div>")

