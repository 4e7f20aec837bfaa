"""What a router log's line order proves about when requests ran.

SMG stamps its log lines to the second, but writes them in the order things happened: a
request whose completion line comes before another request's dispatch line had finished
before that one was sent. Its engine stored all its blocks by then, so its window of KV
events ends at the other request's dispatch, when that is known exactly (SMG's cache
trace: nanoseconds), however long the whole seconds of its own lines leave it.

The engine stamps its KV events on its own clock, some offset from the router's, the
same for every request on it. A worker the router reaches on a loopback address runs on
the router's host: one clock. Elsewhere the clocks may be ``SLACK_S`` apart; but a
request's blocks are stored after its dispatch, so where a request stored a segment in
every assignment, the worker's clock can be ahead of the router's by less than that
segment's time after the dispatch. The closer bound closes the windows a dispatch ends.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from mmlens.analysis.judgement.attribution import SLACK_S, Served
from mmlens.records import RequestTrace

_LOOPBACK = re.compile(r"^(?:[a-z][a-z0-9+.-]*://)?(?:127(?:\.\d{1,3}){3}|localhost|\[::1\])"
                       r"(?::\d+)?(?:/|$)", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # a handful of units, asked of every request
def clocks_apart(unit: str) -> float:
    """How far the router's and a worker's clocks may be apart: none on the router's own
    host (the router's name for the worker is a loopback URL)."""
    return 0.0 if _LOOPBACK.match(unit.split("#", 1)[0]) else SLACK_S


def exact_dispatch(t: RequestTrace) -> float | None:
    """When the router sent the serving attempt (its cache trace's time; the last one:
    a retry's), or None when no source told it to better than the second."""
    exact = [p.ts for p in t.predictions if p.ts is not None and p.source.endswith("cache_trace")]
    return max(exact) if exact else None


def ended_by_order(context: Sequence[RequestTrace]) -> dict[str, float]:
    """Per request with a completion line, the earliest exact dispatch of a request whose
    dispatch line comes after it in the same router's log: it had ended by then."""
    sent: dict[str, list[tuple[int, float]]] = {}
    for t in context:
        at = exact_dispatch(t) if t.sent_seq is not None else None
        if at is not None:
            sent.setdefault(t.router, []).append((t.sent_seq, at))  # type: ignore[arg-type]
    later: dict[str, tuple[list[int], list[float]]] = {}
    for router, rows in sent.items():
        rows.sort()
        soonest = [r[1] for r in rows]
        for i in range(len(soonest) - 2, -1, -1):
            soonest[i] = min(soonest[i], soonest[i + 1])
        later[router] = ([r[0] for r in rows], soonest)
    out: dict[str, float] = {}
    for t in context:
        if t.ended_seq is None or t.router not in later:
            continue
        seqs, soonest = later[t.router]
        i = bisect.bisect_right(seqs, t.ended_seq)
        if i < len(seqs):
            out[t.request_id] = soonest[i]
    return out


def ahead_by_less_than(latest: Mapping[str, float], exact: Mapping[str, float],
                       ) -> float | None:
    """How far the worker's clock can be ahead of the router's at most (exclusive): each
    request that stored a segment (``latest``: the latest it may own) stored it after its
    exact dispatch."""
    return min((ts - exact[rid] for rid, ts in latest.items() if rid in exact), default=None)


def closed(served: Sequence[Served], ended: Mapping[str, float], ahead: float,
           ) -> list[Served]:
    """``served`` with the windows a later dispatch ends closed before it plus ``ahead``
    (the latest time the worker's clock can show for the dispatch)."""
    return [replace(r, stored_by=math.nextafter(ended[r.request_id] + ahead, -math.inf))
            if r.request_id in ended else r for r in served]
