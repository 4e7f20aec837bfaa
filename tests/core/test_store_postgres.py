"""What is PostgreSQL's own in the server store: hourly partitions made on demand (also by two
writers at once), retention by dropping partitions, a read-only session, and URLs whose
passwords never reach a message."""

from __future__ import annotations

import threading

import pytest

from mmlens.records import BlockStored, MetricSample, RequestTrace
from mmlens.store import postgres as pg_store
from mmlens.store.open import StoreError, label, open_store, redact
from mmlens.store.schema import KV_COLUMNS
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


_EDGE_ROWS = [
    (1.5, "w", 0, 1, "stored", 1, None, b"\x91\x05", None, 0, None),
    (1e9 + 0.123456789, "é✓ w", -(1 << 31), -(1 << 63), "removed", (1 << 31) - 1, "12",
     b"", '["ab"]', (1 << 31) - 1, b"\x00" * 70_000),
    (2.0 ** 40, "w", (1 << 31) - 1, (1 << 63) - 1, "cleared", 0, "x" * 300, None, "", -1,
     bytearray(b"\x81\xa1k\x90")),
]


@pytest.mark.parametrize("compiled", [True, False])
def test_the_compiled_copy_stream_stores_what_write_row_stores(postgres, monkeypatch,
                                                               compiled) -> None:
    """Rows of each column type at its edges (NULLs, int4/int8 bounds, non-ASCII and long
    text, empty and 70 kB blobs) read back as given, the COPY stream compiled or not."""
    if compiled and pg_store._copy_binary is None:
        pytest.skip("compiled COPY not built")
    if not compiled:
        monkeypatch.setattr(pg_store, "_copy_binary", None)
    store = open_store(new_database(postgres))
    store._before_append("kv_events", (r[0] for r in _EDGE_ROWS))
    with store._tx():
        assert store._insert_new("kv_events", KV_COLUMNS, _EDGE_ROWS) == 3
        assert store._insert_new("kv_events", KV_COLUMNS, _EDGE_ROWS[1:]) == 0
    got = store._rows(f"SELECT {KV_COLUMNS} FROM kv_events ORDER BY ts")
    assert [tuple(r) for r in got] == [tuple(bytes(v) if isinstance(v, bytearray) else v
                                             for v in r) for r in _EDGE_ROWS]
    store.close()


def test_a_value_its_column_cannot_take_stops_the_compiled_stream_before_it_starts() -> None:
    if pg_store._copy_binary is None:
        pytest.skip("compiled COPY not built")
    types = ["float8", "text", "int4", "int8", "text", "int4", "text", "bytea", "text", "int4",
             "bytea"]
    row = _EDGE_ROWS[0]
    assert pg_store.copy_data([row], types).startswith(b"PGCOPY\n\xff\r\n\x00")
    for i, bad in ((2, 1 << 31), (3, 1 << 63), (1, b"w"), (7, "ab"), (0, "1.0")):
        with pytest.raises((OverflowError, TypeError)):
            pg_store.copy_data([(*row[:i], bad, *row[i + 1:])], types)
    assert pg_store.copy_data([row], [*types[:-1], "jsonb"]) is None  # write_row's then
