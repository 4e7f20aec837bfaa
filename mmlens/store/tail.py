"""Reading a table's new rows by increasing id when writers commit out of id order."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class IdTail:
    """Where a reader of a table's rows "by increasing id" is, and the ids it passed over.

    PostgreSQL assigns an identity id when a row is inserted, but transactions commit in
    another order: a reader can see id 105 (committed) while id 103 is still in an open
    transaction of another collector. Moving the cursor to 105 alone would lose 103 for
    good. So every id below the highest one read that was not returned — a row not
    committed yet, or a value never to be used (a rolled-back insert, ``ON CONFLICT DO
    NOTHING`` consumes one, a deleted row) — stays in ``gaps`` and is asked for again on
    each read until ``late_s`` after it was first passed over (the short ranges' ids in one
    lookup, as ``ON CONFLICT DO NOTHING`` leaves many one-id gaps); a row found there is
    returned once (its id leaves the gaps) and counted in ``late``. At most ``max_gaps``
    ranges are kept, the oldest dropped first (counted in ``dropped``: a row committing
    later than that is lost). SQLite serializes writers, so its gaps are only deleted rows
    and are never filled; the same reader serves both.
    """

    after: int = 0  # the highest id read
    late_s: float = 10.0  # a batch commits within a second or two of taking its ids
    max_gaps: int = 10_000
    clock: Callable[[], float] = time.monotonic
    gaps: list[tuple[int, int, float]] = field(default_factory=list)  # first, last, since
    late: int = 0
    dropped: int = 0

    def pending(self) -> list[tuple[int, int]]:
        """The id ranges to ask for again (after forgetting those older than ``late_s``)."""
        cutoff = self.clock() - self.late_s
        self.gaps = [g for g in self.gaps if g[2] >= cutoff]  # oldest first: a prefix
        return [(first, last) for first, last, _ in self.gaps]

    def pending_ids(self, max_span: int = 64) -> tuple[list[int], list[tuple[int, int]]]:
        """``pending`` as the ids of its short ranges (one set lookup asks for them all)
        and its ranges wider than ``max_span`` (a range lookup each)."""
        ids: list[int] = []
        wide = []
        for first, last in self.pending():
            if last - first < max_span:
                ids.extend(range(first, last + 1))
            else:
                wide.append((first, last))
        return ids, wide

    def advance(self, ids: Iterable[int]) -> None:
        """The ids of the new rows read (above ``after``, increasing)."""
        now = self.clock()
        for rid in ids:
            if rid > self.after + 1:
                self.gaps.append((self.after + 1, rid - 1, now))
            self.after = max(self.after, rid)
        if len(self.gaps) > self.max_gaps:
            self.dropped += len(self.gaps) - self.max_gaps
            del self.gaps[:len(self.gaps) - self.max_gaps]

    def filled(self, ids: Iterable[int]) -> None:
        """Rows found in the gaps: returned now, so never asked for again."""
        found = sorted(ids)
        if not found:
            return
        self.late += len(found)
        rest = []
        for first, last, since in self.gaps:
            start = first
            lo, hi = bisect.bisect_left(found, first), bisect.bisect_right(found, last)
            for rid in found[lo:hi]:
                if rid > start:
                    rest.append((start, rid - 1, since))
                start = rid + 1
            if start <= last:
                rest.append((start, last, since))
        self.gaps = rest
