"""Affinity page figure: image identity → worker Sankey, drawn as inline SVG.

A Sankey here is read (which worker each image went to, how many requests), not explored, and
it was the Affinity page's only Plotly chart: a tab that opened the page first evaluated
Plotly's 4.7 MB chunk for it (the page's first click 2.55 s against 0.61 s after, demo at load
6.6). Each band's tooltip names its image, worker and requests; every band carries them as
data attributes, so tests read what is drawn."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from mmlens.analysis.request_view import short_id
from mmlens.figures.svg import FONT, WIDTH, esc
from mmlens.figures.token_layout import IMAGE_COLORS

TITLE = "Image identity → worker (requests)"
NODE_W = 14  # px, as Plotly's node thickness was
PAD = 12  # px between two nodes of a column
LABEL_W = 220  # room for the labels beside each column
WORKER_COLOUR = "#52606d"
TEXT_COLOUR = "#1f2933"


def height_of(n_images: int) -> int:
    return max(300, 24 * n_images + 80)


def affinity_sankey(links: Sequence[tuple[str, str, int]],
                    sizes: Mapping[str, str] | None = None,
                    worker_names: Mapping[str, str] | None = None) -> str:
    """``links``: (image identity, worker, requests), images in the order to draw them; one
    line of HTML, every value escaped, for ``mmlens.figures.inserted``."""
    sizes, names = sizes or {}, worker_names or {}
    images = list(dict.fromkeys(i for i, _, _ in links))
    workers = sorted({w for _, w, _ in links})
    out_of: Counter[str] = Counter()
    into: Counter[str] = Counter()
    for image, worker, n in links:
        out_of[image] += n
        into[worker] += n
    h = height_of(len(images))
    top, plot_h = 8, h - 16
    total = max(1, sum(out_of.values()))
    # one scale for both columns, so a band is as thick at its image as at its worker
    scale = min((plot_h - PAD * (len(col) - 1)) / total for col in (images, workers))
    scale = max(scale, 0.5)

    def stack(keys: list[str], sizes_of: Mapping[str, int]) -> dict[str, float]:
        used = sum(sizes_of[k] * scale for k in keys) + PAD * (len(keys) - 1)
        y, at = top + max(0.0, (plot_h - used) / 2), {}
        for k in keys:
            at[k] = y
            y += sizes_of[k] * scale + PAD
        return at

    left_y, right_y = stack(images, out_of), stack(workers, into)
    x0, x1 = LABEL_W, WIDTH - LABEL_W
    colour = {i: IMAGE_COLORS[n % len(IMAGE_COLORS)] for n, i in enumerate(images)}
    label = {i: f"{short_id(i)} {sizes.get(i, '')}".strip() for i in images}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" '
             f'width="100%" role="img" aria-label="{esc(TITLE)}" {FONT} font-size="12">']
    left_used = dict.fromkeys(images, 0.0)
    right_used = dict.fromkeys(workers, 0.0)
    for image, worker, n in links:
        band = n * scale
        ya = left_y[image] + left_used[image]
        yb = right_y[worker] + right_used[worker]
        left_used[image] += band
        right_used[worker] += band
        a, b = x0 + NODE_W, x1
        mid = (a + b) / 2
        shown = names.get(worker, worker)
        parts.append(
            f'<g data-source="{esc(label[image])}" data-target="{esc(shown)}" '
            f'data-value="{n}"><title>image {esc(short_id(image))} → {esc(shown)}: {n} '
            f'request(s)</title><path d="M{a:.1f},{ya:.1f} C{mid:.1f},{ya:.1f} {mid:.1f},'
            f'{yb:.1f} {b:.1f},{yb:.1f} L{b:.1f},{yb + band:.1f} C{mid:.1f},{yb + band:.1f} '
            f'{mid:.1f},{ya + band:.1f} {a:.1f},{ya + band:.1f} Z" fill="{colour[image]}" '
            'fill-opacity="0.35"/></g>')
    for image in images:
        y, hh = left_y[image], out_of[image] * scale
        parts.append(f'<g data-node="{esc(label[image])}"><title>{esc(label[image])}: '
                     f'{out_of[image]} request(s)</title><rect x="{x0}" y="{y:.1f}" '
                     f'width="{NODE_W}" height="{hh:.1f}" fill="{colour[image]}"/>'
                     f'<text x="{x0 - 6}" y="{y + hh / 2 + 4:.1f}" text-anchor="end" '
                     f'fill="{TEXT_COLOUR}">{esc(label[image])}</text></g>')
    for worker in workers:
        y, hh = right_y[worker], into[worker] * scale
        shown = names.get(worker, worker)
        parts.append(f'<g data-node="{esc(shown)}"><title>{esc(shown)}: {into[worker]} '
                     f'request(s)</title><rect x="{x1}" y="{y:.1f}" width="{NODE_W}" '
                     f'height="{hh:.1f}" fill="{WORKER_COLOUR}"/><text x="{x1 + NODE_W + 6}" '
                     f'y="{y + hh / 2 + 4:.1f}" fill="{TEXT_COLOUR}">{esc(shown)}</text></g>')
    parts.append("</svg>")
    title = (f'<div style="font-size:1.05rem;color:#31333f;margin:0.5rem 0 0 0.6rem">'
             f"{esc(TITLE)}</div>")
    return (f'<div class="mmlens-chart mmlens-sankey" data-chart-title="{esc(TITLE)}">{title}'
            + "".join(parts) + "</div>")
