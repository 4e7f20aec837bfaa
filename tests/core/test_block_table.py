"""The compiled resident-block table (``mmlens.ingest.block_table``) reads and writes as the
dict it replaces, and its one-call store equals the Python chain."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest.block_table import BlockTable, new_blocks
from mmlens.layout.content_keys import event_chain_py

pytestmark = pytest.mark.skipif(BlockTable is None, reason="compiled chain not built")
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None)
HASHES = st.one_of(st.integers(0, 40), st.sampled_from([(1 << 64) - 1, 1 << 63, 1 << 60, 1 << 30]),
                   st.integers(0, (1 << 64) - 1))
STATES = st.one_of(st.none(), st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 128) - 1))
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), HASHES, STATES),
    st.tuples(st.just("del"), HASHES),
    st.tuples(st.just("pop"), HASHES),
    st.tuples(st.just("update"), st.lists(st.tuples(HASHES, STATES), max_size=30)),
    st.tuples(st.just("clear")),
), max_size=60)


@SETTINGS
@given(ops=OPS)
def test_table_reads_and_writes_as_a_dict(ops):
    table, want = new_blocks(), new_blocks(compiled=False)
    for op in ops:
        if op[0] == "set":
            table[op[1]] = want[op[1]] = op[2]
        elif op[0] in ("del", "pop"):
            if op[1] in want:
                assert (table.pop(op[1]) if op[0] == "pop" else table[op[1]]) == want[op[1]]
                del want[op[1]]
                if op[0] == "del":
                    del table[op[1]]
            else:
                with pytest.raises(KeyError):
                    del table[op[1]]
                assert table.pop(op[1], "absent") == "absent"
        elif op[0] == "update":
            table.update(op[1])
            want.update(op[1])
        else:
            table.clear()
            want.clear()
        assert len(table) == len(want) and table == want and dict(table) == want
    for h in range(42):
        assert (h in table) == (h in want) and table.get(h, -1) == want.get(h, -1)
    assert sorted(table) == sorted(want) and BlockTable(want) == want


def test_table_refuses_what_a_block_cannot_be():
    table = new_blocks()
    for key, state, error in ((-1, 0, OverflowError), ("a", 0, TypeError),
                              (1 << 64, 0, OverflowError), (1 << 90, 0, OverflowError),
                              (1, -1, OverflowError), (1, 1 << 128, OverflowError),
                              (1, "x", TypeError)):
        with pytest.raises(error):
            table[key] = state
    assert len(table) == 0 and "a" not in table and table.get(-1) is None
    assert 1 << 64 not in table and table.get((1 << 64) | 5) is None


@SETTINGS
@given(n=st.integers(1, 6), extra=st.integers(0, 2), parent=st.sampled_from([None, 1, 2, 3]),
       tokens=st.lists(st.integers(0, (1 << 32) - 1), min_size=96, max_size=96),
       image=st.booleans())
def test_one_call_store_equals_the_python_chain(n, extra, parent, tokens, image):
    """Parent known (1, 2: text and image states), unknown (3: None) or absent (None: root)."""
    bs = 8
    table = new_blocks()
    table[1], table[2], table[3] = 12345, 678 | 91 << 64, None
    hashes = list(range(100, 100 + n))
    toks = array("I", tokens[:(n + extra) * bs])
    images = [(("img", 2 - bs * b),) for b in range(n + extra)] if image else None
    got = table.store(hashes, parent, toks, bs, images)
    state = {None: 0, 1: 12345, 2: 678 | 91 << 64, 3: None}[parent]
    if state is None:
        assert got is None and all(table[h] is None for h in hashes)
        return
    states, shapes, keys = event_chain_py(state, toks, bs, images)
    assert got == (shapes[:n], keys[:n])
    assert [table[h] for h in hashes] == states[:n]
    assert table.remove(hashes, {}, {}) == (keys[:n], n, 0) and len(table) == 3


def _home(key: int, cap: int) -> int:
    """The slot a key's probe starts at in a table of ``cap`` slots (``slot_of`` in _chain.c)."""
    m = (1 << 64) - 1
    key ^= key >> 33
    key = (key * 0xFF51AFD7ED558CCD) & m
    key ^= key >> 33
    return key & (cap - 1)


# Keys whose probes start at the last slots of the first table (16 slots, up to 10 keys) and at
# its first ones: runs wrap past its end, where a removal's shifting back must wrap with them
# and leave a key in place at its own home.
_WRAPPING = ([k for k in range(5000) if _home(k, 16) in (13, 14, 15)][:6]
             + [k for k in range(5000) if _home(k, 16) in (0, 1)][:4])


@SETTINGS
@given(ops=st.lists(st.tuples(st.booleans(), st.sampled_from(_WRAPPING)), max_size=40))
def test_removals_in_runs_that_wrap_past_the_end_keep_every_key(ops):
    """Removals shift later keys back instead of leaving tombstones: keys whose runs wrap past
    the table's last slot are all still found, whatever the order of stores and removals."""
    table, want = new_blocks(), new_blocks(compiled=False)
    for store, key in ops:
        if store:
            table[key] = want[key] = key
        elif key in want:
            assert table.pop(key) == want.pop(key)
        for k in _WRAPPING:
            assert (k in table) == (k in want) and table.get(k) == want.get(k)
    assert len(table) == len(want) and dict(table) == want
