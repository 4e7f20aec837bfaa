"""The ZMQ KV-event collector against real PUB/ROUTER sockets on 127.0.0.1."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from mmlens.collectors.kv_subscriber import KVEventCollector

from mmlens.records import KVEvent
from tests.collectors.zmq_publisher import Publisher
from tests.live_support import free_port_base, loopback_endpoints

IMG = "d" * 64


def stored(hashes, parent=None, image=False, as_map=True):
    extra = [[[IMG, 4 - 16 * i]] for i in range(len(hashes))] if image else None
    if as_map:
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": [7] * 16 * len(hashes), "block_size": 16, "medium": "GPU",
                "extra_keys": extra}
    return ["BlockStored", hashes, parent, [7] * 16 * len(hashes), 16, None, "GPU", None, extra]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def _pump(col: KVEventCollector, until, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until():
        col.poll(50)
    assert until(), "condition not reached in time"


def _connect(col, pub, ctx, endpoint: str) -> None:
    """Slow-joiner: publish probes until the SUB side sees traffic, then reset."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pub.send_frames([pub.topic, (0).to_bytes(8, "big"), b""])
        if col.poll(50):
            break
    col.reset_streams()


def test_stream_gap_replay_restart_and_bad_frames(ctx) -> None:
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep, topic=b"kv-events")
    sunk: list[KVEvent] = []
    col = KVEventCollector(context=ctx, sink=sunk.extend, replay_timeout_s=2.0)
    ep = col.add_endpoint("w1", 0, pub_ep, replay_ep, topic="kv-events")
    _connect(col, pub, ctx, pub_ep)
    sunk.clear()
    h = ep.health

    pub.publish([1.0, [stored([1, 2], image=True)], 0])                       # seq 0
    pub.publish([1.1, [stored([3], parent=2, as_map=False)], 0])              # seq 1
    pub.publish([1.2, [{"type": "BlockRemoved", "block_hashes": [1]}], 0], send=False)  # lost
    pub.publish([1.3, [stored([4], parent=3)], 0], send=False)                # seq 3: lost
    pub.publish({"ts": 1.4, "events": [stored([5], parent=4)], "data_parallel_rank": 0})
    _pump(col, lambda: h.counters.get("last_seq") == 4)
    assert pub.replay_requests == [2]
    assert (h.counters["gaps"], h.counters["missed_batches"], h.counters["replayed_batches"]) == (
        1, 2, 2)
    res = col.summary()["w1#0"]
    assert res["resident_blocks"] == 4  # 1..5 stored, 1 removed (from the replayed batch)
    assert res["images"] == {IMG: 1}    # block 1 held the image twice; block 2 is left
    assert [e.seq for e in sunk] == [0, 1, 2, 3, 4]

    # Bad input on the wire: each counted, nothing else disturbed.
    pub.send_frames([b"kv-events", b"\x00\x01"])                                # 2 frames
    pub.send_frames([b"kv-events", b"\x00\x01", b"x"])                         # short seq
    pub.pub.send_multipart([b"kv-events", (5).to_bytes(8, "big"), b"\xc1\xc1"])  # undecodable
    pub.seq = 6
    pub.publish([1.5, [["Teleported", [9]], stored([6], parent=5)], 0])         # unknown tag
    _pump(col, lambda: h.counters.get("last_seq") == 6)
    assert h.errors == {"truncated_frame": 2, "undecodable_msgpack": 1, "unknown_event_tag": 1}
    assert col.summary()["w1#0"]["resident_blocks"] == 5

    # Publisher restart: seq back to 0 empties the worker's index.
    pub.restart()
    pub.publish([time.time(), [stored([100])], 0])
    _pump(col, lambda: h.counters.get("restarts") == 1)
    assert col.summary()["w1#0"]["resident_blocks"] == 1
    assert col.summary()["w1#0"]["restarts"] == 1
    assert h.counters["mean_lag_s"] >= 0
    col.close()
    pub.close()


def test_gap_without_replay_endpoint_and_dead_replay(ctx) -> None:
    pub_ep, pub2_ep, dead_replay = loopback_endpoints(3)
    pub = Publisher(ctx, pub_ep, None)
    pub2 = Publisher(ctx, pub2_ep, None)
    col = KVEventCollector(context=ctx, replay_timeout_s=0.3)
    a = col.add_endpoint("a", 0, pub_ep, None)
    b = col.add_endpoint("b", 0, pub2_ep, dead_replay)  # nothing listens there
    for p in (pub, pub2):
        _connect(col, p, ctx, "")
    for p in (pub, pub2):
        p.publish([1.0, [stored([1])], 0])
        p.publish([1.0, [stored([2])], 0], send=False)
        p.publish([1.0, [stored([3])], 0])
    t0 = time.monotonic()
    _pump(col, lambda: a.health.counters.get("last_seq") == 2
          and b.health.counters.get("last_seq") == 2)
    assert time.monotonic() - t0 < 3
    assert a.health.errors == {"unrecovered_gap": 1}
    # A replay socket that did not answer yet may still: its batch is owed, not lost.
    assert b.health.errors == {"replay_timeout": 1}
    assert (b.health.counters["owed_batches"], b.health.counters["lost_batches"]) == (1, 0)
    assert col.summary()["a#0"]["resident_blocks"] == 2
    col.drain(1.0)  # a last try at stop, then what is still owed is lost and says why
    assert b.health.errors == {"replay_timeout": 1, "unrecovered_gap": 1}
    assert "still owed at stop" in b.health.last_error
    c = b.health.counters
    assert (c["owed_batches"], c["lost_batches"], c["given_up_batches:stop"]) == (0, 1, 1)
    col.close()
    pub.close()
    pub2.close()


def test_dp_ranks_are_separate_streams(ctx) -> None:
    from mmlens.config import WorkerTarget

    port = free_port_base(2)
    w = WorkerTarget("w", kv_events=f"tcp://127.0.0.1:{port}", dp_size=2)
    pubs = [Publisher(ctx, ep, None) for _, ep, _ in w.kv_endpoints()]
    col = KVEventCollector(context=ctx)
    for rank, ep, replay in w.kv_endpoints():
        col.add_endpoint("w", rank, ep, replay)
    for p in pubs:
        _connect(col, p, ctx, "")
    enc = msgspec.msgpack.Encoder()
    pubs[0].publish(None, raw=enc.encode([1.0, [stored([1, 2])]]))
    pubs[1].publish(None, raw=enc.encode([1.0, [stored([1])], 1]))
    _pump(col, lambda: len(col.summary()) == 2)
    s = col.summary()
    assert (s["w#0"]["resident_blocks"], s["w#1"]["resident_blocks"]) == (2, 1)
    col.close()
    for p in pubs:
        p.close()


def test_initial_sync_learns_blocks_stored_before_the_collector_started(ctx) -> None:
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    pub.publish([1.0, [stored([1, 2], image=True)], 0])  # nobody listening yet
    pub.publish([1.1, [stored([3], parent=2)], 0])
    col = KVEventCollector(context=ctx, replay_timeout_s=2.0)
    ep = col.add_endpoint("w1", 0, pub_ep, replay_ep)
    col.initial_sync()
    assert col.summary()["w1#0"]["resident_blocks"] == 3
    assert ep.health.counters["initial_sync_batches"] == 2
    assert ep.stream.last_seq == 1
    seq2 = pub.publish([1.2, [stored([4], parent=3)], 0])  # continues the stream
    payload = pub.buffer[-1][1]
    deadline = time.monotonic() + 5
    while ep.health.counters.get("last_seq") != seq2 and time.monotonic() < deadline:
        pub.send_frames([b"", seq2.to_bytes(8, "big"), payload])  # slow joiner: resend
        col.poll(50)
    assert col.summary()["w1#0"]["resident_blocks"] == 4
    assert ep.health.errors == {} and "gaps" not in ep.health.counters
    col.close()
    pub.close()


def test_late_join_fetches_what_the_publisher_still_buffers(ctx) -> None:
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    col = KVEventCollector(context=ctx, replay_timeout_s=2.0)
    ep = col.add_endpoint("w1", 0, pub_ep, replay_ep)
    col.initial_sync()  # empty buffer: nothing learned, stream not yet tracked
    pub.publish([1.0, [stored([1])], 0], send=False)  # never reaches the SUB socket
    seq = pub.publish([1.1, [stored([2], parent=1)], 0], send=False)
    payload = pub.buffer[-1][1]
    deadline = time.monotonic() + 5
    while ep.health.counters.get("last_seq") != seq and time.monotonic() < deadline:
        pub.send_frames([b"", seq.to_bytes(8, "big"), payload])
        col.poll(50)
    assert ep.health.counters["late_join_missed"] == 1
    assert ep.health.counters["replayed_batches"] == 1
    assert col.summary()["w1#0"]["resident_blocks"] == 2
    col.close()
    pub.close()
