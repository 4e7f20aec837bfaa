"""The token-layout figure: aligned horizontal bars per view, the block grid, hashes on hover.

One bar trace per span kind (text, special, structural, anchor) and one per image
identity, so the legend reads as a key and each image keeps its colour in every view. Block
boundaries are vertical lines; the first divergent block is shaded; an invisible marker per
block carries its hash and image keys for hover.
"""

from __future__ import annotations

from typing import Any

from mmlens.analysis.request_view import RequestView
from mmlens.figures.plain import PlainFigure
from mmlens.layout.composition import SpanKind

KIND_COLORS = {
    SpanKind.TEXT: "#9aa5b1",
    SpanKind.SPECIAL: "#52606d",
    SpanKind.STRUCTURAL: "#f0b429",
    SpanKind.ANCHOR: "#e12d39",
}
IMAGE_COLORS = ("#2680c2", "#3ebd93", "#8719e0", "#f35627", "#0f609b", "#c65d21",
                "#27ab83", "#a368fc")
CACHED_COLOR = "#199473"
COMPUTED_COLOR = "#d9e2ec"
MARK_COLOR = "#e12d39"  # the router's predicted hit and divergent blocks
MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}  # every dashboard figure's margins
LEGEND_GAP_PX = 58  # below the plot: tick labels and the x axis title
# Room below the plot for the gap and a legend wrapped to three rows (800 px): a margin that
# fits it is not grown by Plotly, so the gap, a share of the plot height, stays in pixels.
LEGEND_MARGIN_PX = LEGEND_GAP_PX + 3 * 26
MAX_GRID_LINES = 160
MAX_HOVER_BLOCKS = 2000


def image_color(index: int) -> str:
    return IMAGE_COLORS[index % len(IMAGE_COLORS)]


def _bar(name: str, x: list[Any], base: list[Any], y: list[Any], color: str,
         text: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "bar", "name": name, "x": x, "base": base, "y": y, "orientation": "h",
            "marker": {"color": color, "line": {"width": 0}}, "hovertext": text,
            "hoverinfo": "text", **extra}


def engine_row_name(rv: RequestView) -> str | None:
    """The engine's row (its prompt and cached tokens), when the engine reported a count."""
    if rv.counts.get("engine_prompt_tokens") is None:
        return None
    return f"engine ({rv.counts['engine_prompt_tokens']}, cached {rv.cached_tokens or 0})"


def span_groups(rv: RequestView) -> dict[str, dict[str, list[Any]]]:
    """The spans of every row grouped by kind or image identity (a legend entry each): their
    lengths (x), starts (base), rows (y) and tooltips (text)."""
    groups: dict[str, dict[str, list[Any]]] = {}
    for row in rv.rows:
        for s in row.spans:
            if s.kind is SpanKind.IMAGE and s.image_index is not None:
                key = (rv.image_labels[s.image_index] if s.image_index < len(rv.image_labels)
                       else f"image {s.image_index}")
            else:
                key = s.kind.value
            g = groups.setdefault(key, {"x": [], "base": [], "y": [], "text": []})
            g["x"].append(s.length)
            g["base"].append(s.start)
            g["y"].append(row.name)
            g["text"].append(f"{key}: tokens {s.start}–{s.end - 1} ({s.length})")
    return groups


def group_color(key: str) -> str:
    if key.startswith("image"):
        return image_color(int(key.split()[1]))
    return KIND_COLORS.get(SpanKind(key), "#829ab1")


def layout_figure(rv: RequestView, title: str | None = None) -> PlainFigure:
    data: list[dict[str, Any]] = []
    rows = [r.name for r in rv.rows]
    engine_row = engine_row_name(rv)
    y_order = ([engine_row] if engine_row else []) + rows[::-1]

    for key, g in span_groups(rv).items():
        data.append(_bar(key, g["x"], g["base"], g["y"], group_color(key), g["text"],
                         legendgroup=key))

    if engine_row:
        prompt = int(rv.counts["engine_prompt_tokens"] or 0)
        cached = min(int(rv.cached_tokens or 0), prompt)
        data.append(_bar("cached (engine)", [cached], [0], [engine_row], CACHED_COLOR,
                         [f"cached tokens 0–{cached}"]))
        data.append(_bar("computed (engine)", [prompt - cached], [cached], [engine_row],
                         COMPUTED_COLOR, [f"computed tokens {cached}–{prompt}"]))
        if rv.predicted_tokens is not None:
            data.append({
                "type": "scatter", "name": "router predicted", "x": [rv.predicted_tokens],
                "y": [engine_row], "mode": "markers",
                "marker": {"symbol": "line-ns-open", "size": 26, "color": MARK_COLOR,
                           "line": {"width": 3}},
                "hovertext": [f"router predicted {rv.predicted_tokens} cached tokens"],
                "hoverinfo": "text"})

    data += _block_hover(rv)
    shapes, annotations = _block_grid(rv), []
    for d in rv.divergences[:3]:
        x0 = d.block * rv.block_size
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x0,
                       "x1": x0 + rv.block_size, "y0": 0, "y1": 1, "fillcolor": MARK_COLOR,
                       "opacity": 0.18, "line": {"width": 0}, "layer": "below"})
        # dark on white: the default grey is illegible over the image run
        annotations.append({"text": f"block {d.block}: {d.reason}", "xref": "x",
                            "yref": "paper", "x": x0, "y": 1, "xanchor": "left",
                            "yanchor": "top", "showarrow": False,
                            "font": {"color": "#1f2933", "size": 12},
                            "bgcolor": "rgba(255,255,255,0.9)"})
    longest = max([r.length for r in rv.rows] + [int(rv.counts.get("engine_prompt_tokens")
                                                     or 0)] + [1])
    plot_px = 90 + 55 * len(y_order)
    margin = {**MARGIN, "b": LEGEND_MARGIN_PX}
    return PlainFigure({"data": data, "layout": {
        "barmode": "overlay", "title": {"text": title} if title else {},
        "height": plot_px + margin["t"] + margin["b"],
        "xaxis": {"title": {"text": f"token position (block size {rv.block_size})"},
                  "range": [0, longest * 1.01]},
        "yaxis": {"categoryorder": "array", "categoryarray": y_order},
        # The legend's top a fixed distance below the axis title, whatever the rows: a share
        # of the plot height put it over the title on short charts.
        "legend": {"orientation": "h", "yanchor": "top", "x": 0,
                   "y": -LEGEND_GAP_PX / plot_px},
        "margin": margin, "hovermode": "closest", "shapes": shapes,
        "annotations": annotations}})


def block_tips(rv: RequestView) -> list[tuple[str, int, int, list[str]]]:
    """Every block of every row (up to ``MAX_HOVER_BLOCKS`` a row): its row, first and end
    token, and its tooltip's lines (tokens, full or partial, hash, content key, images)."""
    bs = rv.block_size
    tips = []
    for row in rv.rows:
        n_blocks = -(-row.length // bs)
        for b in range(min(n_blocks, MAX_HOVER_BLOCKS)):
            start, end = b * bs, min((b + 1) * bs, row.length)
            full = end - start == bs
            first = f"{row.name.split(' (')[0]} block {b}: tokens {start}–{end - 1}"
            lines = [first + (" (full)" if full else
                              f" (partial, {end - start}/{bs}: never cached)")]
            if b < len(row.block_hashes):
                lines.append(f"hash {row.block_hashes[b]:016x}")
            if b < len(row.block_keys):
                lines.append(f"content key {row.block_keys[b]} (engine view)")
            if b < len(row.block_images) and row.block_images[b]:
                lines.append("extra_keys " + ", ".join(row.block_images[b]))
            tips.append((row.name, start, end, lines))
    return tips


def _block_hover(rv: RequestView) -> list[dict[str, Any]]:
    tips = block_tips(rv)
    if not tips:
        return []
    return [{"type": "scatter", "name": "blocks",
             "x": [start + (end - start) / 2 for _, start, end, _ in tips],
             "y": [row for row, _, _, _ in tips], "mode": "markers",
             "marker": {"size": 14, "opacity": 0.0},
             "hovertext": ["<br>".join(lines) for *_, lines in tips], "hoverinfo": "text",
             "showlegend": False}]


def grid_blocks(rv: RequestView) -> range:
    """The blocks whose left edge gets a grid line (every few past ``MAX_GRID_LINES``)."""
    n = max([r.length for r in rv.rows] + [0]) // rv.block_size
    step = max(1, -(-n // MAX_GRID_LINES))
    return range(step, n + 1, step)


def _block_grid(rv: RequestView) -> list[dict[str, Any]]:
    bs = rv.block_size
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": b * bs, "x1": b * bs,
             "y0": 0, "y1": 1, "line": {"color": "rgba(31,41,51,0.35)", "width": 1}}
            for b in grid_blocks(rv)]
