"""Owed batches and late fill, against real PUB/ROUTER sockets on 127.0.0.1: a replay socket
that is silent past its deadline and answers later loses nothing; one that never answers
has its loss reported; a publisher restart in between makes the owed range unrecoverable."""

from __future__ import annotations

import time

import pytest
import zmq
from mmlens.collectors.kv_subscriber import KVEventCollector
from mmlens.collectors.runner_kv import KVSide

from mmlens.ingest.kv_index import KVIngest
from mmlens.records import CollectorHealth, KVEvent
from mmlens.store.base import SQLStore
from mmlens.store.open import open_store
from tests.collectors.test_kv_subscriber import _connect, _pump, stored
from tests.collectors.zmq_publisher import Publisher
from tests.live_support import loopback_endpoints

TIMEOUT_S = 0.3


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def removed(hashes):
    return {"type": "BlockRemoved", "block_hashes": hashes}


def late_image(hashes, parent=None):
    return stored(hashes, parent, image=True)


CLEARED = {"type": "AllBlocksCleared"}

# (events, lost on the way?): each lost batch meets a later one that must win over it.
SCRIPT = [
    ([stored([1, 2])], False),
    ([stored([3], parent=2)], False),
    ([CLEARED], True),                      # late clear: 1, 2, 3 go; what came after stays
    ([stored([11])], False),
    ([stored([1])], False),                 # 1 again, after the clear
    ([late_image([4], parent=11)], True),   # late store: its parent was removed since
    ([removed([11])], False),
    ([stored([5], parent=1)], True),        # late store of a block removed later: stays out
    ([stored([6], parent=1)], False),
    ([removed([5])], False),
    ([removed([6])], True),                 # late removal of a block stored again later
    ([stored([6], parent=1)], False),
    ([removed([1])], True),                 # late removal of a block stored before it: goes
    ([late_image([7], parent=6)], False),
    ([stored([8], parent=7)], False),
    ([stored([9], parent=8)], True),        # late parent of a block stored live after it
    ([stored([10], parent=9)], False),      # its content is known once 9 comes
]


def collector(ctx, pub_ep, replay_ep, sunk=None, **kw):
    col = KVEventCollector(context=ctx, sink=None if sunk is None else sunk.extend,
                           replay_timeout_s=TIMEOUT_S, **kw)
    col.backoff = (0.5, 300.0)
    return col, col.add_endpoint("w1", 0, pub_ep, replay_ep)


def publish_script(pub: Publisher) -> list[tuple[int, bytes]]:
    out = []
    for events, lost in SCRIPT:
        seq = pub.publish([time.time(), events, 0], send=not lost)
        out.append((seq, pub.buffer[-1][1]))
    return out


def loss_free(batches: list[tuple[int, bytes]]):
    ingest = KVIngest()
    for seq, payload in batches:
        ingest.ingest("w1", seq, payload)
    return ingest.index.residency("w1", 0)


def test_silent_then_answering_replay_loses_nothing_and_the_index_is_the_loss_free_one(ctx):
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    sunk: list[KVEvent] = []
    col, ep = collector(ctx, pub_ep, replay_ep, sunk)
    _connect(col, pub, ctx, pub_ep)
    sunk.clear()
    h = ep.health
    pub.silent = True
    t0 = time.monotonic()
    batches = publish_script(pub)
    last = batches[-1][0]
    _pump(col, lambda: h.counters.get("last_seq") == last)
    assert time.monotonic() - t0 < TIMEOUT_S + 1.0  # live batches did not wait for it
    assert h.counters["owed_batches"] == 6 and h.counters["lost_batches"] == 0
    assert h.errors.get("replay_timeout") == 1 and "unrecovered_gap" not in h.errors
    # Silent for a while more (a late retry asks meanwhile), then answering.
    _pump(col, lambda: len(pub.ignored) >= 2, timeout=5)
    pub.silent = False
    _pump(col, lambda: h.counters["owed_batches"] == 0 and ep.pending is None, timeout=10)
    c = h.counters
    assert (c["late_recovered_batches"], c["lost_batches"]) == (6, 0)
    assert c["batches"] == c["published_batches"] == len(SCRIPT)
    assert "unrecovered_gap" not in h.errors
    # Every event handed over once; the index is the one a loss-free run builds.
    keys = [(e.seq, e.idx) for e in sunk]
    assert sorted(keys) == sorted(set(keys)) == [(s, 0) for s, _ in batches]
    res, want = col.ingest.index.residency("w1", 0), loss_free(batches)
    assert res.blocks == want.blocks and set(res.blocks) == {4, 6, 7, 8, 9, 10}
    assert None not in res.blocks.values()  # 4's parent was removed, 10's came late
    assert (res.block_images, res.image_blocks) == (want.block_images, want.image_blocks)
    assert res.marks is None  # nothing owed: the watermarks are gone
    col.close()
    pub.close()


def content_rows(store: SQLStore) -> dict[tuple, tuple]:
    """What the availability replay reads: the events with their content keys (and clears),
    then the keys that came late; no event's keys twice."""
    rows = store._rows(
        "SELECT ts, worker, rank, seq, idx, kind, content FROM kv_events WHERE content IS NOT "
        "NULL OR kind = 'cleared' UNION ALL "
        "SELECT ts, worker, rank, seq, idx, kind, content FROM kv_content")
    out = {(w, r, s, i): (ts, kind, content) for ts, w, r, s, i, kind, content in rows}
    assert len(out) == len(rows)
    return out


def test_a_late_parent_gives_a_stored_orphan_its_content_rows_once(ctx, tmp_path):
    """The runner's KV side against a store: seq 16 (block 10) is stored live while its
    parent's batch (seq 15) is owed; once 15 comes, 16's content keys reach ``kv_content``
    (a loss-free run has them in the event's row) and its event is not stored a second time."""
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    store = open_store(tmp_path / "late.db")
    side = KVSide(store, ctx, CollectorHealth("supervisor", "kv"))
    col = side.kv
    col.replay_timeout_s, col.backoff = TIMEOUT_S, (0.5, 300.0)
    ep = col.add_endpoint("w1", 0, pub_ep, replay_ep)
    _connect(col, pub, ctx, pub_ep)
    h = ep.health
    pub.silent = True
    batches = publish_script(pub)
    _pump(col, lambda: h.counters.get("last_seq") == batches[-1][0])
    side.drain(time.time(), None)  # the orphan's event is stored before its parent comes
    assert (batches[-1][0], 0) not in {k[2:] for k in content_rows(store)}
    pub.silent = False
    _pump(col, lambda: h.counters["owed_batches"] == 0 and ep.pending is None, timeout=10)
    side.drain(time.time(), None)
    c = h.counters
    assert c["late_recovered_batches"] == 6 and c["late_content_events"] == 1
    assert (c["stored_events"], c.get("duplicate_events", 0)) == (len(SCRIPT), 0)

    want = open_store(tmp_path / "loss_free.db")
    ingest = KVIngest()
    for seq, payload in batches:
        want.add_kv_events(ingest.ingest("w1", seq, payload))
    got, expected = content_rows(store), content_rows(want)
    assert ("w1", 0, batches[-1][0], 0) in got
    assert {k: v for k, v in got.items() if v[1] != "removed"} == {
        k: v for k, v in expected.items() if v[1] != "removed"}
    # Removals: as in the loss-free run, except two that went without keys: 5's (seq 9)
    # came before 5's late store, and the late clear (seq 2) narrowed 6's known residency
    # before its late removal (seq 10) was applied.
    assert all(expected[k] == v for k, v in got.items())
    assert sorted(k[2] for k in expected.keys() - got.keys()) == [9, 10]
    n_events = "SELECT count(*) FROM kv_events"
    assert store._one(n_events) == want._one(n_events) == len(SCRIPT)
    side.close()
    store.close()
    want.close()
    pub.close()


def test_never_answering_replay_is_reported_owed_then_given_up(ctx):
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    col, ep = collector(ctx, pub_ep, replay_ep, owed_budget=(3, 100))
    _connect(col, pub, ctx, pub_ep)
    h = ep.health
    pub.silent = True
    seq = 0
    for i in range(20):  # 5 gaps, over a budget of 3 ranges
        seq = pub.publish([time.time(), [stored([100 + i])], 0], send=i % 4 != 2)
    _pump(col, lambda: h.counters.get("last_seq") == seq)
    c = h.counters
    assert (c["owed_ranges"], c["owed_batches"], c["given_up_batches:budget"]) == (3, 3, 2)
    assert c["lost_batches"] == 2 and h.errors["unrecovered_gap"] == 2
    assert "over the owed budget" in h.last_error
    assert c["max_held_s"] < TIMEOUT_S + 0.5  # live batches waited one deadline at most
    col.drain(1.0)  # stopping: asked a last time, silent, so still owed at stop
    assert (c["owed_batches"], c["given_up_batches:stop"], c["lost_batches"]) == (0, 3, 5)
    assert h.errors["unrecovered_gap"] == 5 and "still owed at stop" in h.last_error
    assert col.summary()["w1#0"]["resident_blocks"] == 15
    col.close()
    pub.close()


@pytest.mark.parametrize("seen_live", [True, False])
def test_publisher_restart_between_gap_and_late_answer(ctx, seen_live):
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    sunk: list[KVEvent] = []
    col, ep = collector(ctx, pub_ep, replay_ep, sunk)
    _connect(col, pub, ctx, pub_ep)
    h = ep.health
    pub.silent = True
    for i in range(4):  # seq 2 lost, owed
        pub.publish([time.time(), [stored([10 + i])], 0], send=i != 2)
    _pump(col, lambda: h.counters.get("owed_batches") == 1)
    # The worker restarts: numbers from 0 again, a new buffer, other blocks.
    pub.restart()
    for i in range(5):
        pub.publish([time.time() + 1, [stored([50 + i])], 0], send=seen_live)
    pub.silent = False
    _pump(col, lambda: h.counters.get("owed_batches") == 0 and (
        not seen_live or h.counters.get("last_seq") == 4), timeout=10)
    c = h.counters
    assert c["given_up_batches:restart"] == 1 and c.get("late_recovered_batches", 0) == 0
    assert "restarted since" in h.last_error or (seen_live and c["restarts"] == 1)
    blocks = set(col.ingest.index.residency("w1", 0).blocks)
    # The new incarnation's seq 2 (block 52) was never taken for the old one's.
    assert blocks == ({50, 51, 52, 53, 54} if seen_live else {10, 11, 13})
    assert 52 not in {e.block_hashes[0] for e in sunk if e.seq == 2} or seen_live
    col.close()
    pub.close()
