"""KV events over SMG's gRPC stream and Dynamo's event plane: decoding real wire bytes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from smg_grpc_proto.generated import common_pb2

from mmlens.ingest.kv_dynamo_plane import (
    decode_broker_frames,
    decode_nats,
    kv_subject,
    looks_like_dynamo_plane,
    router_events,
)
from mmlens.ingest.kv_events import KVEventError
from mmlens.ingest.kv_grpc import batch_events
from mmlens.ingest.kv_index import ResidentIndex
from tests.fixtures_path import CAPTURES

FIXTURES = CAPTURES.parent

PLANE = json.loads((FIXTURES / "dynamo_event_plane_1.6.1.json").read_text())


def _frames(i: int) -> list[bytes]:
    return [bytes.fromhex(f) for f in PLANE["zmq_broker_frames"][i]]


def test_dynamo_broker_frames_decode_to_router_events() -> None:
    msg = decode_broker_frames(_frames(0))
    assert msg.is_kv
    assert msg.subject == "namespace.dynamo.component.backend.endpoint.generate.kv-events"
    events = router_events(msg)
    assert [e.kind for e in events] == ["stored"]
    ev = events[0]
    assert ev.worker.isdigit() and ev.seq == msg.sequence == 0
    assert len(ev.block_hashes) == 1 and all(0 <= h < 1 << 64 for h in ev.block_hashes)
    assert ev.block_size == 0 and ev.token_ids == []  # the plane carries neither


def test_non_kv_topics_are_told_apart() -> None:
    msg = decode_broker_frames(_frames(1))
    assert not msg.is_kv


def test_nats_messages_decode_with_chained_parents() -> None:
    msgs = [decode_nats(m["subject"], bytes.fromhex(m["data"])) for m in PLANE["nats_messages"]]
    kv = [m for m in msgs if m.is_kv]
    assert [m.sequence for m in kv] == [0, 1]
    first, second = (router_events(m)[0] for m in kv)
    assert second.parent == first.block_hashes[0]  # the two prompts share their first block
    index = ResidentIndex()
    index.apply([first, second])
    assert index.summary()[f"{first.worker}#0"]["resident_blocks"] == 3


def test_a_vllm_subscriber_recognises_dynamo_frames() -> None:
    assert looks_like_dynamo_plane(_frames(0))
    vllm = [b"kv-events", (7).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, [], 0])]
    assert not looks_like_dynamo_plane(vllm)


def test_broker_body_length_and_header_are_checked() -> None:
    frames = _frames(0)
    with pytest.raises(KVEventError, match="truncated_frame"):
        decode_broker_frames(frames[:3])
    with pytest.raises(KVEventError, match="truncated_frame"):
        decode_broker_frames([*frames[:3], frames[3][:-1]])
    with pytest.raises(KVEventError, match="disagree"):
        decode_broker_frames([frames[0], frames[1], (9).to_bytes(8, "big"), frames[3]])


def test_bad_router_events_are_counted_not_raised() -> None:
    msg = decode_nats("x.kv-events", msgspec.msgpack.encode({
        "publisher_id": 1, "sequence": 3, "published_at": 5000,
        "payload": msgspec.msgpack.encode([
            {"worker_id": 7, "event": {"event_id": 1, "data": {"removed": {
                "block_hashes": [-1]}}, "dp_rank": 0}},
            {"worker_id": "x", "event": {}},
            {"worker_id": 7, "event": {"data": "cleared"}},
            {"worker_id": 7, "event": {"data": {"moved": {}}}}])}))
    errors: dict[str, int] = {}
    events = router_events(msg, errors)
    assert [e.kind for e in events] == ["removed", "cleared"]
    assert events[0].block_hashes == [(1 << 64) - 1] and events[0].ts == 5.0
    assert errors == {"bad_event": 1, "unknown_event_tag": 1}


def test_kv_subject_wildcards() -> None:
    assert kv_subject() == "namespace.*.component.*.endpoint.*.kv-events"
    assert kv_subject("dyn") == "namespace.dyn.component.*.endpoint.*.kv-events"


def _grpc_batch(**kw: Any) -> common_pb2.KvEventBatch:
    return common_pb2.KvEventBatch(**kw)


def test_grpc_stored_batch_with_image_keys_and_signed_hashes() -> None:
    blocks = [common_pb2.KvBlock(block_hash=-5, token_ids=list(range(16)), block_size=16,
                                 extra_keys=[common_pb2.KvBlockExtraKey(
                                     multimodal=common_pb2.KvMultimodalKey(
                                         identifier="ab" * 32, offset=-12))]),
              common_pb2.KvBlock(block_hash=9, token_ids=list(range(16, 32)), block_size=16)]
    stored = common_pb2.KvBlocksStored(blocks=blocks, parent_block_hash=-2, medium="GPU")
    batch = batch_events(_grpc_batch(sequence_number=4, timestamp=12.5, dp_rank=0, events=[
        common_pb2.KvCacheEvent(event_id=1, stored=stored),
        common_pb2.KvCacheEvent(event_id=2, removed=common_pb2.KvBlocksRemoved(
            block_hashes=[-5])),
        common_pb2.KvCacheEvent(event_id=3, cleared=common_pb2.KvCacheCleared())]), "w1")
    assert (batch.seq, batch.rank, batch.load_only) == (4, 0, False)
    ev = batch.events[0]
    assert ev.block_hashes == [(1 << 64) - 5, 9] and ev.parent == (1 << 64) - 2
    assert ev.token_ids == list(range(32)) and ev.block_size == 16 and ev.medium == "GPU"
    assert ev.images == [(("ab" * 32, -12),), None]
    assert [e.kind for e in batch.events] == ["stored", "removed", "cleared"]
    assert [e.idx for e in batch.events] == [0, 1, 2]  # distinct store keys within a batch


def test_grpc_heartbeat_and_bad_block_size() -> None:
    beat = batch_events(_grpc_batch(sequence_number=7, timestamp=1.0,
                                    load=common_pb2.EngineLoad(load_only=True)), "w1")
    assert beat.load_only and beat.events == [] and beat.seq == 7
    bad = _grpc_batch(sequence_number=8, timestamp=1.0, events=[common_pb2.KvCacheEvent(
        stored=common_pb2.KvBlocksStored(blocks=[common_pb2.KvBlock(block_hash=1,
                                                                    block_size=0)]))])
    errors: dict[str, int] = {}
    assert batch_events(bad, "w1", errors).events == [] and errors == {"bad_number": 1}
