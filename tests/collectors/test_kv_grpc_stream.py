"""The gRPC KV-event stream subscriber against a scripted SubscribeKvEvents servicer on
loopback: a gap is filled by re-subscribing at the missing sequence, a restarted publisher
(sequence back below the cursor) empties the worker's blocks and is re-read from its start,
and an endpoint that is Dynamo's event plane or a vLLM publisher says so."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import msgspec
import pytest
from mmlens.collectors.kv_grpc import GrpcKvCollector, grpc_target
from mmlens.collectors.kv_plane import EventPlaneCollector, plane_transport
from mmlens.collectors.kv_subscriber import KVEventCollector
from smg_grpc_proto.generated import common_pb2

from mmlens.ingest.kv_index import ResidentIndex
from tests.fixtures_path import CAPTURES
from tests.live_support import wait_until

METHOD = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"


def _batch(seq: int, hashes: list[int]) -> common_pb2.KvEventBatch:
    blocks = [common_pb2.KvBlock(block_hash=h, token_ids=[h] * 4, block_size=4) for h in hashes]
    return common_pb2.KvEventBatch(sequence_number=seq, timestamp=time.time(), dp_rank=0,
                                   events=[common_pb2.KvCacheEvent(
                                       stored=common_pb2.KvBlocksStored(blocks=blocks))])


class Script:
    """A publisher's buffer and what each new subscription is shown."""

    def __init__(self) -> None:
        self.buffer: dict[int, common_pb2.KvEventBatch] = {}
        self.skip: set[int] = set()  # sequences the live stream leaves out (a lost batch)
        self.live: list[common_pb2.KvEventBatch] = []  # sent once, after the buffer
        self.starts: list[int] = []
        self.hold = threading.Event()  # set: every stream ends (the server is going away)
        self.generation = 0  # bumped: the streams open now end (a publisher restart)

    def serve(self, request: common_pb2.SubscribeKvEventsRequest, context: object,
              ) -> Iterator[common_pb2.KvEventBatch]:
        self.starts.append(request.start_sequence_number)
        generation = self.generation
        yield common_pb2.KvEventBatch(sequence_number=0, timestamp=time.time(),
                                      load=common_pb2.EngineLoad(load_only=True))
        replaying = len(self.starts) > 1
        for seq in sorted(self.buffer):
            if seq >= max(request.start_sequence_number, 1) and (
                    replaying or seq not in self.skip):
                yield self.buffer[seq]
        while self.live:
            yield self.live.pop(0)
        while not self.hold.wait(0.05) and generation == self.generation:
            pass


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler("vllm.grpc.engine.VllmEngine", {
        "SubscribeKvEvents": grpc.unary_stream_rpc_method_handler(
            script.serve,
            request_deserializer=common_pb2.SubscribeKvEventsRequest.FromString,
            response_serializer=common_pb2.KvEventBatch.SerializeToString)})
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield f"grpc://127.0.0.1:{port}", script
    finally:
        script.hold.set()
        srv.stop(0)



def test_gap_is_filled_by_resubscribing(server: tuple[str, Script]) -> None:
    url, script = server
    script.buffer = {s: _batch(s, [s * 10]) for s in (1, 2, 3, 4)}
    script.skip = {3}
    index, stored = ResidentIndex(), []
    kv = GrpcKvCollector(index, threading.Lock(), stored.extend)
    stream = kv.add_worker("w1", url)
    kv.start()
    try:
        wait_until(lambda: stream.cursor == 4)
    finally:
        kv.close()
    assert script.starts[:2] == [1, 3]  # first contact from 1, then back to the gap
    assert sorted(h for e in stored for h in e.block_hashes) == [10, 20, 30, 40]
    assert stream.health.counters["gaps"] == 1 and not stream.health.errors


def test_restarted_publisher_is_reread_from_its_start(server: tuple[str, Script]) -> None:
    url, script = server
    script.buffer = {s: _batch(s, [s]) for s in (1, 2, 3)}
    index = ResidentIndex()
    kv = GrpcKvCollector(index, threading.Lock())
    stream = kv.add_worker("w1", url)
    kv.start()
    try:
        wait_until(lambda: stream.cursor == 3)
        # A new process: its own batches 1..3; its next live batch is 3, below our cursor + 1.
        script.buffer = {s: _batch(s, [100 + s]) for s in (1, 2, 3)}
        script.live = [script.buffer[3]]
        script.generation += 1  # end the stream: the subscriber reconnects at 4
        wait_until(lambda: stream.health.counters.get("restarts", 0) >= 1 and stream.cursor == 3)
    finally:
        script.hold.set()
        kv.close()
    assert script.starts[-1] == 1  # re-read from the new publisher's first batch
    assert set(index.workers[("w1", 0)].blocks) == {101, 102, 103}  # the old blocks are gone


def test_grpc_target_refuses_other_schemes() -> None:
    assert grpc_target("grpc://127.0.0.1:50051") == "127.0.0.1:50051"
    with pytest.raises(ValueError, match="grpc://host:port"):
        grpc_target("tcp://127.0.0.1:5557")
    assert plane_transport("nats://127.0.0.1:4222") == "nats"
    with pytest.raises(ValueError, match="event_plane"):
        plane_transport("http://127.0.0.1:8000")


def test_wrong_protocol_is_named_on_both_sides() -> None:
    plane = json.loads((CAPTURES.parent / "dynamo_event_plane_1.6.1.json").read_text())
    dynamo_frames = [bytes.fromhex(f) for f in plane["zmq_broker_frames"][0]]
    kv = KVEventCollector()
    ep = kv.add_endpoint("w1", 0, "tcp://127.0.0.1:1")
    try:
        kv.handle(ep, dynamo_frames)
    finally:
        kv.close()
    assert "Dynamo's event plane" in (ep.health.last_error or "")
    assert ep.health.errors == {"wrong_protocol": 1}

    got: list[object] = []
    collector = EventPlaneCollector("dyn", "tcp://127.0.0.1:1", got.extend)
    vllm = [b"kv-events", (3).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, [], 0])]
    collector.handle_frames(vllm)
    assert "vLLM/SGLang ZMQ" in (collector.health.last_error or "")
    collector.handle_frames(dynamo_frames)
    assert got and collector.health.counters["events"] == 1
