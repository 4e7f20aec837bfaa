"""Cache page figures: hit rate over time, predicted vs realized, KV-event timeline, resident
blocks, and the prefix tree of recent blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from mmlens.analysis.block_labels import BlockLabel
from mmlens.analysis.judgement.shown import category
from mmlens.analysis.request_view import predicted_tokens
from mmlens.figures.icicle_svg import icicle_html
from mmlens.figures.plain import PlainFigure
from mmlens.figures.svg import Bar, BarChart, time_slots
from mmlens.figures.svg_lines import LineChart, Series, clock
from mmlens.figures.token_layout import CACHED_COLOR, IMAGE_COLORS, MARGIN
from mmlens.figures.workers import faded, worker_colour
from mmlens.ingest.metrics_normalize import HitRate
from mmlens.records import BlockHash, KVEventRow, RequestTrace, Verdict

Point = tuple[float, float]
REMOVED_COLOR = "#eceff3"
TEXT_BLOCK_COLOR = "#9aa5b1"
MISS_COLOR = "#cf1124"


def hit_rate_figure(series: Mapping[str, Sequence[Point]], step: float | None = None,
                    ) -> LineChart:
    """One line per worker (named in the legend, even when alone); an interval without
    prefix-cache traffic breaks the line rather than joining its neighbours. Read, not
    explored: SVG (its Plotly chart cost the Cache page Plotly's code on a first visit)."""
    lines = tuple(Series(worker, tuple(points), worker_colour(worker), hovers=tuple(
        f"{clock(t)} UTC · {worker}: {v:.1%}" for t, v in points))
        for worker, points in sorted(series.items()))
    return LineChart("Engine prefix hit rate per worker (token-weighted, UTC)", lines,
                     percent=True, step=step)


UNEXPECTED_MISSES = ("false_hit", "count_drift", "fallback", "evicted")


def predicted_vs_realized_figure(traces: Sequence[RequestTrace],
                                 verdicts: Mapping[str, Verdict]) -> LineChart:
    """One point per request: router-predicted vs engine-cached tokens, a click on it opens
    the request in the inspector; misses the router did not expect (its stored verdict) are
    red, a series of their own. Each point's tooltip ends with its verdict."""
    points: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    hovers: dict[bool, list[str]] = {False: [], True: []}
    ids: dict[bool, list[str]] = {False: [], True: []}
    for t in traces:
        p = predicted_tokens(t)
        if p is None or t.error:
            continue
        verdict = category(verdicts.get(t.request_id))
        miss = verdict in UNEXPECTED_MISSES
        cached = t.cached_tokens or 0
        points[miss].append((float(p), float(cached)))
        ids[miss].append(t.request_id)
        hovers[miss].append(f"{t.request_id}\nworker {t.worker}\npredicted {p}, cached "
                            f"{cached} of {t.prompt_tokens}\n{verdict}")
    series = tuple(Series(name, tuple(points[miss]), colour, hovers=tuple(hovers[miss]),
                          ids=tuple(ids[miss]), links=tuple(inspector_link(r) for r in ids[miss]),
                          line=False)
                   for miss, name, colour in ((False, "requests", CACHED_COLOR),
                                              (True, "a miss the router did not expect",
                                               MISS_COLOR)) if points[miss])
    return LineChart("Predicted vs realized cached tokens per request (click a point: the "
                     "inspector)", series, height=360, time_axis=False,
                     x_title="router-predicted tokens", y_title="engine cached tokens",
                     diagonal=True)


def inspector_link(request_id: str) -> str:
    """The inspector's URL for a request, relative to a page's own."""
    return "inspector?" + urlencode({"request": request_id})


def kv_event_timeline_figure(rows: Sequence[tuple[float, str, str, int]]) -> BarChart:
    """``rows``: (bucket ts, worker, kind, blocks). Stored up, removed down, per worker,
    stacked per bucket; read, not explored: SVG bars (a Plotly chart here cost the Cache page
    a draw on every visit). Every worker has both entries in the legend, so no removals reads
    as none, not as missing."""
    series: dict[tuple[str, str], dict[float, int]] = {}
    for ts, worker, kind, blocks in rows:
        series.setdefault((worker, kind), {})[ts] = blocks
    slots, label_of = time_slots([r[0] for r in rows], 60.0)
    bars: list[Bar] = []
    legend: list[tuple[str, str]] = []
    for worker in sorted({w for w, _ in series}):
        for kind in ("stored", "removed"):
            points = series.get((worker, kind), {})
            name = f"{worker} {kind} ({sum(points.values())})"
            sign = -1 if kind == "removed" else 1
            colour = faded(worker_colour(worker)) if sign < 0 else worker_colour(worker)
            legend.append((name, colour))
            # A zero bar keeps a worker that removed nothing among the series, saying 0.
            for t in sorted(points) or [min(r[0] for r in rows)]:
                n = points.get(t, 0)
                bars.append(Bar(label_of[t], float(sign * n), colour=colour, series=name,
                                hover=f"{label_of[t]} UTC · {worker}: {n} block(s) {kind}"))
    return BarChart("KV events per worker: blocks stored (+) / removed (−)", tuple(bars),
                    height=320, stacked=True, signed=True, slots=slots, time_axis=True,
                    legend=tuple(legend))


RESIDENT_SERIES = (("resident blocks", "#2680c2"), ("…with image keys", "#8719e0"))


def resident_blocks_figure(bars: Sequence[tuple[str, float, float]]) -> BarChart:
    """``bars``: (worker, resident blocks, blocks with image keys), e.g.
    ``analysis.views.cache.resident_bars``; read, not explored: SVG bars side by side."""
    (resident, r_colour), (keyed, k_colour) = RESIDENT_SERIES
    drawn = []
    for worker, blocks, with_keys in bars:
        drawn += [Bar(worker, blocks, f"{blocks:,.0f}", f"{worker}: {blocks:,.0f} {resident}",
                      r_colour, resident),
                  Bar(worker, with_keys, f"{with_keys:,.0f}",
                      f"{worker}: {with_keys:,.0f} resident blocks with image keys", k_colour,
                      keyed)]
    return BarChart("Resident blocks per worker (from KV events)", tuple(drawn), height=320,
                    slots=tuple(b[0] for b in bars), legend=RESIDENT_SERIES)


# The icicle draws this many levels below the worker; deeper blocks of a chain are one node
# ("+N blocks") instead of one each: Plotly lays out (and the browser parses) every node,
# drawn or not, and a 64-block chain is 52 nodes nobody sees.
VISIBLE_DEPTH = 12
SHOWN_LEVELS = 7  # levels drawn at once (the worker and six blocks), each wide enough to read


def prefix_tree_figure(events: Sequence[KVEventRow],
                       labels: Mapping[tuple[str, BlockHash], BlockLabel] | None = None,
                       worker_names: Mapping[str, str] | None = None,
                       max_nodes: int = 400) -> PlainFigure:
    """An icicle of recent BlockStored chains: each block's parent is the previous block of
    its event (or the event's parent hash). ``labels`` (``analysis.block_labels``) name the
    request that stored a chain and the images its blocks hold; blocks removed since are
    drawn grey and say so. Blocks deeper than ``VISIBLE_DEPTH`` are counted on one node per
    chain."""
    labels = labels or {}
    removed = {(ev.worker, h) for ev in events if ev.kind == "removed" for h in ev.block_hashes}
    ids: list[str] = []
    parents: list[str] = []
    texts: list[str] = []
    hovers: list[str] = []
    colors: list[str] = []
    depth: dict[str, int] = {}
    tails: dict[str, tuple[int, int]] = {}  # tail node → (its index, blocks it holds)
    hidden: dict[str, str] = {}  # a block below the visible depth → its chain's tail node

    def add(node: str, parent: str, text: str, hover: str, color: str) -> None:
        ids.append(node)
        parents.append(parent)
        texts.append(text)
        hovers.append(hover)
        colors.append(color)

    for ev in sorted(events, key=lambda e: (e.ts, e.seq)):
        if ev.kind != "stored":
            continue
        root = f"worker {ev.worker}"
        if root not in depth:
            depth[root] = 0
            name = (worker_names or {}).get(ev.worker, ev.worker)
            add(root, "", f"worker {name}", f"worker {name} ({ev.worker})", "#d9e2ec")
        parent = f"{ev.worker}/{ev.parent}" if ev.parent is not None else root
        parent = hidden.get(parent, parent)
        if parent not in depth:
            parent = root  # parent stored before the window: hang the chain on the worker
        for h in ev.block_hashes:
            node = f"{ev.worker}/{h}"
            if node in depth or node in hidden:
                parent = hidden.get(node, node)
                continue
            if parent in tails or depth[parent] >= VISIBLE_DEPTH:
                tail = parent if parent in tails else f"{parent}/+"
                if tail not in tails:
                    depth[tail] = depth[parent] + 1
                    tails[tail] = (len(ids), 0)
                    add(tail, parent, "", "", TEXT_BLOCK_COLOR)
                at, n = tails[tail]
                tails[tail] = (at, n + 1)
                texts[at] = hovers[at] = f"+{n + 1} blocks"
                hidden[node] = parent = tail
                continue
            label = labels.get((ev.worker, h))
            gone = (ev.worker, h) in removed
            hexed = f"{h:016x}" if isinstance(h, int) else str(h)
            image = label.image if label else bool(ev.images)
            depth[node] = depth[parent] + 1
            add(node, parent, label.text if label else "",
                f"{hexed}<br>{label.hover if label else 'request unknown'}"
                + ("<br>removed since" if gone else ""),
                REMOVED_COLOR if gone else IMAGE_COLORS[2] if image else TEXT_BLOCK_COLOR)
            parent = node
            if len(ids) >= max_nodes:
                break
        if len(ids) >= max_nodes:
            break
    # A label that does not fit its tile at a readable size is hidden (its hover names it),
    # not shrunk to a few pixels.
    return PlainFigure({"data": [{
        "type": "icicle", "ids": ids, "parents": parents, "text": texts, "labels": texts,
        "hovertext": hovers, "marker": {"colors": colors}, "maxdepth": SHOWN_LEVELS,
        "textinfo": "text", "hovertemplate": "%{hovertext}<extra></extra>",
        "textfont": {"size": 13, "color": ["#ffffff" if c == IMAGE_COLORS[2] else "#1f2933"
                                           for c in colors]}}],
        "layout": {"title": {"text": "Prefix tree of recent blocks, by the request that "
                             "stored them (purple: image, grey: text, pale: removed since; "
                             "click to zoom)"},
                   "height": 460, "margin": MARGIN,
                   "uniformtext": {"minsize": 11, "mode": "hide"}}})


PREFIX_TREE_TITLE = ("Prefix tree of recent blocks, by the request that stored them (purple: "
                     "image, grey: text, pale: removed since)")


def prefix_tree_html(spec: Mapping[str, Any]) -> str:
    """``prefix_tree_figure``'s spec drawn as an SVG icicle, ``SHOWN_LEVELS`` deep: a tab
    that shows it loads no Plotly code; zooming into a chain is the Plotly chart's."""
    return icicle_html(spec["data"][0], PREFIX_TREE_TITLE, spec["layout"]["height"],
                       SHOWN_LEVELS)


MAX_WORKER_BARS = 40  # on a fleet: the lowest hit rates, the workers to look at


def worker_hit_rate_bars(hit_rates: Sequence[HitRate],
                         worker_names: Mapping[str, str] | None = None) -> BarChart:
    """Per worker: token-weighted hit rate over the window (cumulative when idle); on a
    fleet the ``MAX_WORKER_BARS`` lowest. Plain bars, drawn as SVG (``figures.svg``): the
    Overview shows no other chart, so a new tab of it never loads Plotly."""
    names = worker_names or {}
    rows = [h for h in hit_rates if h.hit_rate is not None]
    title = "Engine prefix hit rate per worker (last 5 min)"
    if len(rows) > MAX_WORKER_BARS:
        title = f"Engine prefix hit rate: the {MAX_WORKER_BARS} lowest of {len(rows)} workers " \
                "(last 5 min)"
        rows = sorted(rows, key=lambda h: (h.hit_rate or 0.0, h.worker))[:MAX_WORKER_BARS]
    bars = []
    for h in rows:
        label = names.get(h.worker, h.worker)
        bars.append(Bar(label, h.hit_rate or 0.0, f"{h.hit_rate:.0%}",
                        f"{label} ({h.worker}): {h.hit_rate:.0%}, {h.hits_increase:.0f} of "
                        f"{h.queries_increase:.0f} tokens in {h.window_s:.0f} s ({h.source})",
                        worker_colour(label)))
    return BarChart(title, tuple(bars), percent=True)
