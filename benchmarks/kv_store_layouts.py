"""SQLite layouts of ``kv_events`` for the same rows: what the ts index, the unique key, the
page size and the way rows are bound cost per stored event (prints figures; not a unit test).

Usage: python benchmarks/kv_store_layouts.py [--batches N] [--rounds N]

The rows are the store's own (``kv_row`` of ``KVIngest`` events from the ``kv_ingest`` mix),
inserted as ``add_kv_events`` does (``ON CONFLICT DO NOTHING``, one transaction per 200
batches) into a fresh file per layout in WAL mode with synchronous=NORMAL; the layouts take
turns in each round and the median CPU-µs per event is printed. "no index" is the floor (no
idempotency, no ts reads). "bound rows" are the store's SQLite form (``writes.bound_row``:
blobs as bytearray, NULL as '' turned back by ``nullif``), "N rows per statement" a
multi-row VALUES, and "one row per batch" a design not in the store: a batch's events packed
(msgpack) into one row keyed (ts, worker, rank, seq), packing not timed (printed apart).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kv_ingest import COMMIT_EVERY, Mix, cpu_time, filled_ingest

from mmlens.store.schema import KV_COLUMNS
from mmlens.store.writes import BOUND_VALUES, bound_row, kv_row

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


_SQL = f"INSERT INTO kv_events ({KV_COLUMNS}) VALUES ({{}}) ON CONFLICT DO NOTHING"
MULTI = 32
# The batch-row design: one row per batch, its events' columns packed.
_BATCH_DDL = ("CREATE TABLE kv_batches (ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER "
              "NOT NULL, seq INTEGER NOT NULL, n_events INTEGER NOT NULL, stored INTEGER NOT "
              "NULL, removed INTEGER NOT NULL, events BLOB NOT NULL)",
              "CREATE UNIQUE INDEX kv_batches_key ON kv_batches (ts, worker, rank, seq)")
_BATCH_SQL = "INSERT INTO kv_batches VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING"

Chunks = list[list[tuple]]


def per_row(sql: str) -> Callable[[sqlite3.Connection, Chunks], None]:
    def write(db: sqlite3.Connection, chunks: Chunks) -> None:
        for rows in chunks:
            with db:
                db.executemany(sql, rows)
    return write


def multi_row(one: str, k: int) -> Callable[[sqlite3.Connection, Chunks], None]:
    many = _SQL.format(one).replace(f"({one})", ",".join([f"({one})"] * k))
    rest = _SQL.format(one)

    def write(db: sqlite3.Connection, chunks: Chunks) -> None:
        for rows in chunks:
            whole = len(rows) - len(rows) % k
            with db:
                for i in range(0, whole, k):
                    db.execute(many, list(chain.from_iterable(rows[i:i + k])))
                db.executemany(rest, rows[whole:])
    return write


def batch_rows(events: list[list]) -> Chunks:
    """Each batch's events packed into one row (the design, not the store)."""
    enc = msgspec.msgpack.Encoder()
    out = []
    for i in range(0, len(events), COMMIT_EVERY):
        rows = []
        for batch in events[i:i + COMMIT_EVERY]:
            if not batch:
                continue
            evs = [kv_row(ev) for ev in batch]
            ts, worker, rank, seq = evs[0][:4]
            rows.append((ts, worker, rank, seq, len(evs),
                         sum(r[5] for r in evs if r[4] == "stored"),
                         sum(r[5] for r in evs if r[4] == "removed"),
                         enc.encode([r[4:] for r in evs])))
        out.append(rows)
    return out


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
    bound = [list(map(bound_row, rows)) for rows in chunks]
    c0 = time.process_time()
    batches = batch_rows(events)
    pack_s = time.process_time() - c0
    n = sum(map(len, chunks))
    plain = per_row(_SQL.format(",".join("?" * 11)))
    schema3 = LAYOUTS["ts-led key (schema 3), 8 KiB pages"][1]
    ways = {name: (page, ddl, plain, chunks) for name, (page, ddl) in LAYOUTS.items()}
    ways["schema 3, 8 KiB, bound rows"] = (8192, schema3, per_row(_SQL.format(BOUND_VALUES)),
                                           bound)
    ways[f"schema 3, 8 KiB, bound, {MULTI} rows/statement"] = (
        8192, schema3, multi_row(BOUND_VALUES, MULTI), bound)
    ways["one row per batch (design)"] = (8192, list(_BATCH_DDL), per_row(_BATCH_SQL),
                                          batches)
    per_event: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (page, ddl, write, data)) in enumerate(ways.items()):
                db = sqlite3.connect(Path(tmp) / f"{r}-{i}.db")
                db.execute(f"PRAGMA page_size={page}")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                for stmt in ddl:
                    db.execute(stmt)
                per_event[name].append(cpu_time(
                    lambda db=db, write=write, data=data: write(db, data)) / n * 1e6)
                db.close()
    print(f"{n} events ({args.batches} batches), {args.rounds} rounds; CPU-µs per event, "
          "median (min–max):")
    for name, got in per_event.items():
        print(f"  {name:40s} {statistics.median(got):5.2f} ({min(got):.2f}–{max(got):.2f})")
    print(f"  (packing the batch rows, not timed above: {pack_s / n * 1e6:.2f} µs per event "
          "in Python)")


if __name__ == "__main__":
    main()
