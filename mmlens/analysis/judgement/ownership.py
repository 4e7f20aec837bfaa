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
    paths), kept to answer ``may_own`` / ``may_own_none`` by re-augmenting a copy.
    ``optional``: segments that need no prompt owner (another request's decode may be them).
    A group (connected requests and segments) whose segments cannot all get an owner has
    one stored by a request not among the candidates: nothing in it is forced."""

    cands: Mapping[str, Sequence[S]]
    optional: frozenset[S] = frozenset()
    rivals: dict[S, list[str]] = field(default_factory=dict)  # every candidate owner
    by_seg: dict[S, list[str]] = field(default_factory=dict)  # of the segments owed one
    seg_of: dict[str, S] = field(default_factory=dict)
    owner_of: dict[S, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rid, segs in self.cands.items():
            for s in segs:
                self.rivals.setdefault(s, []).append(rid)
        self.by_seg = {s: rids for s, rids in self.rivals.items() if s not in self.optional}
        unowned = [s for s in self.by_seg
                   if not self._augment(s, set(), self.seg_of, self.owner_of, None)]
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
                 banned: str | None, undo: list[tuple[dict, object, object]] | None = None,
                 ) -> bool:
        """An owner for ``s``, moving owners along an alternating path (iterative: a busy
        worker's group can be longer than Python's recursion allows). ``undo``, when given,
        gets each entry's value before it was changed (``_MISSING``: none)."""
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
                    if undo is not None:
                        undo.append((seg_of, r, seg_of.get(r, _MISSING)))
                        undo.append((owner_of, seg, owner_of.get(seg, _MISSING)))
                    seg_of[r] = seg
                    owner_of[seg] = r
                return True
            chosen.append(rid)
            frames.append([nxt, 0])
        return False

    def may_own_none(self, rid: str) -> bool:
        """Whether some assignment leaves ``rid`` without a segment."""
        mine = self.seg_of.get(rid)
        if mine is None:
            return True
        seg_of, owner_of = self.seg_of, self.owner_of
        undo: list[tuple[dict, object, object]] = [(seg_of, rid, mine), (owner_of, mine, rid)]
        del seg_of[rid], owner_of[mine]
        try:
            return self._augment(mine, set(), seg_of, owner_of, rid, undo)
        finally:
            _restore(undo)

    def may_own(self, rid: str, s: S) -> bool:
        """Whether some assignment gives ``s`` to ``rid``: the one ``rid`` gives up (if any)
        finds another owner, not ``rid``; the request ``s`` is taken from may own none."""
        if rid not in self.rivals.get(s, ()):
            return False
        if s not in self.owner_of:  # owed no owner: ``rid`` only has to give up its own
            return self.may_own_none(rid)
        if self.seg_of.get(rid) == s:
            return True
        # The question is asked of the matching itself, changed in place and put back: a
        # copy per question costs the whole matching, and a busy worker asks thousands.
        seg_of, owner_of = self.seg_of, self.owner_of
        undo: list[tuple[dict, object, object]] = []
        mine = seg_of.get(rid)
        if mine is not None:
            undo.append((seg_of, rid, mine))
            undo.append((owner_of, mine, rid))
            del seg_of[rid], owner_of[mine]
        was = owner_of[s]
        undo += [(seg_of, was, s), (owner_of, s, was), (seg_of, rid, _MISSING)]
        del seg_of[was]
        seg_of[rid], owner_of[s] = s, rid
        try:
            return mine is None or self._augment(mine, set(), seg_of, owner_of, rid, undo)
        finally:
            _restore(undo)


_MISSING = object()


def _restore(undo: list[tuple[dict, object, object]]) -> None:
    """Put back the entries ``undo`` saved, latest change first."""
    for d, key, old in reversed(undo):
        if old is _MISSING:
            d.pop(key, None)
        else:
            d[key] = old
