"""Who may own which stored segment, over every assignment the evidence allows.

Each stored prompt segment was computed by one of the requests that could have stored it
(its candidates), and a request stores at most one prompt segment. An assignment is a
matching that gives every segment an owner; a request's possible readings are the segments
it owns in some assignment, and owning none when some assignment leaves it without one.
Elimination by single candidates is the easy case of this; the matching also settles groups
(two segments that only two requests can own leave a third request of their length none).

A segment no assignment can give an owner (its request is not among those served: a retry's
first attempt, a request outside the window) constrains nobody: it is left out.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

S = TypeVar("S", bound=Hashable)


@dataclass
class Owners(Generic[S]):
    """A maximum matching of the segments that need an owner to requests (Kuhn's augmenting
    paths), kept to answer ``may_own`` / ``may_own_none`` from its alternating paths.
    ``optional``: segments that need no prompt owner (another request's decode may be them).
    A group (connected requests and segments) whose segments cannot all get an owner has
    one stored by a request not among the candidates: nothing in it is forced."""

    cands: Mapping[str, Sequence[S]]
    optional: frozenset[S] = frozenset()
    rivals: dict[S, list[str]] = field(default_factory=dict)  # every candidate owner
    by_seg: dict[S, list[str]] = field(default_factory=dict)  # of the segments owed one
    seg_of: dict[str, S] = field(default_factory=dict)
    owner_of: dict[S, str] = field(default_factory=dict)
    _freeing: set[S] | None = field(default=None, init=False, repr=False)
    _comp: dict[S, int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        rivals, optional = self.rivals, self.optional
        for rid, segs in self.cands.items():
            for s in segs:
                got = rivals.get(s)
                if got is None:
                    rivals[s] = [rid]
                else:
                    got.append(rid)
        by_seg = self.by_seg = {s: rids for s, rids in rivals.items() if s not in optional} \
            if optional else dict(rivals)
        seg_of, owner_of = self.seg_of, self.owner_of
        unowned = []
        for s, rids in by_seg.items():
            first = rids[0]
            if first not in seg_of:  # ``_augment``'s first step, without its frames
                seg_of[first] = s
                owner_of[s] = first
            elif not self._augment(s, set(), seg_of, owner_of, None):
                unowned.append(s)
        if unowned:
            loose = self._groups_of(unowned)
            self.by_seg = {s: rids for s, rids in self.by_seg.items() if s not in loose}
            self.seg_of = {r: s for r, s in self.seg_of.items() if s not in loose}
            self.owner_of = {s: r for s, r in self.owner_of.items() if s not in loose}

    def _groups_of(self, segs: Sequence[S]) -> set[S]:
        """Every segment connected to ``segs`` through shared candidates."""
        out: set[S] = set()
        todo = list(segs)
        seen: set[str] = set()
        while todo:
            s = todo.pop()
            if s in out:
                continue
            out.add(s)
            for rid in self.rivals.get(s, ()):
                if rid not in seen:
                    seen.add(rid)
                    todo.extend(self.cands.get(rid, ()))
        return out

    def _augment(self, s: S, seen: set[str], seg_of: dict[str, S], owner_of: dict[S, str],
                 banned: str | None) -> bool:
        """An owner for ``s``, moving owners along an alternating path (iterative: a busy
        worker's group can be longer than Python's recursion allows)."""
        frames: list[list] = [[s, 0]]
        chosen: list[str] = []  # the request taken at each frame but the last
        while frames:
            frame = frames[-1]
            rids = self.by_seg.get(frame[0], ())
            while frame[1] < len(rids) and (rids[frame[1]] in seen or rids[frame[1]] == banned):
                frame[1] += 1
            if frame[1] == len(rids):
                frames.pop()
                if chosen:
                    chosen.pop()
                continue
            rid = rids[frame[1]]
            frame[1] += 1
            seen.add(rid)
            nxt = seg_of.get(rid)
            if nxt is None:
                for (seg, _), r in zip(frames, [*chosen, rid], strict=True):
                    seg_of[r] = seg
                    owner_of[seg] = r
                return True
            chosen.append(rid)
            frames.append([nxt, 0])
        return False

    def _freeing_segments(self) -> set[S]:
        """The questions are answered from the matching's alternating paths: a request may
        own none when the segment it holds can hand its owner on, owner by owner, to a
        request holding none (such segments: these); it may own another segment ``s`` when
        its own is one of these, or when the owners can move around a cycle through both
        (``s`` reaches its own, since it is a rival of ``s``: the two share a strongly
        connected component of "a rival of this segment holds that one", ``_components``)."""
        if self._freeing is not None:
            return self._freeing
        by_seg, seg_of, owner_of = self.by_seg, self.seg_of, self.owner_of
        freeing = {x for x, rids in by_seg.items() if any(r not in seg_of for r in rids)}
        todo = list(freeing)
        while todo:  # backwards: the segments a rival of which holds a freeing one
            rid = owner_of[todo.pop()]
            for x in self.cands.get(rid, ()):
                if x not in freeing and x in by_seg:
                    freeing.add(x)
                    todo.append(x)
        self._freeing = freeing
        return freeing

    def _cycle(self, a: S, b: S) -> bool:
        """Whether two held segments' owners can move around a cycle through both."""
        if self._comp is None:
            self._comp = self._components()
        return self._comp[a] == self._comp[b]

    def _components(self) -> dict[S, int]:
        """Segment → its strongly connected component of "a rival of it holds that one"
        (Tarjan's, iterative: a busy worker's group can be longer than Python's recursion
        allows)."""
        by_seg, seg_of = self.by_seg, self.seg_of
        order: dict[S, int] = {}
        low: dict[S, int] = {}
        comp: dict[S, int] = {}
        stack: list[S] = []
        for root in by_seg:
            if root in order:
                continue
            order[root] = low[root] = len(order)
            stack.append(root)
            work = [(root, iter([seg_of[r] for r in by_seg[root] if r in seg_of]))]
            while work:
                v, nxt = work[-1]
                for w in nxt:
                    if w not in order:
                        order[w] = low[w] = len(order)
                        stack.append(w)
                        work.append((w, iter([seg_of[r] for r in by_seg[w] if r in seg_of])))
                        break
                    if w not in comp:  # on the stack
                        low[v] = min(low[v], order[w])
                else:
                    work.pop()
                    if work:
                        u = work[-1][0]
                        low[u] = min(low[u], low[v])
                    if low[v] == order[v]:
                        while True:
                            w = stack.pop()
                            comp[w] = order[v]
                            if w == v:
                                break
        return comp

    def may_own_none(self, rid: str) -> bool:
        """Whether some assignment leaves ``rid`` without a segment."""
        mine = self.seg_of.get(rid)
        return mine is None or mine in self._freeing_segments()

    def owned_by(self, rid: str, segs: Sequence[S]) -> list[S]:
        """Those of ``segs`` that ``rid`` may own (``may_own`` of each), in their order."""
        if not segs:
            return []
        rivals, owner_of = self.rivals, self.owner_of
        mine = self.seg_of.get(rid)
        free = mine is None or mine in self._freeing_segments()
        out = []
        for s in segs:
            if rid not in rivals.get(s, ()):
                continue
            if s not in owner_of:
                if free:
                    out.append(s)
            elif free or mine == s or self._cycle(mine, s):  # type: ignore[arg-type]
                out.append(s)
        return out

    def may_own(self, rid: str, s: S) -> bool:
        """Whether some assignment gives ``s`` to ``rid``: the one ``rid`` gives up (if any)
        finds another owner, not ``rid``; the request ``s`` is taken from may own none."""
        if rid not in self.rivals.get(s, ()):
            return False
        if s not in self.owner_of:  # owed no owner: ``rid`` only has to give up its own
            return self.may_own_none(rid)
        mine = self.seg_of.get(rid)
        if mine is None or mine == s:
            return True
        return mine in self._freeing_segments() or self._cycle(mine, s)
