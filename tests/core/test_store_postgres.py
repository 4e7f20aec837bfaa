"""What is PostgreSQL's own in the server store: hourly partitions made on demand (also by two
writers at once), retention by dropping partitions, a read-only session, and URLs whose
passwords never reach a message."""

from __future__ import annotations

import threading

import pytest

from mmlens.records import BlockStored, MetricSample, RequestTrace
from mmlens.store.open import StoreError, label, open_store, redact
from tests.conftest import new_database

H = 3600.0


def _events(worker: str, ts: float, n: int, seq0: int = 0) -> list[BlockStored]:
    return [BlockStored(worker, 0, seq0 + i, ts + i, [seq0 + i], None, [1] * 16, 16)
            for i in range(n)]


def test_rows_go_to_hourly_partitions_made_on_demand(postgres) -> None:
    store = open_store(new_database(postgres))
    assert store.partitions("kv_events") == []
    store.add_kv_events(_events("w", 10 * H + 5, 3) + _events("w", 12 * H + 1, 2, 10))
    assert store.partitions("kv_events") == [int(10 * H), int(12 * H)]
    store.add_traces([RequestTrace("r", "u", "smg", "m", 11 * H, False)])
    assert store.partitions("traces") == [int(11 * H)]
    assert [r.seq for r in store.kv_event_rows(None)] == [11, 10, 2, 1, 0]
    assert store.kv_timeline(10 * H, 600.0) == [
        (10 * H, "w", "stored", 3), (12 * H, "w", "stored", 2)]
    store.close()


def test_retention_drops_whole_partitions(postgres) -> None:
    store = open_store(new_database(postgres))
    for hour in range(5):
        store.add_samples(MetricSample("t", "x", (), 1.0, hour * H + 60 * i) for i in range(10))
    assert len(store.partitions("samples")) == 5
    # Cutoff 3.5 h: hours 0–2 are dropped whole, hour 3 loses the rows before 3.5 h.
    assert store.prune(retention_s=H, max_bytes=1e12, now=4.5 * H) == 30 + 10
    assert store.partitions("samples")[:2] == [int(3 * H), int(4 * H)]
    assert min(s.ts for s in store.samples_since(0)) >= 3.5 * H
    # The size bound drops the oldest partitions, never the newest rows'.
    store.prune(retention_s=1e9, max_bytes=1, now=4.5 * H)
    assert {s.ts // H for s in store.samples_since(0)} == {4.0}
    store.close()


def test_two_writers_make_the_same_new_partition_at_once(postgres) -> None:
    db = new_database(postgres)
    stores = [open_store(db) for _ in range(2)]
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def write(i: int) -> None:
        go.wait()
        try:
            stores[i].add_kv_events(_events(f"w{i}", 20 * H, 50))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert stores[0].kv_event_counts() == {
        "w0": {"stored_events": 50, "stored_blocks": 50},
        "w1": {"stored_events": 50, "stored_blocks": 50}}
    for s in stores:
        s.close()


def test_a_read_only_store_refuses_writes_even_below_the_api(postgres) -> None:
    import psycopg

    db = new_database(postgres)
    open_store(db).close()
    reader = open_store(db, readonly=True)
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reader.db.execute("INSERT INTO meta VALUES ('x', '1')")
    reader.close()


def test_passwords_stay_out_of_messages(postgres) -> None:
    url = f"postgresql://mmlens:s3cret@127.0.0.1:{postgres.port}/nosuchdb"
    assert redact(url) == f"postgresql://mmlens:***@127.0.0.1:{postgres.port}/nosuchdb"
    assert label(url) == redact(url) and label("/some/dir/mmlens.db") == "mmlens.db"
    with pytest.raises(StoreError) as err:
        open_store(url)
    assert "nosuchdb" in str(err.value) and "s3cret" not in str(err.value)
