"""KV-event decoding, normalization and the resident index, on payloads built with the
engines' own msgspec struct shapes (array-like legacy, tagged maps, positional or map batch)."""

from __future__ import annotations

import msgspec
import pytest

from mmlens.ingest.kv_events import (
    KVEventError,
    decode_payload,
    image_refs,
    normalize_batch,
    parse_seq,
)
from mmlens.ingest.kv_index import KVIngest, ResidentIndex
from mmlens.ingest.kv_stream import StreamState, same_incarnation
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored, ImageRef

ENC = msgspec.msgpack.Encoder()


# Struct shapes as the engines declare them (field order matters for array encoding): each
# shape's fields once, then the legacy array-like and the tagged-map generations.
class _StoredFields(msgspec.Struct):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None


class _RemovedFields(msgspec.Struct):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _BatchFields(msgspec.Struct):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class LegacyBlockStored(_StoredFields, tag="BlockStored", array_like=True, omit_defaults=True):
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class LegacyBlockRemoved(_RemovedFields, tag="BlockRemoved", array_like=True,
                         omit_defaults=True):
    pass


class LegacyAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True,
                             omit_defaults=True):
    pass


class MapBlockStored(_StoredFields, tag="BlockStored", omit_defaults=True):
    pass


class MapBlockRemoved(_RemovedFields, tag="BlockRemoved", omit_defaults=True):
    pass


class MapAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True):
    pass


class ArrayBatch(_BatchFields, array_like=True, omit_defaults=True):
    pass


class MapBatch(_BatchFields, omit_defaults=True):
    pass


BIG = 15760518052499183552  # > 2^63: the vLLM v0.26.0 sample hash, unsigned
IMG = "ab12" * 16


def _events(stored, removed, cleared):
    return [
        stored([123, BIG], None, list(range(32)), 16, None, "GPU", None,
               [((IMG, 4),), ((IMG, -12),)], 0),
        removed([123], "GPU"),
        cleared(),
    ]


ENCODINGS = {
    "array/array": lambda: ENC.encode(ArrayBatch(1.5, _events(
        LegacyBlockStored, LegacyBlockRemoved, LegacyAllBlocksCleared), 0)),
    "map events, array batch": lambda: ENC.encode(ArrayBatch(1.5, _events(
        MapBlockStored, MapBlockRemoved, MapAllBlocksCleared), 0)),
    "map/map": lambda: ENC.encode(MapBatch(1.5, _events(
        MapBlockStored, MapBlockRemoved, MapAllBlocksCleared), 0)),
}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_all_wire_encodings_normalize_alike(encoding: str) -> None:
    ts, rank, events = normalize_batch(decode_payload(ENCODINGS[encoding]()), "w1", seq=7)
    assert (ts, rank) == (1.5, 0)
    stored, removed, cleared = events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [123, BIG]
    assert stored.parent is None and stored.block_size == 16 and stored.medium == "GPU"
    assert stored.token_ids == list(range(32))
    assert stored.images == [(ImageRef(IMG, 4),), (ImageRef(IMG, -12),)]
    assert (stored.worker, stored.rank, stored.seq) == ("w1", 0, 7)
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [123]
    assert isinstance(cleared, AllBlocksCleared)


def test_doc_example_array_encoding_byte_for_byte() -> None:
    # The reference's msgspec 0.22 output for the array/array generation.
    obj = [1.5, [["BlockStored", [123], None, [1, 2], 2, None, "GPU", None, [[["ab12", 0]]], 0,
                  None, None], ["BlockRemoved", [123], "GPU", None], ["AllBlocksCleared"]], 0]
    _, _, events = normalize_batch(decode_payload(ENC.encode(obj)), "w", 0)
    assert [e.kind for e in events] == ["stored", "removed", "cleared"]
    # "ab12" is shorter than a hash but sits in an (identifier, offset) pair: an image ref.
    assert events[0].images == [(ImageRef("ab12", 0),)]


def test_kthena_v026_sample_map_events_positional_batch() -> None:
    obj = [1789095808.83, [{"type": "BlockStored", "block_hashes": [BIG],
                            "parent_block_hash": None, "token_ids": [151644, 872, 198] + [0] * 13,
                            "block_size": 16, "lora_id": None, "medium": "GPU",
                            "lora_name": None, "extra_keys": [None], "group_idx": 0,
                            "kv_cache_spec_kind": "full_attention"}], 0]
    _, _, (ev,) = normalize_batch(decode_payload(ENC.encode(obj)), "w", 0)
    assert ev.block_hashes == [BIG] and ev.images is None


def test_sglang_signed_hashes_become_unsigned_and_metadata_is_ignored() -> None:
    signed = -(1 << 63) + 5
    obj = [2.0, [["BlockStored", [signed, -1], signed, list(range(8)), 4, None, "GPU",
                  {"cache_salt": "s"}]], 3]  # BlockStoredWithMetadata: dict at lora_name's slot
    _, rank, (ev,) = normalize_batch(decode_payload(ENC.encode(obj)), "sg", 0)
    assert rank == 3
    assert ev.block_hashes == [(1 << 63) + 5, (1 << 64) - 1]
    assert ev.parent == (1 << 63) + 5 and ev.lora_name is None


def test_bytes_hashes_are_kept_as_hex() -> None:
    digest = bytes(range(32))
    obj = {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [digest],
                                  "parent_block_hash": digest, "token_ids": [1] * 16,
                                  "block_size": 16}], "data_parallel_rank": 1}
    _, rank, (ev,) = normalize_batch(decode_payload(ENC.encode(obj)), "w", 0)
    assert ev.block_hashes == [digest.hex()] and ev.parent == digest.hex() and rank == 1


@pytest.mark.parametrize(("entry", "expected"), [
    pytest.param(None, None, id="none"),
    pytest.param([[IMG, -28]], (ImageRef(IMG, -28),), id="vllm-main-pair"),
    pytest.param([IMG], (ImageRef(IMG, None),), id="old-identifier"),
    pytest.param(["my-lora"], None, id="lora-name-is-not-an-image"),
    pytest.param(["my-lora", [IMG, 0]], (ImageRef(IMG, 0),), id="lora-then-image"),
    pytest.param(["dynamo-cache-salt:ns"], None, id="salt"),
])
def test_image_refs_from_extra_keys(entry, expected) -> None:
    assert image_refs(entry) == expected


@pytest.mark.parametrize(("payload", "kind"), [
    pytest.param(b"\xc1\xff\x00", "undecodable_msgpack", id="undecodable"),
    pytest.param(ENC.encode([1.0]), "bad_batch", id="batch-without-events"),
    pytest.param(ENC.encode("hello"), "bad_batch", id="batch-is-a-string"),
    pytest.param(ENC.encode([-5.0, [], 0]), "bad_number", id="negative-ts"),
    pytest.param(ENC.encode([1.0, [], -1]), "bad_number", id="negative-rank"),
])
def test_bad_batches_are_counted(payload: bytes, kind: str) -> None:
    ingest = KVIngest()
    assert ingest.ingest("w", 0, payload) == []
    assert ingest.errors == {kind: 1}


@pytest.mark.parametrize(("event", "kind"), [
    pytest.param(["BlockMoved", [1]], "unknown_event_tag", id="unknown-tag-array"),
    pytest.param({"type": "Evicted"}, "unknown_event_tag", id="unknown-tag-map"),
    pytest.param({"block_hashes": [1]}, "unknown_event_tag", id="map-without-tag"),
    pytest.param(["BlockStored", [1], None, [-3] * 16, 16], "bad_number", id="negative-token"),
    pytest.param(["BlockStored", [1], None, [1 << 40] * 16, 16], "bad_number",
                 id="oversize-token"),
    pytest.param(["BlockStored", [1], None, [1] * 16, -16], "bad_number", id="negative-block"),
    pytest.param(["BlockStored", [1], None, [1] * 16, 1 << 40], "bad_number",
                 id="oversize-block"),
    pytest.param(["BlockStored", [1], None, ["x"] * 16, 16], "bad_event", id="string-token"),
    pytest.param(["BlockStored", [1.5], None, [1] * 16, 16], "bad_event", id="float-hash"),
    pytest.param(["BlockStored", [1]], "bad_event", id="truncated-event"),
    pytest.param(42, "bad_event", id="event-is-int"),
])
def test_bad_events_are_counted_and_skipped(event, kind: str) -> None:
    good = ["BlockStored", [9], None, [1] * 16, 16]
    ingest = KVIngest()
    events = ingest.ingest("w", 0, ENC.encode([1.0, [event, good], 0]))
    assert [e.block_hashes for e in events] == [[9]]
    assert ingest.errors == {kind: 1}
    assert ingest.index.summary()["w#0"]["resident_blocks"] == 1


def test_oversize_hash_from_python_caller() -> None:
    with pytest.raises(KVEventError) as exc:
        normalize_batch([1.0, [["BlockRemoved", [1 << 70]]]], "w", 0)
    assert exc.value.kind == "oversize_number"


def test_truncated_sequence_frame() -> None:
    assert parse_seq((5).to_bytes(8, "big")) == 5
    with pytest.raises(KVEventError) as exc:
        parse_seq(b"\x00\x01")
    assert exc.value.kind == "truncated_frame"


def test_stream_state_verdicts_and_published_count() -> None:
    st = StreamState()
    assert st.classify(0) == "first"
    st.applied(0, 1.0)
    assert st.classify(1) == "ok"
    st.applied(1, 1.1)
    assert st.classify(5) == "gap"
    st.skip_to(4)  # 2..4 never came back
    st.applied(5, 1.5)
    assert (st.published, st.received, st.lost) == (6, 3, 3)
    # Any number at or below the last one is a new incarnation, not only 0.
    assert st.classify(3) == "restart" and st.classify(5) == "restart"
    st.restart()
    st.applied(3, 9.0)
    assert (st.published, st.restarts) == (10, 1)
    st.reconnected = True
    assert st.classify(4) == "resync"
    st.applied(4, 9.1)
    assert not st.reconnected and st.classify(5) == "ok"


def test_same_incarnation_compares_the_batch_time_at_our_last_number() -> None:
    st = StreamState()
    st.applied(7, 70.0)
    assert same_incarnation(st, {6: 60.0, 7: 70.0})
    assert not same_incarnation(st, {7: 99.0})  # restarted and got past 7 while we were away
    assert not same_incarnation(st, {3: 30.0})  # the buffer ends before our last number
    assert same_incarnation(st, {9: 90.0})  # rolled over: a gap, not provably a restart
    assert not same_incarnation(st, {})


def test_sequence_numbers_beyond_sqlite_integers_are_refused() -> None:
    with pytest.raises(KVEventError, match="oversize_number"):
        parse_seq((1 << 63).to_bytes(8, "big"))
    assert parse_seq(((1 << 63) - 1).to_bytes(8, "big")) == (1 << 63) - 1


def test_deeply_nested_payload_is_counted_not_raised() -> None:
    ingest = KVIngest()
    assert ingest.ingest("w", 0, b"\x91" * 100_000 + b"\x00") == []
    assert ingest.errors == {"too_deep": 1}


def _stored(hashes, parent=None, images=None, worker="w", rank=0):
    return BlockStored(worker, rank, 0, 0.0, hashes, parent, [0] * 16 * len(hashes), 16,
                       images=images)


def test_resident_index_parents_images_and_removal() -> None:
    idx = ResidentIndex()
    a, b = ImageRef("img-a" * 4, 4), ImageRef("img-b" * 4, 0)
    idx.apply([_stored([1, 2, 3], images=[(a,), (a,), None]), _stored([4], parent=3,
                                                                      images=[(a, b)])])
    res = idx.residency("w", 0)
    assert set(res.blocks) == {1, 2, 3, 4}
    # The second event continues the first one's content chain; an unknown parent cannot.
    assert None not in res.blocks.values()
    orphan = _stored([5], parent=77)
    idx.apply([orphan])
    assert res.blocks[5] is None and orphan.keys is None
    idx.apply([BlockRemoved("w", 0, 1, 0.0, [5])])
    assert res.image_blocks == {a.identifier: 3, b.identifier: 1}
    idx.apply([BlockRemoved("w", 0, 1, 0.0, [2, 4, 99])])
    assert set(res.blocks) == {1, 3}
    assert res.image_blocks == {a.identifier: 1}
    assert (res.removed, res.removed_unknown) == (3, 1)
    idx.apply([_stored([7], worker="w", rank=1)])
    idx.apply([AllBlocksCleared("w", 0, 2, 0.0)])
    summary = idx.summary()
    assert summary["w#0"]["resident_blocks"] == 0 and summary["w#0"]["clears"] == 1
    assert summary["w#1"]["resident_blocks"] == 1


def test_restored_block_does_not_double_count_images() -> None:
    idx = ResidentIndex()
    a = ImageRef("f" * 64, 0)
    idx.apply([_stored([1], images=[(a,)]), _stored([1], images=[(a,)])])
    assert idx.residency("w", 0).image_blocks == {a.identifier: 1}


def test_restart_empties_the_worker() -> None:
    idx = ResidentIndex()
    idx.apply([_stored([1, 2])])
    idx.restart("w", 0)
    assert idx.summary()["w#0"]["resident_blocks"] == 0
    assert idx.summary()["w#0"]["restarts"] == 1


def test_sglang_map_batch_with_attn_dp_rank() -> None:
    obj = {"ts": 3.0, "events": [{"type": "BlockRemoved", "block_hashes": [-2]}],
           "attn_dp_rank": 2}
    ts, rank, (ev,) = normalize_batch(decode_payload(ENC.encode(obj)), "sg", 0)
    assert (ts, rank, ev.block_hashes) == (3.0, 2, [(1 << 64) - 2])


def test_truncated_payload_is_undecodable() -> None:
    payload = ENCODINGS["map/map"]()
    ingest = KVIngest()
    assert ingest.ingest("w", 0, payload[: len(payload) // 2]) == []
    assert ingest.errors == {"undecodable_msgpack": 1}
