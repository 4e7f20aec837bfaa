"""Tailing a table by id (``IdTail``): ids passed over are asked for again until a bound, a row
found late is returned once, and ids never used (``ON CONFLICT DO NOTHING`` on PostgreSQL)
are forgotten after ``late_s``."""

from __future__ import annotations

from mmlens.records import BlockStored
from mmlens.store.open import open_store
from mmlens.store.tail import IdTail


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_gaps_are_asked_for_until_found_or_too_old() -> None:
    clock = Clock()
    tail = IdTail(late_s=10.0, max_gaps=3, clock=clock)
    tail.advance([1, 2, 5, 9])
    assert tail.after == 9 and tail.pending() == [(3, 4), (6, 8)]
    tail.filled([3, 7])
    assert tail.late == 2 and tail.pending() == [(4, 4), (6, 6), (8, 8)]
    clock.t = 5.0
    tail.advance([11])  # one gap too many: the oldest goes
    assert tail.dropped == 1 and tail.pending() == [(6, 6), (8, 8), (10, 10)]
    clock.t = 12.0
    assert tail.pending() == [(10, 10)]
    clock.t = 16.0
    assert tail.pending() == [] and tail.after == 11


def test_short_gaps_are_asked_for_as_ids_and_wide_ones_as_ranges() -> None:
    tail = IdTail()
    tail.advance([1, 4, 100, 102])
    assert tail.pending_ids(max_span=64) == ([2, 3, 101], [(5, 99)])


def _stored(seq: int) -> BlockStored:
    return BlockStored("w", 0, seq, 100.0 + seq, [seq], None, [1] * 16, 16, keys=[seq])


def test_rows_are_returned_once_across_unused_ids(store_db: str, backend: str) -> None:
    store = open_store(store_db)
    clock = Clock()
    tail = IdTail(late_s=10.0, clock=clock)
    store.add_kv_content([_stored(s) for s in range(3)])
    assert [r.keys for r in store.kv_content_tail(tail)] == [[0], [1], [2]]
    store.add_kv_content([_stored(s) for s in range(5)])  # 0–2 again: PostgreSQL skips ids
    assert [r.keys for r in store.kv_content_tail(tail, limit=1)] == [[3]]
    assert [r.keys for r in store.kv_content_tail(tail)] == [[4]]
    assert store.kv_content_tail(tail) == [] and tail.late == 0
    assert tail.pending() == ([(4, 6)] if backend == "postgresql" else [])
    clock.t = 11.0
    assert tail.pending() == [] and store.kv_content_tail(tail) == []
    store.close()


def test_rows_in_short_and_wide_gaps_are_found(store_db: str) -> None:
    """Both lookups of the gaps, on each backend: ids passed over whose rows are there now."""
    store = open_store(store_db)
    store.add_kv_content([_stored(s) for s in range(100)])
    first = store.kv_content_tail(IdTail(), limit=1)[0].rowid
    tail = IdTail(after=first - 1)
    tail.advance([first, first + 3, first + 99])  # passed over: 2 ids, then 95
    rows = store.kv_content_tail(tail)
    assert [r.keys[0] for r in rows] == [1, 2, *range(4, 99)]
    assert tail.late == 97 and tail.pending() == [] and tail.after == first + 99
    store.close()
