"""Which stored KV chain belongs to which request, when several ran on a worker at once.

An engine announces the blocks a request computed once its prefill is done: one stored
segment whose parent is the last block it found cached (none: it found nothing). So the
depth of that parent is the request's realized hit, and parent depth plus the segment's
blocks is the request's full prompt blocks. Each worker's segments are matched to the
requests it served by time (stored between dispatch and end) and length (base + blocks =
``prompt_tokens // block_size``): a segment only one request can own goes to it, which may
leave another request a single candidate, and so on. A request with no segment at all found
its whole prompt cached (all but the last token, recomputed), when the worker's events are
known to cover its time. Requests of the same length at once that the evidence cannot tell
apart get both readings (``Realized.alternatives``) and the reason.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from mmlens.analysis.judgement.evidence import Realized
from mmlens.ingest.observed import SOURCE_KV

SLACK_S = 0.3  # events reach the store stamped up to this long after the engine's work


@dataclass(slots=True)
class Segment:
    """One stored-blocks event: when, how deep its parent sits (None: the parent was stored
    before the index saw it), how many blocks, its parent and last block."""

    ts: float
    base: int | None
    blocks: int
    parent: str | None = None
    last: str = ""


@dataclass(frozen=True, slots=True)
class Served:
    """A request a worker served: dispatch to end, prompt length, the engine's own count
    when a source told it (it then only claims a segment that agrees)."""

    request_id: str
    start: float
    end: float
    prompt_tokens: int | None
    block_size: int
    known_blocks: int | None = None


@dataclass
class WorkerChains:
    """One worker's stored blocks: each block's depth in its chain, and recent segments."""

    depth: dict[str, int] = field(default_factory=dict)
    segment_of: dict[str, Segment] = field(default_factory=dict)  # block → its segment
    segments: list[Segment] = field(default_factory=list)  # by ts
    last_ts: float = 0.0  # the newest event seen: the stream covers times before it

    def stored(self, ts: float, parent: str | None, hashes: Sequence[str]) -> None:
        if not hashes:
            return
        base = 0 if parent is None else self.depth.get(parent)
        seg = Segment(ts, base, len(hashes), parent, hashes[-1])
        if base is not None:
            for i, h in enumerate(hashes, start=base + 1):
                self.depth[h] = i
        for h in hashes:
            self.segment_of[h] = seg
        if not self.segments or ts >= self.segments[-1].ts:
            self.segments.append(seg)
        else:  # a late row
            bisect.insort(self.segments, seg, key=lambda s: s.ts)
        self.last_ts = max(self.last_ts, ts)

    def removed(self, ts: float, hashes: Sequence[str]) -> None:
        for h in hashes:
            self.depth.pop(h, None)
            self.segment_of.pop(h, None)
        self.last_ts = max(self.last_ts, ts)

    def cleared(self, ts: float) -> None:
        self.depth.clear()
        self.segment_of.clear()
        self.last_ts = max(self.last_ts, ts)

    def window(self, since: float, until: float) -> list[Segment]:
        lo = bisect.bisect_left(self.segments, since, key=lambda s: s.ts)
        hi = bisect.bisect_right(self.segments, until, key=lambda s: s.ts)
        return self.segments[lo:hi]

    def prune(self, before: float, max_blocks: int = 1_000_000) -> None:
        cut = bisect.bisect_left(self.segments, before, key=lambda s: s.ts)
        del self.segments[:cut]
        if len(self.depth) > max_blocks:  # oldest first (insertion order)
            for h in list(self.depth)[:len(self.depth) - max_blocks]:
                del self.depth[h]
                self.segment_of.pop(h, None)


def _full(r: Served) -> tuple[int, int] | None:
    """Full prompt blocks and the most the engine can hit (the last token is recomputed)."""
    if r.prompt_tokens is None or r.block_size <= 0:
        return None
    return r.prompt_tokens // r.block_size, max(0, (r.prompt_tokens - 1) // r.block_size)


def _fits(seg: Segment, r: Served, full: int, max_hit: int) -> bool:
    if seg.base is None:
        return seg.blocks <= full
    if seg.base + seg.blocks != full or seg.base > max_hit:
        return False
    return r.known_blocks is None or abs(r.known_blocks - seg.base) <= 1


def _hit(seg: Segment, full: int) -> int:
    return full - seg.blocks if seg.base is None else seg.base


def _decodes(segs: list[Segment], served: Sequence[Served], fits: dict[str, list[int]],
             slack_s: float) -> dict[int, str]:
    """Segments that are a request's decode: hung off the last block of a segment that may
    be its prefill (or of its decode before), stored while it ran, at its prompt's depth."""
    out: dict[int, str] = {}
    for r in served:
        f = _full(r)
        if f is None or not fits.get(r.request_id):
            continue
        tips = {segs[i].last for i in fits[r.request_id]}
        lo = bisect.bisect_left(segs, segs[min(fits[r.request_id])].ts, key=lambda s: s.ts)
        hi = bisect.bisect_right(segs, r.end + slack_s, key=lambda s: s.ts)
        for i in range(lo, hi):
            s = segs[i]
            if s.parent in tips and s.base is not None and s.base >= f[0] and i not in \
                    fits[r.request_id]:
                out.setdefault(i, r.request_id)
                tips.add(s.last)
    return out


def candidates(chains: WorkerChains, served: Sequence[Served], slack_s: float = SLACK_S,
               ) -> dict[str, list[int]]:
    """Per request, the indexes (into ``chains.segments``) of the segments it may own as
    its prefill (not another request's decode)."""
    fits: dict[str, list[int]] = {}
    segs = chains.segments
    for r in served:
        f = _full(r)
        if f is None:
            continue
        lo = bisect.bisect_left(segs, r.start - slack_s, key=lambda s: s.ts)
        hi = bisect.bisect_right(segs, r.end + slack_s, key=lambda s: s.ts)
        fits[r.request_id] = [i for i in range(lo, hi) if _fits(segs[i], r, *f)]
    decode = _decodes(segs, served, fits, slack_s)
    return {rid: [i for i in idx if decode.get(i, rid) == rid] for rid, idx in fits.items()}


def _computed_alongside(chains: WorkerChains, seg: Segment, since: float, max_hit: int,
                        ) -> set[int]:
    """Where its chain would start had it found none of the blocks below ``seg`` that other
    segments stored since ``since`` (while it ran)."""
    out: set[int] = set()
    parent = seg.parent
    while parent is not None and (below := chains.segment_of.get(parent)) is not None \
            and below is not seg and below.ts >= since and below.base is not None:
        out.add(min(below.base, max_hit))
        parent = below.parent
    return out


def attribute(chains: WorkerChains, served: Sequence[Served], worker: str,
              slack_s: float = SLACK_S) -> dict[str, Realized]:
    """The realized hit of each request in ``served`` (one worker's) that its KV events
    show; a request they say nothing definite about is left out."""
    cands = candidates(chains, served, slack_s)
    owners: dict[int, set[str]] = {}
    for rid, idx in cands.items():
        for i in idx:
            owners.setdefault(i, set()).add(rid)
    owned: dict[str, int] = {}
    rivals: set[str] = set()
    taken: set[int] = set()
    changed = True
    while changed:  # a segment only one request can own is its; that frees others
        changed = False
        for i, rids in owners.items():
            if i in taken:
                continue
            left = [r for r in rids if r not in owned]
            if len(left) == 1:
                owned[left[0]] = i
                taken.add(i)
                changed = True
        for rid, idx in cands.items():
            if rid in owned:
                continue
            free = [i for i in idx if i not in taken]
            if len(free) == 1 and all(r in owned or r == rid for r in owners[free[0]]):
                owned[rid] = free[0]
                taken.add(free[0])
                changed = True
    segs = chains.segments
    out: dict[str, Realized] = {}
    for r in served:
        rid, f = r.request_id, _full(r)
        if f is None:
            continue
        full, max_hit = f
        if full == 0:
            out[rid] = Realized(0, None, SOURCE_KV)
            continue
        lo = bisect.bisect_left(segs, r.start - slack_s, key=lambda s: s.ts)
        hi = bisect.bisect_right(segs, r.end + slack_s, key=lambda s: s.ts)
        free: list[int] = []
        if rid in owned:
            mine = segs[owned[rid]]
            readings = {_hit(mine, full)}
        else:
            free = [i for i in cands.get(rid, []) if i not in taken]
            rivals = {o for i in free for o in owners[i] if o != rid and o not in owned}
            shared = {i for o in (rid, *rivals) for i in cands.get(o, []) if i not in taken}
            readings = {_hit(segs[i], full) for i in free}
            if not free and chains.last_ts < r.end + slack_s:
                continue  # the worker's events may not have arrived yet
            if len(rivals) + 1 > len(shared):  # one of them stored nothing: its prompt hit
                readings.add(max_hit)
        if rid in owned or free:
            # Its chain's blocks above where it starts, stored by another request while it
            # ran: it may have computed them too (an engine stores a block once).
            for seg in [mine] if rid in owned else [segs[i] for i in free]:
                readings |= _computed_alongside(chains, seg, r.start - slack_s, max_hit)
        else:  # no chain of its own known: any chain as deep stored while it ran may be it
            readings |= {min(b, max_hit) for i in range(lo, hi)
                         if (b := segs[i].base) is not None and b < full <= b + segs[i].blocks}
        # Shown first: what a segment it may own says (the other readings are alternatives).
        own = {_hit(segs[i], full) for i in ([owned[rid]] if rid in owned else free)}
        best = max(own or readings)
        alt = tuple(sorted(readings - {best}, reverse=True))
        same = rid not in owned and rivals and len({_hit(segs[i], full) for i in free}) > 1
        out[rid] = Realized(best, None, SOURCE_KV, alt, None if not alt else (
            f"{len(rivals) + 1} requests of {full} blocks on {worker} at once" if same
            else f"another request on {worker} stored blocks of its prompt while it ran"))
    return out
