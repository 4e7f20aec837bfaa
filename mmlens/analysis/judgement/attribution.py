"""Which stored KV chain belongs to which request, when several ran on a worker at once.

An engine announces the blocks a request computed once its prefill is done: one stored
segment whose parent is the last block it found cached (none: it found nothing). So the
depth of that parent is the request's realized hit, and parent depth plus the segment's
blocks is the request's full prompt blocks. A request may have stored a segment when it was
stored between its dispatch and its end and ends at its prompt's depth; every prompt segment
was stored by one such request, and a request stores one (``ownership``: the readings of
each request over every assignment that gives every segment an owner). Its decode stores
one block at a time off its prompt's last block: such a block may be a running request's
decode, so it owes no prompt an owner. A request that may have stored nothing found its
whole prompt cached (all but the last token, recomputed) when the worker's events are known
to cover its time, or, on an engine that stores a block once (SGLang's radix tree), computed
it while another request stored the same blocks. vLLM announces every block it computes
(``announces_all``): it caches a prompt's blocks when it allocates them, so a request
allocated later finds them, and a block computed again is stored again beside the first
(its block pool keeps duplicates): a request's own segment starts where its hit ends.
Readings the evidence cannot tell apart are all given (``Realized.alternatives``), with the
reason.
"""
from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from mmlens.analysis.judgement.evidence import Realized
from mmlens.analysis.judgement.ownership import Owners
from mmlens.ingest.observed import SOURCE_KV

SLACK_S = 0.05  # the router's and the engines' clocks apart (KV batches carry the engine's)
_NO_IMAGES: frozenset[str] = frozenset()


@dataclass(slots=True, eq=False)
class Segment:
    """One stored-blocks event: when, how deep its parent sits (None: the parent was stored
    before the index saw it), how many blocks, its parent and last block. Compared by
    identity: two events alike are two segments. ``images``: the identities of the images
    in its blocks and the blocks below it (its engine's extra keys). ``held_since``: where
    its first block was already stored when it came (a copy), when that copy came."""

    ts: float
    base: int | None
    blocks: int
    parent: str | None = None
    last: str = ""
    images: frozenset[str] = frozenset()
    held_since: float | None = None
    prompt_end: int | None = None  # one block: the tokens of it that end a prompt


# Not frozen: one is built per request judged, and a frozen one costs three times as much
# to build; nothing changes one once built (``replace`` copies).
@dataclass(slots=True)
class Served:
    """A request a worker served: dispatch to end, prompt length, the engine's own count
    when a source told it (it then only claims a segment that agrees), its images'
    identities when every image's is known (it then only claims a chain of those images).
    ``stored_by``: the latest its engine can have stored a block, on the engine's clock,
    where the router's line order bounds it (``order``); ``stored_from``: the earliest,
    where the engine shares the router's clock and the router timed the dispatch exactly
    (its engine looks its prompt up after the dispatch: a block stored before was there).
    ``one_more``: its length is a router's block count rounded up (Dynamo's), so its prompt
    may fill that last block: one full block more than ``prompt_tokens`` gives (the most it
    can hit stays the same). ``sizes``: its images' pixel sizes where the router logged
    every one (SMG logs sizes, no identities). ``exact``: ``prompt_tokens`` is the engine's
    prompt length to the token (not the shortest a block count allows). ``approx``: it is
    an approximate tree's count of units, whose full blocks need not be the engine's."""

    request_id: str
    start: float
    end: float
    prompt_tokens: int | None
    block_size: int
    known_blocks: int | None = None
    images: frozenset[str] | None = None
    stored_by: float | None = None
    stored_from: float | None = None
    one_more: bool = False
    sizes: tuple[tuple[int, int], ...] | None = None
    exact: bool = False
    approx: bool = False


@dataclass(slots=True)
class _ByTime:
    """Segments in time order, with their times beside them (bisect without a key)."""

    times: list[float] = field(default_factory=list)
    segs: list[Segment] = field(default_factory=list)

    def add(self, seg: Segment) -> None:
        if not self.times or seg.ts >= self.times[-1]:
            self.times.append(seg.ts)
            self.segs.append(seg)
        else:  # a late row
            at = bisect.bisect_right(self.times, seg.ts)
            self.times.insert(at, seg.ts)
            self.segs.insert(at, seg)

    def between(self, since: float, until: float) -> list[Segment]:
        return self.segs[bisect.bisect_left(self.times, since):
                         bisect.bisect_right(self.times, until)]

    def prune(self, before: float) -> None:
        cut = bisect.bisect_left(self.times, before)
        del self.times[:cut], self.segs[:cut]


def _add(index: _ByTime, seg: Segment) -> None:
    """``index.add``, the rows in time order (nearly all) without its method's call."""
    times = index.times
    if not times or seg.ts >= times[-1]:
        times.append(seg.ts)
        index.segs.append(seg)
    else:
        index.add(seg)


@dataclass
class WorkerChains:
    """One worker's stored blocks: each block's depth in its chain and segment, and recent
    segments by time, by the depth they end at, and by the block they hang off."""

    depth: dict[str, int] = field(default_factory=dict)
    segment_of: dict[str, Segment] = field(default_factory=dict)  # block → its segment
    all: _ByTime = field(default_factory=_ByTime)
    by_end: dict[int, _ByTime] = field(default_factory=dict)  # base + blocks → segments
    unrooted: _ByTime = field(default_factory=_ByTime)  # parent depth unknown
    ones: _ByTime = field(default_factory=_ByTime)  # one block: a decode's, maybe
    ones_at: dict[int | None, _ByTime] = field(default_factory=dict)  # those by base
    children: dict[str, _ByTime] = field(default_factory=dict)
    last_ts: float = 0.0  # the newest event seen: the stream covers times before it
    # Copies of a block beyond the first (vLLM stores a block computed again beside the one
    # it had and removes each copy on its own): the block stays until its last goes.
    copies: dict[str, int] = field(default_factory=dict)

    @property
    def segments(self) -> list[Segment]:
        return self.all.segs

    def stored(self, ts: float, parent: str | None, hashes: Sequence[str],
               images: Iterable[str] = (), prompt_end: int | None = None) -> None:
        if not hashes:
            return
        held, depth = self.segment_of, self.depth
        n = len(hashes)
        if parent is None:
            base, under = 0, _NO_IMAGES
        else:
            base = depth.get(parent)
            below = held.get(parent)
            under = _NO_IMAGES if below is None else below.images
        first = held.get(hashes[0])
        seg = Segment(ts, base, n, parent, hashes[-1],
                      frozenset(images) | under if images else under,
                      None if first is None else first.ts, prompt_end)
        copies = self.copies
        for h in hashes:
            if h in held:
                copies[h] = copies.get(h, 0) + 1
        # Rows come in time order (nearly all): appended in place, a late one inserted.
        if base is not None:
            i = base
            for h in hashes:
                i += 1
                held[h] = seg
                depth[h] = i
            end = self.by_end.get(i)
            if end is None:
                self.by_end[i] = _ByTime([ts], [seg])
            elif not end.times or ts >= end.times[-1]:
                end.times.append(ts)
                end.segs.append(seg)
            else:
                end.add(seg)
        else:
            for h in hashes:
                held[h] = seg
            self.unrooted.add(seg)
        if parent is not None:
            kids = self.children.get(parent)
            if kids is None:
                self.children[parent] = _ByTime([ts], [seg])
            elif not kids.times or ts >= kids.times[-1]:
                kids.times.append(ts)
                kids.segs.append(seg)
            else:
                kids.add(seg)
        _add(self.all, seg)
        if n == 1:
            _add(self.ones, seg)
            at = self.ones_at.get(base)
            if at is None:
                self.ones_at[base] = _ByTime([ts], [seg])
            else:
                _add(at, seg)
        if ts > self.last_ts:
            self.last_ts = ts

    def removed(self, ts: float, hashes: Sequence[str]) -> None:
        copies = self.copies
        for h in hashes:
            more = copies.pop(h, 0) if copies else 0
            if more > 1:
                copies[h] = more - 1
            elif not more:
                self.depth.pop(h, None)
                self.segment_of.pop(h, None)
        self.last_ts = max(self.last_ts, ts)

    def cleared(self, ts: float) -> None:
        self.depth.clear()
        self.segment_of.clear()
        self.copies.clear()
        self.last_ts = max(self.last_ts, ts)

    def window(self, since: float, until: float) -> list[Segment]:
        return self.all.between(since, until)

    def prune(self, before: float, max_blocks: int = 1_000_000) -> None:
        self.prune_segments(before)
        self.cap(max_blocks)

    def prune_segments(self, before: float) -> None:
        """Forget the segments stored before ``before`` (reads never reach back so far)."""
        self.all.prune(before)
        self.unrooted.prune(before)
        self.ones.prune(before)
        for at in self.ones_at.values():
            at.prune(before)
        self.ones_at = {b: at for b, at in self.ones_at.items() if at.segs}
        for end in self.by_end.values():
            end.prune(before)
        for kids in self.children.values():
            kids.prune(before)
        self.children = {p: kids for p, kids in self.children.items() if kids.segs}

    def cap(self, max_blocks: int = 1_000_000) -> None:
        """Keep the depths of the newest ``max_blocks`` blocks."""
        if len(self.depth) > max_blocks:  # oldest first (insertion order)
            for h in list(self.depth)[:len(self.depth) - max_blocks]:
                del self.depth[h]
                self.segment_of.pop(h, None)
                self.copies.pop(h, None)


def _full(r: Served) -> tuple[int, int] | None:
    """Full prompt blocks and the most the engine can hit (the last token is recomputed)."""
    if r.prompt_tokens is None or r.block_size <= 0:
        return None
    return r.prompt_tokens // r.block_size, max(0, (r.prompt_tokens - 1) // r.block_size)


def _ends(r: Served, full: int) -> tuple[int, ...]:
    """The depths its prompt's full blocks may end at."""
    return (full, full + 1) if r.one_more else (full,)


def _since(r: Served, slack_s: float) -> float:
    """The earliest a block of ``r`` can be stored (its engine starts after the dispatch;
    the slack covers the router's and the engines' clocks apart)."""
    early = r.start - slack_s
    return early if r.stored_from is None else max(early, r.stored_from)


def _until(r: Served, slack_s: float) -> float:
    """The latest a block of ``r`` can be stored."""
    late = r.end + slack_s
    return late if r.stored_by is None else min(late, r.stored_by)


_Bounds = tuple["tuple[int, int] | None", float, float]


def _bounds(served: Sequence[Served], slack_s: float) -> list[_Bounds]:
    """Per request its ``_full``, ``_since`` and ``_until``, read once for every step."""
    return [(_full(r), _since(r, slack_s), _until(r, slack_s)) for r in served]


def image_key(identity: str) -> str:
    """An image identity as both sides can compare it: its first 8 bytes (Dynamo logs that
    much of the hash its workers key blocks by; the engines' events carry all of it)."""
    return identity[:16].lower()


def same_images(seg: Segment, images: frozenset[str] | None) -> bool:
    """Whether ``seg``'s chain may be a prompt of ``images`` (keys; None: unknown, any)."""
    return images is None or all(image_key(a) in images for a in seg.images)


def runs_span(served: Sequence[Served], slack_s: float) -> tuple[float, float]:
    """From the earliest a block of ``served`` can be stored to the latest."""
    return min(r.start for r in served) - slack_s, max(_until(r, slack_s) for r in served)


def _blind_to(chains: WorkerChains, served: Sequence[Served], slack_s: float,
              known: frozenset[str] | None, span: tuple[float, float] | None = None,
              ) -> list[Served]:
    """``served`` with the images the worker's events name but no request's identity does
    (``known``: every identity told, by default those of ``served``; an image keyed by a
    hash mmlens does not know) added to every known set: such an image may be anyone's.
    The worker's events are read over ``span`` (default: ``served``'s, ``runs_span``)."""
    if known is None:
        known = frozenset(k for r in served if r.images for k in r.images)
    if not known or not any(r.images for r in served):
        return list(served)
    since, until = runs_span(served, slack_s) if span is None else span
    strange = frozenset(k for seg in chains.window(since, until) for a in seg.images
                        if (k := image_key(a)) not in known)
    return [r if r.images is None or not strange else replace(r, images=r.images | strange)
            for r in served]


def _fits(chains: WorkerChains, r: Served, full: int, max_hit: int, since: float,
          until: float, announces_all: bool = False) -> list[Segment]:
    """Segments stored while ``r`` ran that end at its prompt's depth (or hang off a block
    the index never saw and are no longer than its prompt). On an engine that caches a
    prompt's blocks at allocation (``announces_all``), not a copy of a block it could hit
    that was stored before it started: it found that block (a copy comes from a request
    that recomputed its prompt's last block, found whole). ``since``, ``until``: when its
    blocks can have been stored (``_since``, ``_until``)."""
    known = r.known_blocks
    out = []
    ends = _ends(r, full)
    for depth in ends:
        end = chains.by_end.get(depth)
        if end is None:
            continue
        for s in end.between(since, until):
            b = s.base
            if b is not None and b <= max_hit and (known is None or abs(known - b) <= 1) \
                    and not (announces_all and s.held_since is not None
                             and s.held_since < since and b < max_hit):
                out.append(s)
    if chains.unrooted.segs:
        out += [s for s in chains.unrooted.between(since, until) if s.blocks <= ends[-1]]
    return [s for s in out if same_images(s, r.images)] if r.images is not None else out


def _decodes(chains: WorkerChains, served: Sequence[Served], bounds: Sequence[_Bounds],
             fits: dict[str, list[Segment]]) -> dict[Segment, str]:
    """Segments that may be a request's decode: hung off the last block of a segment that
    may be its prefill (or of its decode before), stored while it ran, at its prompt's
    depth. Not only that: a longer prompt with those blocks first may have stored it."""
    out: dict[Segment, str] = {}
    children = chains.children
    for r, (f, _, until) in zip(served, bounds, strict=True):
        mine = fits.get(r.request_id)
        if not mine or f is None:
            continue
        rid, full = r.request_id, f[0]
        own = set(mine)
        since = min(s.ts for s in mine)
        tips = [s.last for s in mine]
        while tips:  # down the children stored in the window (the test inline: hot)
            kids = children.get(tips.pop())
            if kids is None:
                continue
            times = kids.times
            for child in kids.segs[bisect.bisect_left(times, since):
                                   bisect.bisect_right(times, until)]:
                b = child.base
                if b is not None and b >= full and child not in out and child not in own:
                    out[child] = rid
                    tips.append(child.last)
    return out


def decode_tips(chains: WorkerChains, served: Sequence[Served], slack_s: float,
                ) -> dict[str, frozenset[str]]:
    """Requests whose prompt's last full block the decode blocks narrow down. A one-block
    store whose tokens end a prompt (``Segment.prompt_end``: k tokens) hung off a block at
    depth d is the first decode block of a request of d full blocks that ran when it was
    stored (each request has one at most): one whose length is told to the token and is
    d blocks and k tokens, or one whose full blocks a router counted as d. Where no request
    whose full blocks nobody counted (its length unknown, an approximate tree's units, a
    count rounded up) could be its, the blocks at depth d and those requests pair off, in
    each group linked by who may own what: a block only one of them may own is that one's;
    where a group has as many blocks left as requests, each of those requests' first
    decode block is one of the blocks it may own (a request whose decode block is not among
    them makes no such count). Request → the blocks its prompt's last full block may be
    (one, or a few: its chain ends at one of them, which may settle its hit whichever it
    is).
    Read as a decode block is also a longer prompt's last full block with an earlier
    assistant turn's header in it and the rest of that conversation after it in the same
    block (very short turns); it names a request only if one of the length that header's
    place gives ran then (no such case in the live runs: their prompts are single turns)."""
    # depth → (request, its k: None where only its full blocks are known, its window)
    counted: dict[int, list[tuple[str, int | None, float, float]]] = {}
    # (its window, the depths it may end at: None for any)
    uncounted: list[tuple[float, float, tuple[int, ...] | None]] = []
    for r in served:
        since, until = _since(r, slack_s), _until(r, slack_s)
        if r.prompt_tokens is None or r.block_size <= 0 or r.approx:
            uncounted.append((since, until, None))
        elif r.one_more and not r.exact:
            uncounted.append((since, until, _ends(r, r.prompt_tokens // r.block_size)))
        elif r.exact:
            d, k = divmod(r.prompt_tokens, r.block_size)
            if d and k:
                counted.setdefault(d, []).append((r.request_id, k, since, until))
        elif (d := r.prompt_tokens // r.block_size) > 0:
            counted.setdefault(d, []).append((r.request_id, None, since, until))
    if not counted:
        return {}
    since, until = runs_span(served, slack_s)
    blocks: dict[int, list[Segment]] = {}
    blind: set[int] = set()
    for seg in chains.ones.between(since, until):
        d = seg.base
        if seg.prompt_end is None or d is None or seg.parent is None or d not in counted \
                or d in blind:
            continue
        if any(lo <= seg.ts <= hi and (ends is None or d in ends) for lo, hi, ends in uncounted):
            blind.add(d)  # a request nobody counted may own it: no count holds at d
            continue
        blocks.setdefault(d, []).append(seg)
    out: dict[str, frozenset[str]] = {}
    for d, segs in blocks.items():
        if d in blind:
            continue
        may = {id(seg): [rid for rid, k, lo, hi in counted[d]
                         if (k is None or k == seg.prompt_end) and lo <= seg.ts <= hi]
               for seg in segs}
        for group, rids in _groups(segs, may):
            out.update(_pair_off(group, rids, may))
    return out


def _groups(segs: list[Segment], may: Mapping[int, list[str]],
            ) -> list[tuple[list[Segment], set[str]]]:
    """The blocks and requests linked by who may own what, each group apart."""
    of: dict[str, list[Segment]] = {}
    for seg in segs:
        for rid in may[id(seg)]:
            of.setdefault(rid, []).append(seg)
    out, placed = [], set()
    for seg in segs:
        if id(seg) in placed:
            continue
        group, rids, todo = [], set(), [seg]
        placed.add(id(seg))
        while todo:
            s = todo.pop()
            group.append(s)
            for rid in may[id(s)]:
                if rid not in rids:
                    rids.add(rid)
                    for t in of[rid]:
                        if id(t) not in placed:
                            placed.add(id(t))
                            todo.append(t)
        out.append((group, rids))
    return out


def _pair_off(segs: list[Segment], runs: set[str], may: Mapping[int, list[str]],
              ) -> dict[str, frozenset[str]]:
    """Each block in ``segs`` (each hung off a parent) is the first decode block of one of
    ``runs`` (one each at most; ``may``: block → the runs that may own it): the parents each
    run's may hang off, where that follows."""
    if any(not may[id(seg)] for seg in segs):
        return {}  # a block no run that may own it ran for: not one of theirs
    out: dict[str, frozenset[str]] = {}
    left, free = list(segs), set(runs)
    while True:  # a block only one free run may own is its: that run owns no other
        sole = next(((seg, rids[0]) for seg in left
                     if len(rids := [x for x in may[id(seg)] if x in free]) == 1), None)
        if sole is None:
            break
        seg, rid = sole
        out[rid] = frozenset((seg.parent,))
        left.remove(seg)
        free.discard(rid)
    if any(not any(x in free for x in may[id(seg)]) for seg in left):
        return {}  # a block none left may own: not a decode count that holds
    if left and len(left) == len(free):
        for rid in free:
            mine = frozenset(seg.parent for seg in left if rid in may[id(seg)])
            if mine:
                out[rid] = mine
    return out


def candidates(chains: WorkerChains, served: Sequence[Served], slack_s: float = SLACK_S,
               announces_all: bool = False, bounds: Sequence[_Bounds] | None = None,
               ) -> dict[str, list[Segment]]:
    """Per request, the segments it may own as its prefill. A request of unknown length
    may own any segment stored while it ran: it is no one's answer, but a rival that keeps
    others from claiming its chain. ``bounds``: ``_bounds(served, slack_s)``."""
    fits: dict[str, list[Segment]] = {}
    for r, (f, since, until) in zip(served, bounds or _bounds(served, slack_s), strict=True):
        if f is None:
            fits[r.request_id] = chains.window(since, until)
        elif f[0] == 0:  # a prompt shorter than a block: its decode starts a chain
            fits[r.request_id] = [s for s in chains.window(since, until)
                                  if s.parent is None and s.blocks == 1]
        else:
            fits[r.request_id] = _fits(chains, r, *f, since, until, announces_all)
    return fits


def _maybe_decodes(chains: WorkerChains, served: Sequence[Served], bounds: Sequence[_Bounds],
                   ) -> dict[Segment, set[str]]:
    """Segments some request may have stored as its decode: one block (a decode fills one
    at a time) stored while it ran, hung off a block at its prompt's depth or off such a
    block of its decode before (any, for a request whose length nobody told): they owe no
    prompt an owner. Segment → the requests it may be the decode of."""
    out: dict[Segment, set[str]] = {}
    children, ones, ones_at = chains.children, chains.ones, chains.ones_at
    for r, (f, since, until) in zip(served, bounds, strict=True):
        if f is None:
            mine = set(ones.between(since, until))
        else:
            ends = _ends(r, f[0])
            mine = set()  # one block at its prompt's depth, or hung off an unseen parent
            for base in (None, *ends):
                at = ones_at.get(base)
                if at is not None:
                    mine.update(at.between(since, until))

            tips = [s.last for s in mine]
            while tips:  # down the children stored in the window (the test inline: hot)
                kids = children.get(tips.pop())
                if kids is None:
                    continue
                times = kids.times
                for child in kids.segs[bisect.bisect_left(times, since):
                                       bisect.bisect_right(times, until)]:
                    if child.blocks == 1 and child not in mine:
                        mine.add(child)
                        tips.append(child.last)
        rid = r.request_id
        for seg in mine:
            got = out.get(seg)
            if got is None:
                out[seg] = {rid}
            else:
                got.add(rid)
    return out


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


def _settle(cands: dict[str, list[Segment]]) -> tuple[dict[Segment, set[str]],
                                                       dict[str, Segment]]:
    """Who may own each segment, and the segments settled by elimination: one only one
    request can own is its; that may leave another request a single candidate, and so on."""
    owners: dict[Segment, set[str]] = {}
    for rid, segs in cands.items():
        for s in segs:
            owners.setdefault(s, set()).add(rid)
    owned: dict[str, Segment] = {}
    taken: set[Segment] = set()
    changed = True
    while changed:
        changed = False
        for s, rids in owners.items():
            if s in taken:
                continue
            left = [r for r in rids if r not in owned]
            if len(left) == 1:
                owned[left[0]] = s
                taken.add(s)
                changed = True
        for rid, segs in cands.items():
            if rid in owned:
                continue
            free = [s for s in segs if s not in taken]
            if len(free) == 1 and all(r in owned or r == rid for r in owners[free[0]]):
                owned[rid] = free[0]
                taken.add(free[0])
                changed = True
    return owners, owned


def _connected(cands: dict[str, list[Segment]], only: Collection[str],
               ) -> dict[str, list[Segment]]:
    """The candidates of the requests linked to one of ``only`` through shared segments
    (directly or through others), in their order: the others' segments are matched apart
    and cannot change who may own these (``Owners`` matches each group on its own)."""
    if all(rid in only for rid in cands):
        return dict(cands)  # every one is wanted
    rivals: dict[Segment, list[str]] = {}
    for rid, segs in cands.items():
        for s in segs:
            rivals.setdefault(s, []).append(rid)
    keep: set[str] = set()
    reached: set[Segment] = set()
    todo = [r for r in only if r in cands]
    while todo:
        rid = todo.pop()
        if rid not in keep:
            keep.add(rid)
            for s in cands[rid]:
                if s not in reached:
                    reached.add(s)
                    todo.extend(rivals[s])
    return {rid: segs for rid, segs in cands.items() if rid in keep}


def _overlapping(served: Sequence[Served], only: Collection[str], slack_s: float,
                 ) -> list[Served]:
    """The requests of ``served`` whose run overlaps, directly or through others, one of
    ``only``'s (each widened by the slack), in their order. Every segment a request may own,
    decode or share lies in its run, so the rest touch none of the segments the runs of
    ``only`` reach and cannot change their readings: they are left out unexamined."""
    ids = set(only)
    starts = [r.start for r in served]
    order = sorted(range(len(served)), key=starts.__getitem__)
    keep: list[int] = []
    first, wanted, reach = 0, False, float("-inf")
    for at, i in enumerate(order):
        r = served[i]
        if at and r.start - slack_s > reach:
            if wanted:
                keep += order[first:at]
            first, wanted, reach = at, False, r.end + slack_s
        else:
            reach = max(reach, r.end + slack_s)
        wanted = wanted or r.request_id in ids
    if wanted:
        keep += order[first:]
    if len(keep) == len(served):
        return list(served)
    return [served[i] for i in sorted(keep)]


def sized_like(learned: dict[str, tuple[int, int]], sizes: tuple[tuple[int, int], ...] | None,
               seg: Segment) -> bool:
    """Whether ``seg``'s chain may be a prompt of images of ``sizes`` (None: any), by the
    sizes ``learned`` of its images."""
    return sizes is None or not learned or all(
        learned.get(image_key(a), sizes[0]) in sizes for a in seg.images)


def _by_size(cands: dict[str, list[Segment]], owners: Owners[Segment],
             served: Sequence[Served], optional: frozenset[Segment],
             known: Mapping[str, tuple[int, int]] | None = None,
             ) -> tuple[dict[str, list[Segment]], Owners[Segment], dict[str, tuple[int, int]]]:
    """An image's identity has one size. A request of one image whose only reading owns a
    chain of one image tells that image's size; a request whose images have other sizes
    cannot own a chain of it. Repeated while that settles more (a conflict: none learned).
    ``known``: sizes learned before (other requests', on any worker). Also the sizes known
    (image key → size)."""
    sizes = {r.request_id: r.sizes for r in served if r.sizes and r.request_id in cands}
    learned: dict[str, tuple[int, int]] = dict(known or {})
    if not sizes:
        return cands, owners, learned
    start = cands, owners
    while True:
        for rid, told in sizes.items():
            if len(told) != 1 or owners.may_own_none(rid):
                continue
            mine = [seg for seg in cands[rid] if owners.may_own(rid, seg)]
            if len(mine) == 1 and len(mine[0].images) == 1:
                key = image_key(next(iter(mine[0].images)))
                if learned.setdefault(key, told[0]) != told[0]:
                    return *start, {}  # not one size: learn nothing, guess nothing
        kept = {rid: [seg for seg in segs if sized_like(learned, sizes.get(rid), seg)]
                for rid, segs in cands.items()}
        if all(len(kept[rid]) == len(segs) for rid, segs in cands.items()):
            return cands, owners, learned
        cands = kept
        owners = Owners(cands, optional)


def attribute(chains: WorkerChains, served: Sequence[Served], worker: str,
              slack_s: float = SLACK_S, known_images: frozenset[str] | None = None,
              only: Collection[str] | None = None, latest: dict[str, float] | None = None,
              span: tuple[float, float] | None = None, announces_all: bool = False,
              sizes: dict[str, tuple[int, int]] | None = None) -> dict[str, Realized]:
    """The realized hit of each request in ``served`` (one worker's) that its KV events
    show; a request they say nothing definite about is left out. ``known_images``: the
    image identities (keys) of every request around, on any worker. ``only``: the requests
    whose hit is wanted (the others still compete for the segments): the job judges a
    tick's settled requests against the minutes around them. ``latest``, when given, gets
    for each request that stored a segment in every assignment the latest it may own.
    ``span``: when ``served`` are only the runs linked to ``only``'s, the times all the
    worker's runs cover (``runs_span``; the images no request names are read over it).
    ``announces_all``: the worker's engine stores every block it computes (vLLM): no request
    computed blocks another stored while it ran without storing them too. ``sizes``: image
    key → pixel size learned before; the sizes learned here are added to it."""
    served = _blind_to(chains, served, slack_s, known_images, span)
    if only is not None:
        served = _overlapping(served, only, slack_s)
    bounds = _bounds(served, slack_s)
    cands = candidates(chains, served, slack_s, announces_all, bounds)
    # A request whose first decode block is known (or one of a few): its prompt ends at the
    # block that hangs off, so it computed no chain ending elsewhere.
    for rid, tips in decode_tips(chains, served, slack_s).items():
        if rid in cands:
            cands[rid] = [s for s in cands[rid] if s.last in tips]
    decodes = _maybe_decodes(chains, served, bounds)
    # A segment hung off a prompt a request may have stored may be its decode: it owes no
    # prompt an owner, but stays a longer prompt's candidate (one with the same blocks
    # first, computed beside it or found).
    for seg, rid in _decodes(chains, served, bounds, cands).items():
        decodes.setdefault(seg, set()).add(rid)
    if only is not None:
        cands = _connected(cands, only)
    owners = Owners(cands, frozenset(decodes))
    cands, owners, learned = _by_size(cands, owners, served, frozenset(decodes), sizes)
    if sizes is not None:
        sizes.update(learned)
    out: dict[str, Realized] = {}
    for r, (f, since, until) in zip(served, bounds, strict=True):
        rid = r.request_id
        if only is not None and rid not in only:
            continue
        mine = owners.owned_by(rid, cands.get(rid, ()))
        none = owners.may_own_none(rid)
        if latest is not None and mine and not none:
            latest[rid] = max(s.ts for s in mine)
        if f is None:
            # Its length unknown, a chain from the root that no other request can have
            # stored (as its prompt or its decode) is its: it found nothing cached (its
            # prompt, or a prompt shorter than a block under its decode). Any other depth
            # needs the length.
            if (mine and not none and all(s.base == 0 for s in mine)) or any(
                    s.base == 0 and set(owners.rivals[s]) | decodes.get(s, set()) == {rid}
                    for s in cands.get(rid, [])):
                out[rid] = Realized(0, None, SOURCE_KV)
            continue
        full, max_hit = f
        if full == 0:
            out[rid] = Realized(0, None, SOURCE_KV)
            continue
        if not mine and chains.last_ts < until:
            continue  # the worker's events may not have arrived yet
        own = {full - s.blocks if s.base is None else s.base for s in mine}
        if r.one_more:
            own |= {min(full + 1 - s.blocks, max_hit) for s in mine if s.base is None}
        readings = set(own)
        for seg in () if announces_all else mine:
            # Its chain's blocks above where it starts, stored by another request while it
            # ran: it may have computed them too (an engine that stores a block once).
            readings |= _computed_alongside(chains, seg, since, max_hit)
        alongside = set()
        if none:
            readings.add(max_hit)  # it stored nothing: its prompt was cached...
        if none and not announces_all:
            # ...or another request stored the same prompt while it computed it too.
            # (it ends at one of the consecutive depths ``_ends``: lo..hi)
            lo, hi = full, full + 1 if r.one_more else full
            alongside = {min(b, max_hit) for s in chains.window(since, until)
                         if (b := s.base) is not None and b < hi and b + s.blocks >= lo
                         and same_images(s, r.images) and sized_like(learned, r.sizes, s)}
            readings |= alongside
        best = max(own or readings)
        alt = tuple(sorted(readings - {best}, reverse=True))
        rivals = len(own) + none > 1
        out[rid] = Realized(best, None, SOURCE_KV, alt, None if not alt else (
            f"{len({o for s in mine for o in owners.rivals[s]} | {rid})} requests "
            f"of {full} blocks on {worker} at once" if rivals
            else f"another request on {worker} stored blocks of its prompt while it ran"))
    return out
