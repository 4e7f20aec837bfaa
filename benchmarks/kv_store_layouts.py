"""SQLite layouts of ``kv_events`` for the same rows: what the ts index, the unique key and the
page size cost per stored event (prints figures; not a unit test).

Usage: python benchmarks/kv_store_layouts.py [--batches N] [--rounds N]

The rows are the store's own (``kv_row`` of ``KVIngest`` events from the ``kv_ingest`` mix),
inserted as ``add_kv_events`` does (``ON CONFLICT DO NOTHING``, one transaction per 200
batches) into a fresh file per layout in WAL mode with synchronous=NORMAL; the layouts take
turns in each round and the median CPU-µs per row is printed. "no index" is the floor (no
idempotency, no ts reads).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kv_ingest import COMMIT_EVERY, Mix, cpu_time, filled_ingest

from mmlens.store.schema import KV_COLUMNS
from mmlens.store.writes import kv_row

_TABLE = ("CREATE TABLE kv_events (ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT "
          "NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, n_blocks INTEGER NOT NULL, parent "
          "TEXT, hashes BLOB, images TEXT, idx INTEGER NOT NULL DEFAULT 0, content BLOB")
_KEY = "(ts, worker, rank, seq, idx)"
LAYOUTS = {
    "ts index + key (schema 2)": (4096, [
        _TABLE + ")", "CREATE INDEX kv_events_ts ON kv_events (ts)",
        "CREATE UNIQUE INDEX kv_events_key ON kv_events (worker, rank, seq, ts, idx)"]),
    "ts-led key (schema 3), 4 KiB pages": (4096, [
        _TABLE + ")", f"CREATE UNIQUE INDEX kv_events_ts_key ON kv_events {_KEY}"]),
    "ts-led key (schema 3), 8 KiB pages": (8192, [
        _TABLE + ")", f"CREATE UNIQUE INDEX kv_events_ts_key ON kv_events {_KEY}"]),
    "WITHOUT ROWID, key as primary key": (4096, [
        _TABLE + f", PRIMARY KEY {_KEY}) WITHOUT ROWID"]),
    "no index (floor)": (4096, [_TABLE + ")"]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    fill, timed, _ = Mix(400_000).payloads(args.batches)
    ingest = filled_ingest(fill)
    events = [ingest.ingest("w0", seq, p) for seq, p in enumerate(timed, len(fill))]
    chunks = [[kv_row(ev) for batch in events[i:i + COMMIT_EVERY] for ev in batch]
              for i in range(0, len(events), COMMIT_EVERY)]
    n = sum(map(len, chunks))
    sql = (f"INSERT INTO kv_events ({KV_COLUMNS}) VALUES ({','.join('?' * 11)}) "
           "ON CONFLICT DO NOTHING")
    per_row: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (page, ddl)) in enumerate(LAYOUTS.items()):
                db = sqlite3.connect(Path(tmp) / f"{r}-{i}.db")
                db.execute(f"PRAGMA page_size={page}")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                for stmt in ddl:
                    db.execute(stmt)

                def store(db: sqlite3.Connection = db) -> None:
                    for rows in chunks:
                        with db:
                            db.executemany(sql, rows)
                per_row[name].append(cpu_time(store) / n * 1e6)
                db.close()
    print(f"{n} rows ({args.batches} batches), {args.rounds} rounds; CPU-µs per row, median "
          "(min–max):")
    for name, got in per_row.items():
        print(f"  {name:36s} {statistics.median(got):5.2f} ({min(got):.2f}–{max(got):.2f})")


if __name__ == "__main__":
    main()
