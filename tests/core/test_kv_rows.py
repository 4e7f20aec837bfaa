"""The compiled KV store rows (``mmlens/store/_kvrows.c``) equal ``writes.kv_row``'s, byte for
byte: on any event values (an event it does not take goes through ``kv_row``, exceptions
included), and on a fault-injected collector stream stored both ways and read back through
the store's readers."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest.kv_index import KVIngest
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored
from mmlens.store import writes
from mmlens.store.open import open_store
from mmlens.store.tail import IdTail

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kv_ingest import Mix

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None)
native = writes._native_rows
needs_native = pytest.mark.skipif(native is None, reason="compiled rows not built")

# msgpack's int forms change at these: both sides of each
EDGES = [0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32,
         (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -32, -33, -128, -129, -32768, -32769,
         -(1 << 31), -(1 << 31) - 1, -(1 << 63)]
INTS = st.one_of(st.sampled_from(EDGES), st.integers(0, (1 << 64) - 1))
ODD_INTS = st.one_of(INTS, st.sampled_from([1 << 64, -(1 << 63) - 1, True]))  # kv_row's errors
NAMES = st.one_of(st.sampled_from(["ab" * 32, "cd" * 32, "pad:1000007", "é" * 3, 'q"t', "b\\s",
                                   "c\x01", "x" * 31, "y" * 32, "z" * 300, "\ud800", ""]),
                  st.text(max_size=40))
OFFSETS = st.one_of(st.none(), st.sampled_from(EDGES))
REF = st.tuples(NAMES, OFFSETS)
REFS = st.one_of(st.none(), st.just(()), st.lists(REF, min_size=1, max_size=3).map(tuple),
                 st.lists(st.lists(st.one_of(NAMES, OFFSETS), max_size=3), max_size=2))
HASHES = st.one_of(st.lists(INTS, max_size=20), st.lists(st.sampled_from(["ab12", "ff"]),
                                                         min_size=1, max_size=3),
                   st.lists(ODD_INTS, max_size=3))
KEYS = st.one_of(st.none(), st.lists(INTS, max_size=20), st.lists(ODD_INTS, max_size=3))


def _rows(events: list, compiled: bool, bound: bool = False) -> list:
    if compiled:
        return native(events, BlockStored, BlockRemoved, writes._bound_kv_row if bound
                      else writes.kv_row, bound)
    rows = list(map(writes.kv_row, events))
    return list(map(writes.bound_row, rows)) if bound else rows


def _same(events: list) -> None:
    """Both ways give equal rows of equal types, or both raise the same error; so do their
    bound forms (SQLite's)."""
    for bound in (False, True):
        try:
            want = _rows(events, False, bound)
        except Exception as exc:
            with pytest.raises(type(exc)):
                _rows(events, True, bound)
            continue
        got = _rows(events, True, bound)
        assert got == want
        assert [list(map(type, r)) for r in got] == [list(map(type, r)) for r in want]


@st.composite
def events(draw: st.DrawFn) -> object:
    common = (draw(st.sampled_from(["w0", "é"])), draw(st.integers(0, 3)),
              draw(st.integers(0, 1 << 40)), draw(st.floats(0, 2e9)))
    kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
    idx = draw(st.integers(0, 5))
    if kind == "cleared":
        return AllBlocksCleared(*common, idx=idx)
    hashes = draw(HASHES)
    if kind == "removed":
        return BlockRemoved(*common, hashes, draw(st.one_of(st.none(), st.just("GPU"))), idx,
                            keys=draw(KEYS))
    images = draw(st.one_of(st.none(), st.lists(REFS, max_size=22)))
    return BlockStored(*common, hashes, draw(st.one_of(st.none(), INTS, st.just("ab12"))),
                       [1, 2], 16, images=images, idx=idx, keys=draw(KEYS),
                       shapes=draw(st.one_of(st.none(), st.lists(INTS, max_size=22))),
                       prompt_end=draw(st.one_of(st.none(), st.sampled_from(EDGES))))


@needs_native
@SETTINGS
@given(evs=st.lists(events(), max_size=6))
def test_compiled_rows_equal_kv_row(evs):
    for ev in evs:
        _same([ev])
    _same(evs)


@needs_native
def test_a_row_the_compiled_way_does_not_take_is_kv_rows_own():
    """A hex-string hash, a name JSON escapes, a cleared event: ``kv_row`` builds them."""
    seen = []

    def fallback(ev):
        seen.append(ev)
        return writes.kv_row(ev)

    evs = [BlockStored("w", 0, 1, 1.0, ["ab12"], None, [], 16),
           BlockStored("w", 0, 1, 1.0, [5], None, [], 16, images=[(('q"t', 0),)]),
           AllBlocksCleared("w", 0, 1, 1.0),
           BlockStored("w", 0, 1, 1.0, [5, 1 << 63], 7, [], 16, images=[(("ab", -3),), None],
                       keys=[9, 1 << 64 - 1], shapes=[3, 4], prompt_end=2),
           BlockRemoved("w", 0, 1, 1.0, [1, 2], keys=[3])]
    assert native(evs, BlockStored, BlockRemoved, fallback, False) == list(
        map(writes.kv_row, evs))
    assert seen == evs[:3]


def _faulted(payloads: list[bytes], rng: random.Random) -> list[bytes]:
    """The stream with faults: bytes flipped, batches cut short, dropped, repeated, garbage."""
    out = []
    for p in payloads:
        roll = rng.random()
        if roll < 0.03:
            i = rng.randrange(len(p))
            p = p[:i] + bytes([p[i] ^ (1 << rng.randrange(8))]) + p[i + 1:]
        elif roll < 0.05:
            p = p[:rng.randrange(len(p))]
        elif roll < 0.07:
            continue
        elif roll < 0.09:
            out.append(p)
        elif roll < 0.10:
            p = msgspec.msgpack.encode([1.0, [["BlockStored", ["zz"], None, [1] * 16, 16]], 0])
        out.append(p)
    return out


def _store_stream(path: Path, payloads: list[bytes], compiled: bool,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[list, dict]:
    monkeypatch.setattr(writes, "_native_rows", native if compiled else None)
    ingest, store, pending, rows = KVIngest(), open_store(str(path)), [], []
    for seq, p in enumerate(payloads):
        events = ingest.ingest("w0", seq, p)
        pending.extend(events)
        rows.extend(writes.kv_rows(events))
        if seq % 50 == 0:
            store.add_kv_events(pending)
            pending = []
    store.add_kv_events(pending)
    store.close()
    monkeypatch.setattr(writes, "_native_rows", native)
    return rows, ingest.errors


@needs_native
def test_a_faulted_stream_stores_and_reads_back_the_same_both_ways(tmp_path, monkeypatch):
    mix = Mix(3000, seed=11)
    fill, timed, _ = mix.payloads(1500)
    payloads = _faulted(fill + timed, random.Random(5))
    got, want = (_store_stream(tmp_path / f"{way}.db", payloads, way == "c", monkeypatch)
                 for way in ("c", "py"))
    assert got[0] == want[0] and got[1] == want[1]
    assert got[1]  # the faults were seen and counted
    assert sum(r[4] == "stored" and r[8] is not None for r in got[0]) > 100  # image names
    reads = []
    for way in ("c", "py"):
        store = open_store(str(tmp_path / f"{way}.db"))
        reads.append((store._rows("SELECT * FROM kv_events ORDER BY ts, seq, idx"),
                      store.kv_event_rows(None), store.kv_keyed_tail(IdTail()),
                      store.kv_chain_tail(IdTail())))
        store.close()
    assert reads[0] == reads[1]
    assert len(reads[0][0]) > 1000
