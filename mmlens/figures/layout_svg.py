"""The token layout drawn as inline SVG: the Inspector's first draw in a tab waits for no
Plotly code (its 4.7 MB chunk was most of the page's first click).

The same rows, span colours, block grid, divergent blocks and per-block tooltips (hash,
content key, images) as ``token_layout.layout_figure``, which stays one toggle away for
zooming into long prompts. Every span and block carries its row and series as data
attributes, so tests read what is drawn."""

from __future__ import annotations

from mmlens.analysis.request_view import RequestView
from mmlens.figures.svg import AXIS_COLOUR, FONT, GRID_COLOUR, WIDTH, esc, legend_html, ticks
from mmlens.figures.token_layout import (
    CACHED_COLOR,
    COMPUTED_COLOR,
    MARK_COLOR,
    block_tips,
    engine_row_name,
    grid_blocks,
    group_color,
    span_groups,
)

MAX_SVG_BLOCKS = 300  # per row: past it, the zoomable chart has every block's tooltip
LABEL_W = 200  # the row names' column, in viewBox units
ROW_H, ROW_GAP, TOP, BOTTOM = 30, 12, 26, 44


def _tip(lines: list[str]) -> str:
    return "&#10;".join(esc(line) for line in lines)


def layout_svg_html(rv: RequestView, title: str | None = None) -> str:
    """The layout as one line of HTML (title, SVG, legend), every value escaped, for
    ``mmlens.figures.inserted``."""
    engine_row = engine_row_name(rv)
    rows = [r.name for r in rv.rows] + ([engine_row] if engine_row else [])
    prompt = int(rv.counts.get("engine_prompt_tokens") or 0)
    longest = max([r.length for r in rv.rows] + [prompt, 1])
    axis = ticks(longest * 1.01, False)
    x_max = axis[-1]
    plot_w = WIDTH - LABEL_W - 12
    height = TOP + len(rows) * (ROW_H + ROW_GAP) + BOTTOM
    row_y = {name: TOP + i * (ROW_H + ROW_GAP) + ROW_GAP / 2 for i, name in enumerate(rows)}
    base = height - BOTTOM

    def x_of(token: float) -> float:
        return LABEL_W + plot_w * token / x_max

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
             f'width="100%" role="img" aria-label="{esc(title or "token layout")}" {FONT} '
             'font-size="13">']
    for t in axis:
        parts.append(f'<line x1="{x_of(t):.1f}" x2="{x_of(t):.1f}" y1="{TOP}" y2="{base}" '
                     f'stroke="{GRID_COLOUR}"/><text x="{x_of(t):.1f}" y="{base + 16}" '
                     f'text-anchor="middle" fill="{AXIS_COLOUR}">{t:,.0f}</text>')
    for d in rv.divergences[:3]:
        x0, x1 = x_of(d.block * rv.block_size), x_of((d.block + 1) * rv.block_size)
        parts.append(f'<rect x="{x0:.1f}" y="{TOP}" width="{x1 - x0:.1f}" '
                     f'height="{base - TOP}" fill="{MARK_COLOR}" opacity="0.18"/>')
    for name, y in row_y.items():
        parts.append(f'<text x="{LABEL_W - 8}" y="{y + ROW_H / 2 + 4:.1f}" text-anchor="end" '
                     f'fill="#1f2933">{esc(name)}</text>')

    def span(series: str, row: str, start: int, length: int, colour: str, tip: str) -> None:
        parts.append(f'<g data-series="{esc(series)}" data-row="{esc(row)}" '
                     f'data-start="{start}" data-length="{length}"><title>{tip}</title>'
                     f'<rect x="{x_of(start):.1f}" y="{row_y[row]:.1f}" '
                     f'width="{x_of(start + length) - x_of(start):.2f}" height="{ROW_H}" '
                     f'fill="{esc(colour)}"/></g>')

    legend = []
    for key, g in span_groups(rv).items():
        legend.append((key, group_color(key)))
        for length, start, row, text in zip(g["x"], g["base"], g["y"], g["text"], strict=True):
            span(key, row, start, length, group_color(key), esc(text))
    if engine_row:
        cached = min(int(rv.cached_tokens or 0), prompt)
        span("cached (engine)", engine_row, 0, cached, CACHED_COLOR,
             esc(f"cached tokens 0–{cached}"))
        span("computed (engine)", engine_row, cached, prompt - cached, COMPUTED_COLOR,
             esc(f"computed tokens {cached}–{prompt}"))
        legend += [("cached (engine)", CACHED_COLOR), ("computed (engine)", COMPUTED_COLOR)]
        if rv.predicted_tokens is not None:
            x = x_of(rv.predicted_tokens)
            y = row_y[engine_row]
            parts.append(f'<g data-series="router predicted" data-row="{esc(engine_row)}" '
                         f'data-start="{rv.predicted_tokens}" data-length="0"><title>'
                         f"{esc(f'router predicted {rv.predicted_tokens} cached tokens')}"
                         f'</title><line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 4:.1f}" '
                         f'y2="{y + ROW_H + 4:.1f}" stroke="{MARK_COLOR}" stroke-width="3"/></g>')
            legend.append(("router predicted", MARK_COLOR))
    for b in grid_blocks(rv):
        x = x_of(b * rv.block_size)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{base}" '
                     'stroke="rgba(31,41,51,0.35)"/>')
    per_row: dict[str, int] = {}
    for row, start, end, lines in block_tips(rv):
        per_row[row] = per_row.get(row, 0) + 1
        if per_row[row] > MAX_SVG_BLOCKS:
            continue
        parts.append(f'<g data-block-row="{esc(row)}"><title>{_tip(lines)}</title>'
                     f'<rect x="{x_of(start):.1f}" y="{row_y[row]:.1f}" '
                     f'width="{x_of(end) - x_of(start):.2f}" height="{ROW_H}" '
                     'fill="transparent"/></g>')
    for d in rv.divergences[:3]:
        label = f"block {d.block}: {d.reason}"
        parts.append(f'<text data-annotation="{esc(label)}" '
                     f'x="{x_of(d.block * rv.block_size) + 3:.1f}" y="{TOP - 8}" '
                     f'fill="#1f2933">{esc(label)}</text>')
    parts.append(f'<line x1="{LABEL_W}" x2="{WIDTH - 12}" y1="{base}" y2="{base}" '
                 f'stroke="{AXIS_COLOUR}"/><text x="{LABEL_W + plot_w / 2:.1f}" '
                 f'y="{base + 36}" text-anchor="middle" fill="{AXIS_COLOUR}">'
                 f"token position (block size {rv.block_size})</text></svg>")
    head = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0 0.6rem">'
            f"{esc(title)}</div>" if title else "")
    return (f'<div class="mmlens-chart mmlens-layout" data-chart-title="{esc(title or "")}">'
            + head + "".join(parts) + legend_html(tuple(legend)) + "</div>")
