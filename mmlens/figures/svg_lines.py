"""Lines and points drawn as inline SVG, for the charts that are read, not explored
(``figures.svg`` says why): a time axis in UTC clock times, each point's value in its native
tooltip, a series' pauses drawn as breaks, and a legend of line swatches. Every point carries
its series, x and y as data attributes, so tests read what is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

from mmlens.figures.svg import AXIS_COLOUR, FONT, GRID_COLOUR, WIDTH, esc, ticks
from mmlens.figures.timeaxis import GAP_STEPS

# Seconds between time ticks: the first that leaves at most MAX_TIME_TICKS ticks.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400)
MAX_TIME_TICKS = 8
LEFT, RIGHT, TOP, BOTTOM = 56, 24, 22, 46
# A line of more points than this shows no markers and answers a hover at every few points:
# each marker is three elements for the browser to build (a 15-minute router-vs-engine chart
# on the 100k store was 3,000 of them).
MAX_MARKED = 150


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float | None], ...]  # (x, y); x a unix time on a time axis
    colour: str
    hovers: tuple[str, ...] = ()  # one per point; "" (or none): "name: y"
    links: tuple[str, ...] = ()  # one per point: a click on it follows the link ("": none)
    ids: tuple[str, ...] = ()  # one per point: what it stands for (a request id), drawn as data
    # Points without a line at one place are drawn once, naming all their ids.
    dash: str = ""  # stroke-dasharray of the line ("": solid)
    line: bool = True  # joined by a line (else points only)
    marker: str = "circle"  # "circle", "x", or "" (none drawn; the tooltip is still there)


@dataclass(frozen=True)
class LineChart:
    title: str
    series: tuple[Series, ...]
    percent: bool = False  # y are shares: axis 0–100 %
    height: int = 320
    time_axis: bool = True  # x are unix times, labelled as UTC clock times
    x_title: str = "UTC"
    y_title: str = ""
    step: float | None = None  # the points' spacing (None: each series' smallest)
    diagonal: bool = False  # a dotted y = x line (x and y on one scale from zero)


def clock(t: float) -> str:
    """A unix time as its UTC clock time, for tooltips."""
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def time_ticks(lo: float, hi: float) -> tuple[list[float], str]:
    """Round UTC times between ``lo`` and ``hi`` and their strftime format."""
    span = max(hi - lo, 1.0)
    step = next((s for s in TIME_STEPS if span / s <= MAX_TIME_TICKS), TIME_STEPS[-1])
    first = math.ceil(lo / step) * step
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if span < 86400 else "%b %d %H:%M"
    return [first + i * step for i in range(int((hi - first) // step) + 1)], fmt


def segments(points: Sequence[tuple[float, float | None]], step: float | None,
             ) -> list[list[tuple[float, float]]]:
    """The runs of a line: broken at a missing y and wherever two consecutive points lie more
    than ``GAP_STEPS`` × ``step`` apart (``step``: the points' smallest spacing if None)."""
    if step is None:
        spacing = [b[0] - a[0] for a, b in pairwise(points) if b[0] > a[0]]
        step = min(spacing) if spacing else 0.0
    runs: list[list[tuple[float, float]]] = []
    last: float | None = None
    for x, y in points:
        if y is None:
            last = None
            continue
        if last is None or (step and x - last > GAP_STEPS * step):
            runs.append([])
        runs[-1].append((x, y))
        last = x
    return runs


def tip(text: str) -> str:
    """Tooltip text, its line breaks as character references: the chart is one line of
    HTML."""
    return esc(text).replace("\n", "&#10;")


def _label(v: float, percent: bool) -> str:
    if percent:
        return f"{v:.0%}"
    return f"{v:,.0f}" if v == int(v) else f"{v:,.2g}"


def line_chart_html(chart: LineChart) -> str:
    """The chart as one line of HTML (title, SVG, legend), every value escaped, for
    ``mmlens.figures.inserted``."""
    h = chart.height
    plot_w, plot_h = WIDTH - LEFT - RIGHT, h - TOP - BOTTOM
    xs = [x for s in chart.series for x, y in s.points if y is not None]
    ys = [y for s in chart.series for _, y in s.points if y is not None]
    if chart.time_axis:
        x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 60.0)
        if x_hi - x_lo < 1:
            x_lo, x_hi = x_lo - 30, x_hi + 30
        x_ticks, fmt = time_ticks(x_lo, x_hi)
    else:
        top = max(xs + (ys if chart.diagonal else []) + [0.0])
        x_ticks, fmt = ticks(top, False), ""
        x_lo, x_hi = 0.0, max(x_ticks[-1], 1e-9)
    y_top = max(ys + (xs if chart.diagonal else []) + [0.0])
    y_ticks = ticks(y_top, chart.percent)
    y_hi = max(y_ticks[-1] * (1.05 if chart.percent else 1.0), 1e-9)
    if chart.diagonal:
        x_hi = y_hi = max(x_hi, y_hi)
        x_ticks = [t for t in ticks(x_hi, False) if t <= x_hi]
        y_ticks = x_ticks

    def px(x: float) -> float:
        return LEFT + plot_w * (x - x_lo) / (x_hi - x_lo)

    def py(y: float) -> float:
        return TOP + plot_h * (y_hi - y) / y_hi

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" '
             f'width="100%" role="img" aria-label="{esc(chart.title)}" {FONT} '
             'font-size="13">']
    for t in y_ticks:
        y = py(t)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{GRID_COLOUR}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end" fill="{AXIS_COLOUR}">{_label(t, chart.percent)}'
                     "</text>")
    foot = TOP + plot_h
    for t in x_ticks:
        x = px(t)
        text = (datetime.fromtimestamp(t, UTC).strftime(fmt) if chart.time_axis
                else _label(t, False))
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{foot:.1f}" y2="{foot + 5:.1f}" '
                     f'stroke="{AXIS_COLOUR}"/><text x="{x:.1f}" y="{foot + 19:.1f}" '
                     f'text-anchor="middle" fill="{AXIS_COLOUR}">{esc(text)}</text>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{foot:.1f}" y2="{foot:.1f}" '
                 f'stroke="{AXIS_COLOUR}"/>')
    if chart.x_title:
        parts.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{h - 6}" text-anchor="middle" '
                     f'fill="{AXIS_COLOUR}">{esc(chart.x_title)}</text>')
    if chart.y_title:
        parts.append(f'<text transform="translate(14,{TOP + plot_h / 2:.1f}) rotate(-90)" '
                     f'text-anchor="middle" fill="{AXIS_COLOUR}">{esc(chart.y_title)}</text>')
    if chart.diagonal:
        parts.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(x_hi):.1f}" '
                     f'y2="{py(y_hi):.1f}" stroke="#9aa5b1" stroke-dasharray="2 4"/>')
    for s in chart.series:
        parts.append(f'<g data-series="{esc(s.name)}">')
        if s.line:
            d = " ".join("M" + " L".join(f"{px(x):.1f} {py(y):.1f}" for x, y in run)
                         for run in segments(s.points, chart.step) if run)
            if d:
                dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
                parts.append(f'<path d="{d}" fill="none" stroke="{esc(s.colour)}" '
                             f'stroke-width="2"{dash}/>')
        shown = [(i, x, y) for i, (x, y) in enumerate(s.points) if y is not None]
        marker = s.marker
        also: dict[int, list[int]] = {}  # a drawn point → the others at the same place
        if not s.line:  # points at one place are drawn once (500 requests: 136 places)
            first: dict[tuple[float, float], int] = {}
            for i, x, y in shown:
                also.setdefault(first.setdefault((x, y), i), []).append(i)
            shown = [(i, x, y) for i, x, y in shown if first[(x, y)] == i]
        if s.line and len(shown) > MAX_MARKED:  # the line carries every point, the tooltips not
            every = math.ceil(len(shown) / MAX_MARKED)
            shown = shown[::every] + ([shown[-1]] if (len(shown) - 1) % every else [])
            marker = ""
        for i, x, y in shown:
            hover = s.hovers[i] if i < len(s.hovers) and s.hovers[i] else \
                f"{s.name}: {_label(y, chart.percent) if chart.percent else f'{y:g}'}"
            same = also.get(i, [i])
            if len(same) > 1:
                hover += f"\n(and {len(same) - 1} more at this point)"
            ids = " ".join(s.ids[j] for j in same if j < len(s.ids) and s.ids[j])
            parts.append(_point(s.colour, marker, px(x), py(y), (x, y), hover,
                                s.links[i] if i < len(s.links) else "", ids))
        parts.append("</g>")
    parts.append("</svg>")
    title = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0 0.6rem">'
             f"{esc(chart.title)}</div>")
    return (f'<div class="mmlens-chart" data-chart-title="{esc(chart.title)}">{title}'
            + "".join(parts) + line_legend_html(chart.series) + "</div>")


def _point(colour: str, marker: str, cx: float, cy: float, xy: tuple[float, float],
           hover: str, link: str, ids: str) -> str:
    colour = esc(colour)
    if marker == "x":
        mark = (f'<path d="M{cx - 4:.1f} {cy - 4:.1f} L{cx + 4:.1f} {cy + 4:.1f} '
                f'M{cx - 4:.1f} {cy + 4:.1f} L{cx + 4:.1f} {cy - 4:.1f}" stroke="{colour}" '
                'stroke-width="2.5"/>')  # its strokes answer the hover
    elif marker:
        mark = f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{colour}" fill-opacity="0.8"/>'
    else:  # nothing drawn, but the point answers a hover
        mark = f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="#fff" fill-opacity="0"/>'
    data = f'data-x="{xy[0]!r}" data-y="{xy[1]!r}"' + (f' data-ids="{esc(ids)}"' if ids
                                                        else "")
    inner = f"<title>{tip(hover)}</title>{mark}"
    if link:  # this tab, said outright (Streamlit's Markdown opened a new one)
        return f'<a href="{esc(link)}" target="_self" {data}>{inner}</a>'
    return f"<g {data}>{inner}</g>"


def line_legend_html(series: Sequence[Series]) -> str:
    """Each series' name beside a swatch of its line (or marker) under the chart."""
    keys = []
    for s in series:
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        swatch = (f'<line x1="0" y1="5" x2="22" y2="5" stroke="{esc(s.colour)}" '
                  f'stroke-width="2"{dash}/>' if s.line else "")
        if s.marker == "x":
            swatch += (f'<path d="M7 1 L15 9 M7 9 L15 1" stroke="{esc(s.colour)}" '
                       'stroke-width="2"/>')
        elif s.marker:
            swatch += f'<circle cx="11" cy="5" r="3.5" fill="{esc(s.colour)}"/>'
        keys.append(f'<span style="margin-right:1.2rem;white-space:nowrap">'
                    f'<svg width="22" height="10" style="margin-right:0.3rem">{swatch}</svg>'
                    f"{esc(s.name)}</span>")
    return (f'<div style="font-size:0.85rem;color:#31333f;margin:0 0 0.5rem 3.5rem">'
            f'{"".join(keys)}</div>' if keys else "")
