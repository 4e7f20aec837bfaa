"""Which request stored each block a worker announced, and which image it holds: labels for the
prefix tree.

A ``BlockStored`` event names no request. mmlens knows when each traced request was served
and by which worker: an event of that worker during the request's service was stored for it
(when exactly one request was in service there). The request's expected layout then says
which of its blocks hold image tokens, and which image: an event that continues a cached
prefix starts at the request's first uncached block.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mmlens.analysis.request_view import short_id
from mmlens.records import BlockHash, KVEventRow, RequestTrace

SLACK_S = 1.0  # events reach the store a little after the response


@dataclass(frozen=True, slots=True)
class BlockLabel:
    text: str  # what the tree shows on the block
    hover: str
    image: bool


def _service(t: RequestTrace) -> tuple[float, float] | None:
    if t.ts is None or not t.worker or t.error:
        return None
    return t.ts, t.ts + (t.latency_s or 0.0) + SLACK_S


class Serving:
    """Who each worker was serving when: ``owner`` of an event looks at the requests that
    began within the longest service before it, not at every trace (the Affinity page asked
    that of 200 events against 1,000 traces: 200,000 spans, ~50 ms a run)."""

    def __init__(self, traces: Sequence[RequestTrace]) -> None:
        spans: dict[str, list[tuple[float, float, int, RequestTrace]]] = {}
        for i, t in enumerate(traces):
            span = _service(t)
            if span and t.worker:
                spans.setdefault(t.worker, []).append((span[0], span[1], i, t))
        for rows in spans.values():
            rows.sort(key=lambda r: (r[0], r[2]))
        self._spans = spans
        self._starts = {w: [r[0] for r in rows] for w, rows in spans.items()}
        self._longest = {w: max(r[1] - r[0] for r in rows) for w, rows in spans.items()}

    def owner(self, ev: KVEventRow) -> RequestTrace | None:
        """The request ``ev`` was stored for: the one request its worker was serving then."""
        rows = self._spans.get(ev.worker)
        if not rows:
            return None
        starts = self._starts[ev.worker]
        lo = bisect.bisect_left(starts, ev.ts - self._longest[ev.worker])
        hi = bisect.bisect_right(starts, ev.ts)
        serving = [r for r in rows[lo:hi] if r[1] >= ev.ts]
        return serving[0][3] if len(serving) == 1 else None


def owner(ev: KVEventRow, traces: Sequence[RequestTrace]) -> RequestTrace | None:
    """The request ``ev`` was stored for: the one request its worker was serving then."""
    return Serving(traces).owner(ev)


def image_blocks(t: RequestTrace) -> dict[int, int]:
    """Block index → the index of the image whose tokens it holds (the first, if several)."""
    lay = t.expected_layout
    if lay is None or not lay.spans:
        return {}
    bs = lay.block_size or 16
    out: dict[int, int] = {}
    for s in lay.spans:
        if s.kind != "image" or s.image_index is None:
            continue
        for b in range(s.start // bs, (s.start + s.length - 1) // bs + 1):
            out.setdefault(b, s.image_index)
    return out


def image_name(t: RequestTrace, index: int) -> str:
    im = t.images[index] if index < len(t.images) else None
    size = f" {im.width}x{im.height}" if im and im.width and im.height else ""
    return f"image {index + 1}{size}"


def block_labels(events: Iterable[KVEventRow], traces: Sequence[RequestTrace],
                 ) -> dict[tuple[str, BlockHash], BlockLabel]:
    """A label per (worker, block hash) of the stored events: the first block of what a
    request stored carries its id, the first block of each image run the image's name and
    size; every block says in its hover whose it is and what it holds."""
    out: dict[tuple[str, BlockHash], BlockLabel] = {}
    serving = Serving(traces)
    for ev in events:
        if ev.kind != "stored" or not ev.block_hashes:
            continue
        t = serving.owner(ev)
        if t is None:
            continue
        bs = (t.expected_layout.block_size if t.expected_layout else None) or 16
        first = (t.cached_tokens or 0) // bs if ev.parent is not None else 0
        images = image_blocks(t)
        before = images.get(first - 1)
        for j, h in enumerate(ev.block_hashes):
            index = images.get(first + j)
            what = image_name(t, index) if index is not None else "text"
            hover = f"block {first + j} of {t.request_id}: {what}"
            starts = index is not None and index != before
            if j == 0:
                text = "req " + short_id(t.request_id.removeprefix("mmlens-"), 6)
                text += " · " + what.replace("image ", "img ") if starts else ""
            elif starts:
                text = what.replace("image ", "img ")
            else:
                text = ""
            before = index
            out[(ev.worker, h)] = BlockLabel(text, hover, index is not None)
    return out
