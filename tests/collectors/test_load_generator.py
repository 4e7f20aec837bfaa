"""The benchmark's load generator: its publishers' batches are valid vLLM KV-event batches,
numbered from 0 per worker, stamped with the send time, at about the asked rate."""

from __future__ import annotations

import time

import pytest
import zmq

from benchmarks.kv_publishers import PublisherFleet
from mmlens.ingest.kv_events import parse_seq
from mmlens.ingest.kv_index import KVIngest
from mmlens.records import BlockRemoved, BlockStored
from tests.live_support import free_port_base

pytestmark = pytest.mark.slow


def test_publishers_send_valid_numbered_batches_at_the_rate() -> None:
    workers, rate, blocks, duration = 6, 1200.0, 8, 2.0
    fleet = PublisherFleet(workers, 2, free_port_base(workers), rate, blocks, duration)
    ctx = zmq.Context()
    subs = []
    try:
        for ep in fleet.endpoints():
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(ep)
            subs.append(s)
        time.sleep(0.5)  # subscriptions reach the publishers before the first batch
        fleet.run()
        got: dict[int, list[tuple[int, bytes, float]]] = {i: [] for i in range(workers)}
        poller = zmq.Poller()
        for s in subs:
            poller.register(s, zmq.POLLIN)
        end = time.monotonic() + duration + 1.0
        while time.monotonic() < end:
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                got[subs.index(sock)].append((parse_seq(frames[1]), frames[2], time.time()))
        totals = fleet.totals(30)
    finally:
        fleet.stop()
        for s in subs:
            s.close(linger=0)
        ctx.term()
    ingest = KVIngest()
    kinds: set[type] = set()
    for i, batches in got.items():
        assert [seq for seq, _, _ in batches] == list(range(len(batches)))
        for seq, payload, received in batches:
            events = ingest.ingest(f"w{i}", seq, payload, 0)
            assert 0 <= received - events[0].ts < 1.0
            kinds |= {type(e) for e in events}
            stored = [e for e in events if isinstance(e, BlockStored)]
            assert len(stored) == 1 and len(stored[0].block_hashes) == blocks
    assert kinds == {BlockStored, BlockRemoved}
    received_batches = sum(len(b) for b in got.values())
    assert received_batches == totals.batches and totals.dropped == 0
    assert totals.blocks == pytest.approx(rate * duration, rel=0.1)
