"""The store on both backends (SQLite file, real PostgreSQL server): schema version, round
trips, retention, a reader beside the writer, idempotent KV events, per-instance health; and
what is SQLite's own (WAL, the schema-1 migration)."""

from __future__ import annotations

import sqlite3
import threading

import msgspec
import pytest

from mmlens.ingest.metric_series import to_series
from mmlens.records import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CollectorHealth,
    ImageRef,
    MetricSample,
    RequestTrace,
    RoutingDecision,
)
from mmlens.store.open import NoStoreYet, StoreError, open_store
from mmlens.store.schema import KV_COLUMNS
from mmlens.store.sqlite import SCHEMA_VERSION, WAL_CHECKPOINT_PAGES, Store
from mmlens.store.tail import IdTail
from mmlens.store.writes import kv_row
from tests.conftest import new_database

BIG = (1 << 64) - 1


def test_sqlite_store_is_in_wal_mode(tmp_path) -> None:
    store = Store(tmp_path / "s.db")
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_sqlite_reads_a_name_prefix_through_the_name_index(tmp_path) -> None:
    """The routers' prefixed series are a few names among every worker's samples: the read
    goes by the (name, ts) index, not through every sample of the window."""
    store = open_store(str(tmp_path / "s.db"))
    match, args = store._prefix("name", "dynamo_router_overhead_")
    plan = store._rows(f"EXPLAIN QUERY PLAN SELECT ts FROM samples WHERE ts >= ? AND {match}",
                       [0.0, *args])
    assert "samples_name_ts" in str(plan), plan
    store.add_samples([MetricSample("w", n, (), 1.0, 1.0) for n in (
        "dynamo_router_overhead_a", "dynamo_router_overhead`", "dynamo_routerXoverhead_b")])
    assert {n for _, n, _ in store.series_since(0, None, ["dynamo_router_overhead_"])} == {
        "dynamo_router_overhead_a"}


def test_sqlite_writer_checkpoints_its_wal_every_few_thousand_pages(tmp_path) -> None:
    store = Store(tmp_path / "s.db")
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_CHECKPOINT_PAGES
    assert WAL_CHECKPOINT_PAGES > 1000  # SQLite's default: checkpoints four times as often
    store.close()


def test_schema_and_round_trips(store_db: str) -> None:
    db = store_db
    store = open_store(db)
    assert store.schema_version() == SCHEMA_VERSION
    store.add_samples([MetricSample("t", "x_total", (("a", "1"),), 3.0, 10.0)])
    img = "c" * 64
    store.add_kv_events([
        BlockStored("w", 0, 1, 11.0, [BIG, "ab" * 32], None, [1] * 32, 16,
                    images=[(ImageRef(img, 4),), None]),
        BlockRemoved("w", 0, 2, 12.0, [BIG]),
        AllBlocksCleared("w", 0, 3, 13.0)])
    trace = RequestTrace("r1", "http://r", "smg", "m", 14.0, False, cached_tokens=80,
                         predictions=[RoutingDecision("r1", "smg", "header", branch="event_hit")])
    store.add_traces([trace])
    h = CollectorHealth("metrics", "t")
    h.error("timeout", "slow", 9.0)
    h.ok(10.0)
    store.set_health([h], 15.0)
    store.set_kv_state({"w#0": {"worker": "w", "rank": 0, "resident_blocks": 5,
                                "images": {img: 2}}}, 16.0)

    reader = open_store(db, readonly=True)
    (s,) = reader.samples_since(0)
    assert (s.target, s.name, s.labels, s.value, s.ts) == ("t", "x_total", (("a", "1"),), 3.0,
                                                           10.0)
    rows = reader.kv_event_rows()
    assert [r.kind for r in rows] == ["cleared", "removed", "stored"]
    assert rows[2].block_hashes == [BIG, "ab" * 32] and rows[2].images == [img]
    assert rows[2].n_blocks == 2 and rows[2].parent is None and rows[0].block_hashes == []
    removals = reader.kv_event_rows(None, since=11.5, kinds=("removed", "cleared"),
                                    hashes=False)
    assert [(r.kind, r.n_blocks, r.block_hashes) for r in removals] == [
        ("cleared", 0, []), ("removed", 1, [])]
    assert reader.kv_event_counts() == {"w": {
        "stored_events": 1, "stored_blocks": 2, "removed_events": 1, "removed_blocks": 1,
        "cleared_events": 1, "cleared_blocks": 0}}
    (t,) = reader.traces()
    assert isinstance(t, RequestTrace) and t == trace
    (hh,) = reader.health()
    assert isinstance(hh, CollectorHealth) and hh.updated == 15.0
    assert hh.errors == {"timeout": 1} and hh.last_success == 10.0
    (k,) = reader.kv_state()
    assert (k.resident_blocks, k.images, k.updated, k.label) == (5, {img: 2}, 16.0, "w")
    with pytest.raises(StoreError, match="read-only"):
        reader.add_samples([MetricSample("t", "y", (), 1.0, 1.0)])
    assert len(reader.samples_since(0)) == 1
    reader.close()
    store.close()


def test_parent_hash_comes_back_as_the_engine_sent_it(store_db: str) -> None:
    store = open_store(store_db)
    store.add_kv_events([BlockStored("w", 0, 1, 1.0, [1], BIG, [1] * 16, 16),
                         BlockStored("w", 0, 2, 2.0, [2], "ab" * 32, [1] * 16, 16)])
    assert [r.parent for r in store.kv_event_rows()] == ["ab" * 32, BIG]
    store.close()


def test_schema_version_mismatch_is_refused(store_db: str) -> None:
    with pytest.raises(NoStoreYet, match="no store"):
        open_store(store_db, readonly=True)  # nothing created it yet
    store = open_store(store_db)
    with store._tx():
        store._exec("UPDATE meta SET value='99' WHERE key='schema_version'")
    store.close()
    with pytest.raises(StoreError, match="schema 99"):
        open_store(store_db)


def test_retention_by_age_and_size(store_db: str) -> None:
    store = open_store(store_db)
    store.add_samples(MetricSample("t", "old", (), 1.0, 100.0) for _ in range(10))
    store.add_samples(MetricSample("t", "new", (), 1.0, 1000.0) for _ in range(10))
    assert store.prune(retention_s=500, max_bytes=1e9, now=1100.0) == 10
    assert {s.name for s in store.samples_since(0)} == {"new"}
    # Five hours of samples (PostgreSQL frees space by dropping hourly partitions).
    store.add_samples(MetricSample("t", "bulk", (("pad", "x" * 200),), 1.0, 1050.0 + 4 * i)
                      for i in range(5000))
    big = store.used_bytes()
    store.prune(retention_s=1e9, max_bytes=big / 3, now=1100.0)
    assert store.used_bytes() <= big / 3
    left = store.samples_since(0)
    assert left and min(s.ts for s in left) > 1050.0  # the oldest went first


def test_reader_sees_writer_commits_while_open(store_db: str) -> None:
    writer = open_store(store_db)
    reader = open_store(store_db, readonly=True)
    for i in range(3):
        writer.add_samples([MetricSample("t", "x", (), float(i), float(i))])
        assert len(reader.samples_since(0)) == i + 1


def test_series_read_directly_equal_the_samples_as_series(store_db: str) -> None:
    store = open_store(store_db)
    # Written out of time order, two label sets, a counter reset: nothing lost or reordered.
    store.add_samples(MetricSample(f"w{i % 2}", name, (("engine", str(i % 3)),), v, ts)
                      for i, (ts, v) in enumerate([(30.0, 5.0), (10.0, 2.0), (20.0, 9.0),
                                                   (40.0, 1.0), (5.0, 0.0), (25.0, 3.0)] * 2)
                      for name in ("a_total", "b"))
    assert store.series_since(0) == to_series(store.samples_since(0))
    assert store.series_since(21) == to_series(store.samples_since(21))
    assert store.series_since(1e9) == {}
    store.add_samples([MetricSample("w0", "dynamo_router_overhead_x_ms_sum", (), 1.0, 50.0)])
    assert {n for _, n, _ in store.series_since(0, ["b"], ["dynamo_router_overhead_"])} == {
        "b", "dynamo_router_overhead_x_ms_sum"}
    # one query per name set and per prefix: a name both listed and prefixed is read once
    both = store.series_since(0, ["b", "dynamo_router_overhead_x_ms_sum"],
                              ["dynamo_router_overhead_", "dynamo_router_"])
    assert both[("w0", "dynamo_router_overhead_x_ms_sum", ())] == [(50.0, 1.0)]
    assert both == store.series_since(0, ["b", "dynamo_router_overhead_x_ms_sum"])
    assert store.sample_names(21) == {"w0": {"a_total", "b", "dynamo_router_overhead_x_ms_sum"},
                                      "w1": {"a_total", "b"}}


def _batch(seq: int, ts: float, n: int) -> list:
    return [BlockStored("w", 0, seq, ts, [seq * 100 + i], None, [1] * 16, 16, idx=i)
            for i in range(n)]


def test_kv_events_are_stored_once_per_key(store_db: str) -> None:
    one, two = open_store(store_db), open_store(store_db)  # two collectors on one store
    assert one.add_kv_events(_batch(1, 10.0, 3) + _batch(2, 11.0, 2)) == 5
    assert two.add_kv_events(_batch(1, 10.0, 3)) == 0  # the same batch again: nothing new
    # After a publisher restart seq 1 comes back with another batch time: a new batch.
    assert two.add_kv_events(_batch(1, 20.0, 3)) == 3
    # Identical events at two positions of one batch are two events.
    same = [AllBlocksCleared("w", 0, 3, 12.0, idx=0), AllBlocksCleared("w", 0, 3, 12.0, idx=1)]
    assert one.add_kv_events(same + same) == 2
    assert len(one.kv_event_rows(None)) == 10
    one.close()
    two.close()


def test_a_kv_events_row_reads_back_as_kv_row_gives_it(store_db: str) -> None:
    """Each nullable column of every event shape (SQLite binds NULLs as '', blobs as
    bytearray: ``writes.bound_row``) reads back as the event's ``kv_row``, NULL as None."""
    store = open_store(store_db)
    events = [BlockStored("w", 0, 1, 1.0, [5, 1 << 63], 7, [1] * 32, 16, idx=0,
                          images=[(("ab", 3),), None], keys=[9, 10], shapes=[3, 4],
                          prompt_end=2),
              BlockStored("w", 0, 1, 1.0, [6], None, [1] * 16, 16, idx=1),
              BlockRemoved("w", 0, 1, 1.0, [5], idx=2, keys=[9]),
              BlockRemoved("w", 0, 1, 1.0, [8], idx=3),
              AllBlocksCleared("w", 0, 1, 1.0, idx=4)]
    assert store.add_kv_events(events) == 5
    got = store._rows(f"SELECT {KV_COLUMNS} FROM kv_events ORDER BY idx")
    assert [tuple(r) for r in got] == [kv_row(ev) for ev in events]
    assert [r[6] is None for r in got] == [False, True, True, True, True]  # parent
    assert [r[10] is None for r in got] == [False, True, False, True, True]  # content
    store.close()


def test_kv_events_and_content_in_one_transaction_are_stored_once(store_db: str) -> None:
    """Two writes inside one transaction (PostgreSQL stages each through one COPY table):
    the second's overlap is skipped, its content rows with it, the order kept."""
    store = open_store(store_db)
    first, second = _batch(1, 10.0, 3), _batch(1, 10.0, 3) + _batch(2, 11.0, 2)
    for ev in first + second:
        ev.keys = [ev.block_hashes[0] + 7]
    with store.atomically():
        assert store.add_kv_events(first) == 3
        assert store.add_kv_events(second) == 2
    assert store.add_kv_events(second) == 0
    assert [r.keys for r in store.kv_keyed_tail(IdTail())] == [
        [107], [108], [109], [207], [208]]
    assert sorted(r.seq for r in store.kv_event_rows(None)) == [1, 1, 1, 2, 2]
    store.close()


def test_keys_of_an_event_stored_before_without_them_go_to_the_late_table_once(
        store_db: str) -> None:
    """A second collector (or a replay) hands over a stored event with content keys the
    first one's index did not know: the event row stays as it was, its keys reach the
    availability replay once, through ``kv_content``; an event stored with keys gets none."""
    one, two = open_store(store_db), open_store(store_db)
    unkeyed, keyed = _batch(1, 10.0, 2), _batch(1, 10.0, 2)
    keyed[0].keys, keyed[1].keys = [7], [8]
    unkeyed[1].keys = [8]
    assert one.add_kv_events(unkeyed) == 2
    assert two.add_kv_events(keyed) == 0
    assert two.add_kv_events(keyed) == 0
    assert [(r.keys, r.kind) for r in one.kv_keyed_tail(IdTail())] == [([], "stored"),
                                                                       ([8], "stored")]
    assert [r.keys for r in one.kv_content_tail(IdTail())] == [[7]]
    one.close()
    two.close()


def test_a_kv_row_the_backend_refuses_is_set_aside_alone(store_db: str) -> None:
    """A rank past 64 bits fails the whole batch's insert (PostgreSQL's binary COPY, SQLite's
    bind): the batch goes row by row, the bad row alone is refused and named, and the keys
    of the others are there for the availability replay."""
    store = open_store(store_db)
    events = _batch(1, 10.0, 3)
    for ev in events:
        ev.keys = [ev.block_hashes[0]]
    events[1].rank = 1 << 70
    assert store.add_kv_events(events) == 2
    assert [r.keys for r in store.kv_keyed_tail(IdTail())] == [[100], [102]]
    assert dict(store.rejected) == {"unwritable_kv_events": 1}
    assert store.add_kv_events(events) == 0  # stored once, refused again
    assert dict(store.rejected) == {"unwritable_kv_events": 2}
    store.close()


_V2_KV = """
    CREATE TABLE kv_events (ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT NULL,
        seq INTEGER NOT NULL, kind TEXT NOT NULL, n_blocks INTEGER NOT NULL, parent TEXT,
        hashes BLOB, images TEXT, idx INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX kv_events_ts ON kv_events (ts);
    CREATE UNIQUE INDEX kv_events_key ON kv_events (worker, rank, seq, ts, idx);
    CREATE TABLE kv_content (ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT NULL,
        seq INTEGER NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL, content BLOB);
    CREATE UNIQUE INDEX kv_content_key ON kv_content (worker, rank, seq, ts, idx);
"""


def _v2_rows(run) -> None:
    """Three schema-2 events (a store with keys, a store without, a clear) and the
    ``kv_content`` rows schema 2 wrote for them (the keyed store, the clear)."""
    enc = msgspec.msgpack.Encoder()
    for seq, kind, content in ((1, "stored", enc.encode({"k": [11], "i": []})),
                               (2, "stored", None), (3, "cleared", None)):
        run("INSERT INTO kv_events (ts, worker, rank, seq, kind, n_blocks, hashes, "
            "idx) VALUES (?, 'w', 0, ?, ?, 1, ?, 0)",
            (float(seq), seq, kind, enc.encode([seq])))
        if seq != 2:
            run("INSERT INTO kv_content (ts, worker, rank, seq, idx, kind, content) "
                "VALUES (?, 'w', 0, ?, 0, ?, ?)", (float(seq), seq, kind, content))


def _check_v3(store) -> None:
    assert store.schema_version() == SCHEMA_VERSION == 4
    assert [(r.ts, r.kind, r.keys) for r in store.kv_keyed_tail(IdTail())] == [
        (1.0, "stored", [11]), (2.0, "stored", []), (3.0, "cleared", [])]
    assert store.kv_content_tail(IdTail()) == []  # moved, not applied twice
    assert store.add_kv_events([BlockStored("w", 0, 1, 1.0, [1], None, [1] * 16, 16)]) == 0
    assert store.add_kv_events([AllBlocksCleared("w", 0, 4, 4.0)]) == 1
    assert len(store.kv_event_rows()) == 4


def test_schema_2_store_is_migrated_in_place(tmp_path) -> None:
    db = tmp_path / "s.db"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                      "INSERT INTO meta VALUES ('schema_version', '2');" + _V2_KV)
    with con:
        _v2_rows(con.execute)
    con.close()
    store = Store(db)
    _check_v3(store)
    indexes = {r[1] for r in store.db.execute("PRAGMA index_list(kv_events)")}
    assert indexes == {"kv_events_ts_key"}  # one index: the ts-led key
    store.close()


def test_schema_2_postgres_store_is_migrated_in_place(postgres) -> None:
    db = new_database(postgres)
    store = open_store(db)
    store._exec("ALTER TABLE kv_events DROP COLUMN content")  # the schema-2 table
    store._exec("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    store._before_append("kv_events", [1.0])
    store._before_append("kv_content", [1.0])
    _v2_rows(store._exec)
    store.close()
    store = open_store(db)
    _check_v3(store)
    store.close()


def test_health_rows_are_kept_per_collector_instance(store_db: str) -> None:
    db = store_db
    one, two = open_store(db), open_store(db)
    a, b = CollectorHealth("kv_events", "w#0"), CollectorHealth("kv_events", "w#0")
    a.error("bad_batch", "x", 1.0)
    b.count("batches", 7)
    one.set_health([a], 2.0, instance="host:1")
    two.set_health([b], 3.0, instance="host:2")
    one.set_health([a], 4.0, instance="host:1")
    rows = {h.instance: h for h in open_store(db, readonly=True).health()}
    assert set(rows) == {"host:1", "host:2"}
    assert rows["host:1"].errors == {"bad_batch": 1} and rows["host:1"].updated == 4.0
    assert rows["host:2"].counters == {"batches": 7}


def test_decisions_are_folded_per_request_in_the_order_written(store_db: str) -> None:
    """One row per request (and router) of a write; read back oldest first, decisions of
    one time in the order written, across rows and within one."""
    store = open_store(store_db)
    a1, a2, a3 = (RoutingDecision("r1", "smg", s, ts=t) for s, t in (
        ("log:a1", 2.0), ("log:a2", 1.0), ("log:a3", 2.0)))
    b1 = RoutingDecision("r2", "smg", "log:b1", ts=None)
    assert store.add_decisions([a1, b1, a2, a3], ts=1.5) == 4
    a4 = RoutingDecision("r1", "smg", "log:a4", ts=2.0)
    assert store.add_decisions([a4]) == 1
    assert store._one("SELECT count(*) FROM decisions") == 3
    assert [d.source for d in store.decisions(["r1"])] == [
        "log:a2", "log:a1", "log:a3", "log:a4"]
    assert [d.source for d in store.decisions(["r2", "r1"])][:1] == ["log:b1"]  # ts None
    assert store.decision_tail(IdTail()) == [("r1", 1.0), ("r2", 1.5), ("r1", 2.0)]
    store.close()


def test_a_decision_with_no_storable_time_is_set_aside_alone_from_its_request(
        store_db: str) -> None:
    store = open_store(store_db)
    good, bad = (RoutingDecision("r1", "smg", s, ts=t) for s, t in (
        ("log:good", 1.0), ("log:bad", float("inf"))))
    assert store.add_decisions([good, bad]) == 1
    assert [d.source for d in store.decisions(["r1"])] == ["log:good"]
    assert store.rejected == {"unwritable_decision": 1}
    store.close()


def _v3_decisions(store) -> None:
    """A schema-3 store's decisions: one row each."""
    store._before_append("decisions", [1.0])
    with store._tx():
        store._exec("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
        for i, (rid, ts) in enumerate((("r1", 2.0), ("r1", 1.0), ("r2", 1.0))):
            store._exec("INSERT INTO decisions (ts, request_id, router, source, body) "
                        "VALUES (?, ?, 'smg', 'log', ?)",
                        (ts, rid, msgspec.json.encode(RoutingDecision(
                            rid, "smg", f"log:{i}", ts=ts)).decode()))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_schema_3_store_is_migrated_in_place(backend, tmp_path, request) -> None:
    db = str(tmp_path / "s.db") if backend == "sqlite" else new_database(
        request.getfixturevalue("postgres"))
    store = open_store(db)
    _v3_decisions(store)
    store.close()
    store = open_store(db)
    assert store.schema_version() == SCHEMA_VERSION == 4
    assert [d.source for d in store.decisions(["r1", "r2"])] == ["log:1", "log:2", "log:0"]
    assert store.add_decisions([RoutingDecision("r2", "smg", "log:3", ts=1.0)]) == 1
    assert [d.source for d in store.decisions(["r2"])] == ["log:2", "log:3"]
    store.close()
    store = open_store(db)  # opened again: nothing folded twice
    assert len(store.decisions(["r1", "r2"])) == 4
    store.close()


def test_schema_1_store_is_migrated_in_place(tmp_path) -> None:
    db = tmp_path / "s.db"
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE kv_events (ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT NULL,
            seq INTEGER NOT NULL, kind TEXT NOT NULL, n_blocks INTEGER NOT NULL, parent TEXT,
            hashes BLOB, images TEXT);
        INSERT INTO kv_events VALUES (1.0, 'w', 0, 5, 'cleared', 0, NULL, NULL, NULL);
        INSERT INTO kv_events VALUES (1.0, 'w', 0, 5, 'cleared', 0, NULL, NULL, NULL);
        CREATE TABLE health (collector TEXT NOT NULL, target TEXT NOT NULL, updated REAL NOT NULL,
            last_success REAL, last_error TEXT, last_error_ts REAL, errors TEXT NOT NULL,
            counters TEXT NOT NULL, PRIMARY KEY (collector, target));
        INSERT INTO health VALUES ('m', 't', 1.0, NULL, NULL, NULL, '{}', '{}');
    """)
    con.commit()
    con.close()
    store = Store(db)
    assert store.schema_version() == SCHEMA_VERSION == 4
    assert len(store.kv_event_rows()) == 2  # old rows kept, even old duplicates
    assert store.add_kv_events([AllBlocksCleared("w", 0, 5, 1.0)]) == 1
    assert store.add_kv_events([AllBlocksCleared("w", 0, 5, 1.0)]) == 0
    store.set_health([CollectorHealth("m", "t")], 2.0, instance="i")
    assert [h.instance for h in store.health()] == ["i"]
    store.close()


def test_writers_opening_a_new_store_at_once_all_open_it(tmp_path) -> None:
    """The replay's sender opens the store once per request from eight threads: on a new
    store each finds no schema version, and none may fail for another's insert of it."""
    path = str(tmp_path / "new.db")
    start, errors, opened = threading.Barrier(8), [], []

    def one() -> None:
        start.wait()
        try:
            store = open_store(path)
        except Exception as exc:  # what the test counts
            errors.append(repr(exc))
            return
        opened.append(store.schema_version())
        store.close()

    for _ in range(25):
        for leftover in tmp_path.glob("new.db*"):
            leftover.unlink()
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert opened == [SCHEMA_VERSION] * 200
