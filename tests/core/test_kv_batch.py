"""The compiled KV batch reader (``mmlens/ingest/_kvbatch.c``) gives exactly the events of
msgspec's typed decode (``kv_fast.typed_batch``, the reference) for every batch it takes, takes
the layouts engines send, and leaves any other batch (None) to the reference."""

from __future__ import annotations

import dataclasses
import random
import sys
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mmlens.ingest import kv_fast
from mmlens.ingest.kv_fast import typed_batch
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored
from tests.core.test_kv_native import SETTINGS, near_batches
from tests.fuzz.strategies import kv_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kv_ingest import Mix

native = kv_fast.batch_native
pytestmark = pytest.mark.skipif(native is None, reason="compiled batch reader not built")
ENC = msgspec.msgpack.Encoder()


def compiled(payload: bytes, seq: int = 3, default_rank: int = 0) -> Any:
    return native(payload, "w", seq, default_rank, BlockStored, BlockRemoved, AllBlocksCleared,
                  array)


def comparable(got: Any) -> Any:
    if got is None:
        return None
    out = []
    for ev in got[2]:
        d = dataclasses.asdict(ev)
        if "token_ids" in d:
            assert type(d["token_ids"]) is array and d["token_ids"].typecode == "I"
            d["token_ids"] = list(d["token_ids"])
        d["type"] = type(ev).__name__
        out.append(d)
    return got[0], type(got[0]), got[1], out


def same_or_declined(payload: bytes, seq: int = 3, default_rank: int = 0) -> bool:
    """True when the compiled reader took the batch (and gave the reference's events)."""
    got = compiled(payload, seq, default_rank)
    if got is None:
        return False
    assert comparable(got) == comparable(typed_batch(payload, "w", seq, default_rank))
    return True


@SETTINGS
@given(batch=st.one_of(near_batches(), kv_batches()), seq=st.integers(0, 1 << 40),
       rank=st.integers(0, 9))
def test_compiled_batch_equals_the_typed_decode(batch, seq, rank):
    try:
        payload = ENC.encode(batch)
    except OverflowError:
        assume(False)
    same_or_declined(payload, seq, rank)


def test_compiled_batch_takes_every_batch_of_the_realistic_mix():
    fill, timed, _ = Mix(3_000, seed=13).payloads(1_000)
    assert all(same_or_declined(p, seq) for seq, p in enumerate(fill + timed))


def test_fault_injected_bytes_are_read_alike_or_left_to_the_reference():
    """Realistic batches with bytes flipped, cut off, doubled or dropped: whatever the
    compiled reader still takes is the reference's reading of the same bytes."""
    rng = random.Random(29)
    fill, timed, _ = Mix(1_000, seed=17).payloads(400)
    taken = 0
    for payload in fill + timed:
        for _ in range(6):
            b = bytearray(payload)
            i = rng.randrange(len(b))
            op = rng.randrange(4)
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:]
            elif op == 2:
                b[i:i] = b[i:i + rng.randint(1, 9)]
            else:
                del b[i:i + rng.randint(1, 9)]
            taken += same_or_declined(bytes(b))
    assert taken  # a flipped token id is still a batch: some are taken


EVENT = {"type": "BlockStored", "block_hashes": [1, (1 << 64) - 1], "parent_block_hash": 9,
         "token_ids": [5] * 8, "block_size": 4, "medium": "GPU",
         "extra_keys": [None, [["ab" * 32, -3]]]}


@pytest.mark.parametrize("batch", [
    [1.0, [EVENT], 2],
    [7, [EVENT]],  # an int time
    [1.0, [{**EVENT, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}]],
    [1.0, [dict(reversed(list(EVENT.items())))]],  # the tag last
    [1.0, [["BlockStored", [-5, 6], -1, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "CPU", "l", None]]],
    [1.0, [["BlockStored", [1], None, [1] * 4, 4, None, None, None, None, 7, 8]], None, "x"],
    [1.0, [["BlockRemoved", [3, 4]], ["AllBlocksCleared", 5], ["BlockRemoved", [], "GPU", 1]]],
    [1.0, [{"type": "BlockRemoved", "block_hashes": [3]}, {"type": "AllBlocksCleared"}]],
    [1.0, []],
])
def test_engine_layouts_are_taken(batch):
    assert same_or_declined(ENC.encode(batch))


@pytest.mark.parametrize("batch", [
    [1.0, [EVENT, ["BlockRemoved", [3]]]],  # mixed layouts: neither typed decoder takes it
    [True, [EVENT]],
    [1.0, [EVENT], True],
    [1.0, [EVENT], 65536],
    [-1.0, [EVENT]],
    [float("nan"), [EVENT]],
    [1.0, [{**EVENT, "block_size": True}]],
    [1.0, [{**EVENT, "block_size": 0}]],
    [1.0, [{**EVENT, "block_hashes": [1.0]}]],
    [1.0, [{**EVENT, "token_ids": [-1]}]],
    [1.0, [{**EVENT, "token_ids": [1 << 32]}]],
    [1.0, [{**EVENT, "type": "Teleported"}]],
    [1.0, [{k: v for k, v in EVENT.items() if k != "token_ids"}]],
    [1.0, [["BlockStored", [1], None, [1] * 4]]],  # block_size missing
    [1.0],
])
def test_batches_the_reference_refuses_are_refused(batch):
    payload = ENC.encode(batch)
    assert typed_batch(payload, "w", 3) is None
    assert compiled(payload) is None


def test_what_it_does_not_read_is_left_to_the_reference():
    """Forms the reference takes but the compiled reader leaves to it (odd Any fields, a
    non-ASCII image name, a field twice...): None, never another reading."""
    for batch in ([1.0, [{**EVENT, "medium": [1]}]],
                  [1.0, [{**EVENT, "extra_keys": [[["é", 1]]]}]],
                  [1.0, [{**EVENT, "extra_keys": {"a": 1}}]]):
        payload = ENC.encode(batch)
        assert typed_batch(payload, "w", 3) is not None
        assert compiled(payload) is None
    dup = (b"\x92\xcb" + ENC.encode(1.0)[1:] + b"\x91\x83\xa4type\xacBlockRemoved"
           b"\xacblock_hashes\x91\x01\xacblock_hashes\x91\x02")
    assert typed_batch(dup, "w", 3)[2][0].block_hashes == [2]  # msgspec: the last one
    assert compiled(dup) is None
    assert compiled(ENC.encode([1.0, [EVENT]]) + b"\x00") is None


@dataclasses.dataclass(slots=True)
class _Checked:
    """A stored event class whose __post_init__ does work: it must be called, not bypassed."""

    worker: str
    rank: int
    seq: int
    ts: float
    block_hashes: list
    parent: Any
    token_ids: Any
    block_size: int
    medium: Any = None
    lora_name: Any = None
    images: Any = None
    idx: int = 0
    checked: bool = False

    def __post_init__(self) -> None:
        self.checked = True


class _Plain:
    def __init__(self, *args: Any) -> None:
        self.args = args


@dataclasses.dataclass(slots=True)
class _Factory:
    worker: str
    rank: int
    seq: int
    ts: float
    idx: int = 0
    seen: list = dataclasses.field(default_factory=list)


def test_events_built_without_their_init_equal_those_their_class_builds():
    """The reader sets the slots of the dataclass events itself (no __init__ run): every
    field, defaults too, is what calling the class gives."""
    ts = 1_800_000_000.5
    payload = ENC.encode([ts, [["BlockStored", [1, 2], 9, list(range(32)), 16, None, "GPU",
                                None, [[["img", 4]], None]],
                               ["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]], 2])
    _, _, events = compiled(payload)
    stored, removed, cleared = events
    assert stored == BlockStored("w", 2, 3, ts, [1, 2], 9, stored.token_ids, 16, "GPU", None,
                                 [(("img", 4),), None], 0)
    assert (stored.kind, stored.keys, stored.shapes, stored.prompt_end) == (
        "stored", None, None, None)
    assert removed == BlockRemoved("w", 2, 3, ts, [1], "GPU", 1)
    assert cleared == AllBlocksCleared("w", 2, 3, ts, 2)
    stored.keys = [5]  # each event its own object, writable as before
    assert compiled(payload)[2][0].keys is None


def test_event_classes_that_need_their_init_are_called():
    """A class with a __post_init__, a default factory or no dataclass fields at all gets
    its events by being called, as before."""
    ts = 1_800_000_000.5
    payload = ENC.encode([ts, [["BlockStored", [1], None, list(range(16)), 16, None, None,
                                None, None]], 0])
    got = native(payload, "w", 3, 0, _Checked, BlockRemoved, AllBlocksCleared, array)
    assert type(got[2][0]) is _Checked and got[2][0].checked
    got = native(payload, "w", 3, 0, _Plain, BlockRemoved, AllBlocksCleared, array)
    assert got[2][0].args[:4] == ("w", 0, 3, ts)
    cleared = ENC.encode([ts, [["AllBlocksCleared"], ["AllBlocksCleared"]], 0])
    a, b = native(cleared, "w", 3, 0, BlockStored, BlockRemoved, _Factory, array)[2]
    assert a.seen == [] and a.seen is not b.seen
    # and the real classes again after them
    assert same_or_declined(payload)
