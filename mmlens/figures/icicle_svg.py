"""An icicle (a tree as nested bands) drawn as inline SVG, from the same nodes as a Plotly
icicle trace: the roots in the first column, each node's children beside it, each band as
tall as the leaves under it. No zoom (Plotly's chart does that, one toggle away); each band's
details are in its native tooltip and its id a data attribute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.figures.svg import FONT, WIDTH, esc
from mmlens.figures.svg_lines import tip

CHAR_PX = 6.6  # mean width of a 12 px Source Sans character, to cut labels to their band
MIN_LABEL_PX = 15  # bands thinner than this carry no label (the tooltip names them)


def leaf_counts(ids: Sequence[str], parents: Sequence[str]) -> dict[str, int]:
    """Leaves under each node (a leaf counts itself), as Plotly sizes a tree without values."""
    children: dict[str, list[str]] = {}
    for node, parent in zip(ids, parents, strict=True):
        children.setdefault(parent, []).append(node)
    counts: dict[str, int] = {}
    for node in reversed(_ordered(ids, parents)):
        kids = children.get(node, [])
        counts[node] = sum(counts[k] for k in kids) if kids else 1
    return counts


def _ordered(ids: Sequence[str], parents: Sequence[str]) -> list[str]:
    """Nodes, every parent before its children (the roots first)."""
    children: dict[str, list[str]] = {}
    known = set(ids)
    for node, parent in zip(ids, parents, strict=True):
        children.setdefault(parent if parent in known else "", []).append(node)
    out: list[str] = []
    stack = list(reversed(children.get("", [])))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(children.get(node, [])))
    return out


def icicle_html(trace: Mapping[str, Any], title: str, height: int = 460,
                levels: int = 7) -> str:
    """``trace``: a Plotly icicle's ids, parents, text, hovertext, marker colors and
    textfont colors; drawn ``levels`` columns deep as one line of HTML."""
    ids, parents = list(trace["ids"]), list(trace["parents"])
    text = dict(zip(ids, trace.get("text") or [""] * len(ids), strict=True))
    hover = dict(zip(ids, trace.get("hovertext") or [""] * len(ids), strict=True))
    colour = dict(zip(ids, trace.get("marker", {}).get("colors") or ["#d9e2ec"] * len(ids),
                      strict=True))
    ink = trace.get("textfont", {}).get("color")
    ink_of = dict(zip(ids, ink, strict=True)) if isinstance(ink, list) else {}
    counts = leaf_counts(ids, parents)
    known = set(ids)
    parent_of = {n: (p if p in known else "") for n, p in zip(ids, parents, strict=True)}
    order = _ordered(ids, parents)
    depth_of: dict[str, int] = {}
    for node in order:
        up = parent_of[node]
        depth_of[node] = depth_of[up] + 1 if up else 0
    columns = max(1, min(levels, max(depth_of.values(), default=0) + 1))
    col_w = WIDTH / columns
    total = sum(counts[n] for n in order if not parent_of[n]) or 1
    # each node's band starts where its parent's does, below its earlier siblings
    top: dict[str, float] = {}
    next_top: dict[str, float] = {"": 0.0}
    for node in order:
        up = parent_of[node]
        top[node] = next_top.get(up, top.get(up, 0.0))
        next_top[up] = top[node] + counts[node] / total * height
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
             f'width="100%" role="img" aria-label="{esc(title)}" {FONT} font-size="12">']
    for node in order:
        if depth_of[node] >= columns:
            continue
        h = counts[node] / total * height
        x = depth_of[node] * col_w
        y = top[node]
        parts.append(f'<g data-id="{esc(node)}" data-parent="{esc(parent_of[node])}" '
                     f'data-leaves="{counts[node]}">'
                     f"<title>{tip(hover[node].replace('<br>', chr(10)) or text[node])}"
                     f'</title><rect x="{x + 0.5:.1f}" y="{y + 0.5:.1f}" '
                     f'width="{col_w - 1:.1f}" height="{max(0.5, h - 1):.1f}" '
                     f'fill="{esc(colour[node])}"/>')
        label = text[node]
        if label and h >= MIN_LABEL_PX:
            room = max(1, int((col_w - 8) / CHAR_PX))
            cut = label if len(label) <= room else label[:room - 1] + "…"
            parts.append(f'<text x="{x + 4:.1f}" y="{y + min(h / 2, 14) + 4:.1f}" '
                         f'fill="{esc(ink_of.get(node, "#1f2933"))}">{esc(cut)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    head = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0.3rem 0.6rem">'
            f"{esc(title)}</div>")
    return f'<div class="mmlens-chart" data-chart-title="{esc(title)}">{head}' + "".join(
        parts) + "</div>"
