"""The router index's worker masks against a plain per-worker reading of the same holdings:
every prefix match (per worker, the consecutive leading blocks it holds) and the deepest
one, under random stores and removals."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.whatif.index import BlockIndex, workers_of

WORKERS = 70  # past 64: a mask is not one machine word

ops = st.lists(st.tuples(st.booleans(), st.integers(0, WORKERS - 1),
                         st.lists(st.integers(0, 11), min_size=1, max_size=6)), max_size=60)


def _leading(held: set[int], keys: tuple[int, ...]) -> int:
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(st.integers(0, 11), max_size=8))
def test_masks_match_a_plain_reading(steps: list[tuple[bool, int, list[int]]],
                                     probe: list[int]) -> None:
    index = BlockIndex()
    held: dict[int, set[int]] = {w: set() for w in range(WORKERS)}
    for add, w, keys in steps:
        if add:
            index.add(w, keys)
            held[w].update(keys)
        else:
            for k in keys:
                index.remove(w, k)
                held[w].discard(k)
    keys = tuple(probe)
    want = {w: d for w in range(WORKERS) if (d := _leading(held[w], keys))}
    assert index.overlaps(keys) == want
    depths = [d for d, _ in index.group_masks(keys)]
    assert depths == sorted(set(depths))  # shallowest first, one group a depth
    deepest = max(want.values(), default=0)
    assert index.deepest(keys) == (deepest, {w for w, d in want.items() if d == deepest})
    assert len(index) == len(set().union(*held.values()))


def test_workers_of_reads_every_bit() -> None:
    assert workers_of(0) == set()
    assert workers_of(1 << 69 | 1 << 3 | 1) == {0, 3, 69}
