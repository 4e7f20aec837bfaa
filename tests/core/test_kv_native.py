"""The fast way through KV batches equals the generic one: the compiled chain and index
bookkeeping (``mmlens/layout/_chain.c``) equal their Python forms, and ``fast_batch`` gives
exactly the events ``normalize_batch`` gives for every batch it takes."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mmlens.ingest.kv_fast as kv_fast
import mmlens.ingest.kv_index as kv_index
import mmlens.layout.content_keys as content_keys
from mmlens.ingest.kv_events import _images_of, decode_payload, normalize_batch
from mmlens.ingest.kv_fast import fast_batch, tokens_of
from mmlens.ingest.kv_index import KVIngest, ResidentIndex
from mmlens.layout.content_keys import event_chain_py, native

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kv_ingest import Mix

from tests.fuzz.strategies import kv_batches

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)
needs_native = pytest.mark.skipif(native is None, reason="compiled chain not built")
ENC = msgspec.msgpack.Encoder()
NAMES = st.sampled_from(["ab" * 32, "cd" * 32, "pad:1000007", "é" * 3])
OFFSETS = st.one_of(st.none(), st.integers(-40, 40), st.sampled_from([(1 << 31) - 1]))
REFS = st.one_of(st.none(), st.just(()), st.lists(st.tuples(NAMES, OFFSETS), min_size=1,
                                                    max_size=3).map(tuple))
TOKENS = st.sampled_from([0, 7, 151655, 1_000_007, (1 << 32) - 1])


@contextlib.contextmanager
def python_only():
    """The Python forms: no compiled module anywhere on the path."""
    saved = content_keys.native, kv_index.native, kv_fast.native
    content_keys.native = kv_index.native = kv_fast.native = None
    try:
        yield
    finally:
        content_keys.native, kv_index.native, kv_fast.native = saved


def test_the_compiled_chain_is_built_where_it_can_be():
    """scripts/test installs libxxhash-dev before mmlens and says so: a silent fallback to
    Python there is a defect."""
    if not os.environ.get("MMLENS_EXPECT_NATIVE") or sys.byteorder != "little":
        pytest.skip("not installed by scripts/test with xxhash.h: the Python forms may be used")
    assert importlib.util.find_spec("mmlens.layout._chain") is not None
    assert native is not None
    assert kv_fast.batch_native is not None  # _kvbatch.c needs a compiler only


@needs_native
@SETTINGS
@given(bs=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_compiled_chain_equals_python(bs, data):
    n = data.draw(st.integers(0, 5))
    tokens = data.draw(st.lists(TOKENS, min_size=n * bs, max_size=n * bs + bs - 1))
    images = data.draw(st.one_of(st.none(), st.lists(REFS, max_size=n + 1)))
    state = data.draw(st.sampled_from([0, 12345, (1 << 64) - 1, (7 << 64) | 99]))
    assert content_keys.event_chain(state, tokens, bs, images) == tuple(
        event_chain_py(state, tokens, bs, images))


@needs_native
@SETTINGS
@given(ids=st.lists(st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.booleans(),
                              st.integers(0, (1 << 32) - 1), st.floats(0, 10)), max_size=40),
       wrap=st.sampled_from(["list", "nil", "map"]))
def test_token_ids_read_alike(ids, wrap):
    raw = msgspec.Raw(ENC.encode({"list": ids, "nil": None, "map": {"a": 1}}[wrap]))
    fast = tokens_of(raw)
    with python_only():
        slow = tokens_of(raw)
    # no bool, no float, each in [0, 2^32): an array of exactly those ids; else None both ways
    ok = wrap == "list" and all(type(i) is int and 0 <= i < 1 << 32 for i in ids)
    assert fast == slow == (array("I", ids) if ok else None)


@needs_native
@SETTINGS
@given(extra=st.lists(st.one_of(st.none(), st.lists(st.tuples(NAMES, OFFSETS).map(list),
                                                    max_size=2),
                                NAMES, st.integers(0, 3)), max_size=6))
def test_image_refs_read_alike(extra):
    assert native.images_of(extra, kv_fast.image_refs) == _images_of(extra)


def comparable(events: list[Any]) -> list[dict[str, Any]]:
    out = []
    for ev in events:
        d = dataclasses.asdict(ev)
        if "token_ids" in d:
            d["token_ids"] = list(d["token_ids"])
        out.append(d)
    return out


HASHES = st.lists(st.integers(-(1 << 63), (1 << 64) - 1), max_size=4)
ODD = st.sampled_from([None, True, -1, 1.5, "x", b"\x00", [], {}, 1 << 40, [b"\x01" * 32],
                       [-1, 1 << 32], [3, True]])
EXTRA = st.one_of(st.none(), st.lists(st.one_of(
    st.none(), st.lists(st.tuples(NAMES, OFFSETS).map(list), max_size=2), NAMES, ODD),
    max_size=4))


@st.composite
def near_batches(draw: st.DrawFn) -> object:
    """Batches as engines send them, a field now and then of an odd type or value."""
    def field(good: st.SearchStrategy) -> Any:
        return draw(st.one_of(good, ODD) if draw(st.integers(0, 9)) == 0 else good)

    events = []
    for _ in range(draw(st.integers(0, 3))):
        tag = field(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]))
        hashes = field(HASHES)
        stored = {"block_hashes": hashes, "parent_block_hash": field(
            st.one_of(st.none(), st.integers(-(1 << 63), (1 << 64) - 1))),
            "token_ids": field(st.lists(TOKENS, max_size=40)),
            "block_size": field(st.sampled_from([4, 16, 0, 1 << 17])), "lora_id": None,
            "medium": field(st.sampled_from(["GPU", "CPU"])), "lora_name": field(st.none()),
            "extra_keys": field(EXTRA)}
        as_map = draw(st.booleans())
        if tag == "BlockStored":
            ev: Any = ({"type": tag, **stored} if as_map else [tag, *stored.values()])
        elif tag == "BlockRemoved":
            ev = {"type": tag, "block_hashes": hashes} if as_map else [tag, hashes, "GPU"]
        else:
            ev = {"type": tag} if as_map else [tag]
        if draw(st.integers(0, 9)) == 0:  # a field missing
            ev = {k: v for k, v in list(ev.items())[:-2]} if as_map else ev[:3]
        events.append(ev)
    return [field(st.floats(0, 2e9)), events, field(st.one_of(st.none(), st.integers(0, 8)))]


@SETTINGS
@given(batch=st.one_of(near_batches(), kv_batches()), seq=st.integers(0, 1 << 40))
def test_fast_batch_equals_the_generic_way(batch, seq):
    """Engine-shaped batches with odd fields, and the fuzz suite's: any batch the fast way
    takes gives the generic way's events, with no error."""
    try:
        payload = ENC.encode(batch)
    except OverflowError:  # not a msgpack value
        assume(False)
    got = fast_batch(payload, "w", seq)
    if got is None:
        return
    errors: dict[str, int] = {}
    ts, rank, events = normalize_batch(decode_payload(payload), "w", seq, 0, errors)
    assert not errors
    assert (got[0], got[1], comparable(got[2])) == (ts, rank, comparable(events))


def test_fast_batch_takes_every_batch_of_the_realistic_mix():
    """vLLM map events, legacy/SGLang array events with signed hashes, images by extra_keys."""
    fill, timed, _ = Mix(2_000, seed=5).payloads(300)
    for seq, payload in enumerate(fill + timed):
        got = fast_batch(payload, "w", seq)
        assert got is not None
        ts, rank, events = normalize_batch(decode_payload(payload), "w", seq)
        assert (got[0], got[1], comparable(got[2])) == (ts, rank, comparable(events))


def index_state(index: ResidentIndex) -> dict[Any, Any]:
    return {key: (dict(r.blocks), dict(r.block_images), dict(r.image_blocks), r.stored,
                  r.removed, r.removed_unknown) for key, r in index.workers.items()}


def ingest_all(payloads: list[bytes]) -> tuple[KVIngest, list[list[Any]]]:
    ingest = KVIngest()
    keys = []
    for seq, payload in enumerate(payloads):
        events = ingest.ingest("w", seq, payload)
        keys.append([(ev.kind, getattr(ev, "keys", None), getattr(ev, "shapes", None))
                     for ev in events])
    return ingest, keys


@needs_native
def test_compiled_index_bookkeeping_equals_python():
    """The same streams (stores, removals of known and unknown blocks, images named by
    extra_keys and by pad values) leave the same index and the same keys either way."""
    fill, timed, _ = Mix(3_000, seed=11).payloads(1_500)
    extra = [ENC.encode([1.0, [["BlockStored", [5, 6], None, [1_000_007] * 16 + [3] * 16, 16],
                               ["BlockRemoved", [5, 5, 99, 6]]], 0])]
    payloads = fill + timed + extra
    fast, fast_keys = ingest_all(payloads)
    with python_only():
        slow, slow_keys = ingest_all(payloads)
    assert fast_keys == slow_keys
    assert index_state(fast.index) == index_state(slow.index)
    assert not fast.errors and not slow.errors


@needs_native
@SETTINGS
@given(ops=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 12), min_size=1,
                                                     max_size=4), REFS), max_size=12))
def test_compiled_removals_and_images_equal_python(ops):
    """Random stores (with images) and removals of overlapping block sets."""
    same_index_both_ways([(store, [(h, refs) for h in hashes]) for store, hashes, refs in ops])


def same_index_both_ways(ops: list[tuple[bool, list[tuple[int, Any]]]]) -> None:
    """Stores (True) and removals of (hash, that block's image refs) give the same keys and
    index compiled and in Python."""
    batches = []
    for store, blocks in ops:
        hashes = [h for h, _ in blocks]
        if store:
            ev = ["BlockStored", hashes, None, [7] * 4 * len(hashes), 4, None, None, None,
                  [[list(r) for r in refs] if refs else None for _, refs in blocks]]
        else:
            ev = ["BlockRemoved", hashes]
        batches.append(ENC.encode([1.0, [ev], 0]))
    fast, fast_keys = ingest_all(batches)
    with python_only():
        slow, slow_keys = ingest_all(batches)
    assert fast_keys == slow_keys
    assert index_state(fast.index) == index_state(slow.index)
    assert fast.errors == slow.errors


def _wide(v: int, code: int) -> bytes:
    """v as msgpack under one type byte, wider than msgspec would write it (engines may)."""
    width = 1 << ((code - 0xcc) & 3)
    return bytes([code]) + (v % (1 << 8 * width)).to_bytes(width, "big")


# (value, its encoding): minimal forms, non-minimal unsigned and signed ones, and values no
# token id can take (negative, 2^32 and up, nil, a float).
_ENCODED = st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1).map(lambda v: ENC.encode(v)),
    st.tuples(st.integers(0, 255), st.sampled_from([0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2,
                                                    0xd3])).map(lambda t: _wide(*t)),
    st.tuples(st.sampled_from([(1 << 32) - 1, 1 << 32, (1 << 63) - 1, 151655, 65535, 65536]),
              st.sampled_from([0xce, 0xcf, 0xd2, 0xd3])).map(lambda t: _wide(*t)),
    st.sampled_from([b"\xc0", b"\xca\x00\x00\x00\x00", b"\xff", b"\xe0"]))


@needs_native
@SETTINGS
@given(items=st.lists(_ENCODED, max_size=40), cut=st.integers(0, 3))
def test_token_ids_of_every_int_encoding_read_alike(items, cut):
    """The compiled reader of token ids (``mmlens/native/msgpack_ints.h``: a branch-free read
    where 9 bytes are left) gives msgspec's ids for any mix of int encodings and widths,
    non-minimal ones too, and None for any value that is not an id or bytes cut short."""
    body = b"".join(items)
    raw = msgspec.Raw((b"\xdc" + len(items).to_bytes(2, "big") + body)[:3 + len(body) - cut
                                                                       if cut else None])
    fast = tokens_of(raw)
    with python_only():
        slow = tokens_of(raw)
    assert fast == slow


@dataclasses.dataclass(slots=True)
class _Stored:
    """A stored event of a class of its own (the fields apply_events reads and writes)."""

    worker: str
    rank: int
    seq: int
    block_hashes: list
    parent: Any
    token_ids: Any
    block_size: int
    images: Any = None
    kind: str = "stored"
    keys: Any = None
    shapes: Any = None


def _apply(events: list[Any]) -> kv_index.WorkerResidency:
    res = kv_index.WorkerResidency()
    native.apply_events(res, events, 0, content_keys.pad_images, kv_index._u32_array)
    return res


@needs_native
def test_event_attributes_follow_their_class_as_it_is_now():
    """The compiled index reads and writes event attributes at their slots, remembered per
    type (``mmlens/native/slot_attrs.h``): a class changed since, or an attribute that is
    not a plain slot (a property of a subclass), is looked up again, not written past."""
    tokens = array("I", range(32))
    first = _Stored("w", 0, 1, [1, 2], None, tokens, 16)
    _apply([first])
    assert first.keys is not None and len(first.keys) == 2
    seen = []

    class Watched(_Stored):
        __slots__ = ()

        @property
        def keys(self) -> Any:
            return seen[-1] if seen else None

        @keys.setter
        def keys(self, value: Any) -> None:
            seen.append(value)

    watched = Watched("w", 0, 2, [3, 4], None, tokens, 16)
    seen.clear()  # what its __init__ set
    _apply([watched, _Stored("w", 0, 3, [5], None, tokens[:16], 16)])
    assert seen == [first.keys]  # the same tokens from the root: the same keys
    saved, shapes = _Stored.shapes, list(first.shapes)
    try:
        _Stored.shapes = property(lambda self: "read", lambda self, v: seen.append(("s", v)))
        _apply([_Stored("w", 0, 4, [6], None, tokens[:16], 16)])
        assert seen[-1] == ("s", shapes[:1])
    finally:
        _Stored.shapes = saved
    again = _Stored("w", 0, 5, [7, 8], None, tokens, 16)
    _apply([again])
    assert again.shapes == first.shapes and again.keys == first.keys


@needs_native
@SETTINGS
@given(ops=st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 12), REFS),
                                                     min_size=1, max_size=6)), max_size=12))
def test_compiled_image_counts_equal_python_block_by_block(ops):
    """Stores whose blocks each name their own images (runs of one image, images changing
    within an event, blocks stored again) and removals: the compiled index counts each
    image's resident blocks as the Python one does."""
    same_index_both_ways(ops)
