"""The store's schema: its tables, its version and the in-place migration from schema 1."""

from __future__ import annotations

import sqlite3

# Tables are only ever added (CREATE … IF NOT EXISTS on every writable open), so adding one
# keeps the version: an older store gains it when a collector opens it, and readers treat a
# table that is not there yet as empty. Bump only for changes older code cannot read.
# 2: kv_events gained ``idx`` and a unique event key; health rows are per collector instance.
# 3: kv_events holds each event's content keys (``content``, one row per event instead of one
# in kv_events and one in kv_content); its unique key starts with ts and is its ts index too.
# 4: a decisions row holds one request's decisions of one write (``body``: a JSON array, in
# the order logged; ``ts``: the earliest of theirs), not one decision each.
SCHEMA_VERSION = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    ts REAL NOT NULL, target TEXT NOT NULL, name TEXT NOT NULL, labels TEXT NOT NULL,
    value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS samples_ts ON samples (ts);
CREATE INDEX IF NOT EXISTS samples_name_ts ON samples (name, ts);
CREATE TABLE IF NOT EXISTS kv_events (
    ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, n_blocks INTEGER NOT NULL, parent TEXT, hashes BLOB, images TEXT,
    idx INTEGER NOT NULL DEFAULT 0, content BLOB);
CREATE UNIQUE INDEX IF NOT EXISTS kv_events_ts_key ON kv_events (ts, worker, rank, seq, idx);
CREATE TABLE IF NOT EXISTS kv_state (
    worker TEXT NOT NULL, rank INTEGER NOT NULL, ts REAL NOT NULL, summary TEXT NOT NULL,
    PRIMARY KEY (worker, rank));
CREATE TABLE IF NOT EXISTS traces (
    ts REAL NOT NULL, request_id TEXT NOT NULL, router TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS traces_ts ON traces (ts);
CREATE INDEX IF NOT EXISTS traces_request_id ON traces (request_id);
CREATE TABLE IF NOT EXISTS decisions (
    ts REAL NOT NULL, request_id TEXT NOT NULL, router TEXT NOT NULL, source TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
CREATE INDEX IF NOT EXISTS decisions_request_id ON decisions (request_id);
CREATE TABLE IF NOT EXISTS trace_keys (key TEXT PRIMARY KEY, row INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS trace_keys_row ON trace_keys (row);
CREATE TABLE IF NOT EXISTS kv_views (
    ts REAL NOT NULL, worker TEXT NOT NULL, source TEXT NOT NULL, router_blocks INTEGER,
    engine_blocks INTEGER, router_only INTEGER NOT NULL, engine_only INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS kv_views_ts ON kv_views (ts);
CREATE TABLE IF NOT EXISTS health (
    collector TEXT NOT NULL, target TEXT NOT NULL, updated REAL NOT NULL,
    last_success REAL, last_error TEXT, last_error_ts REAL, errors TEXT NOT NULL,
    counters TEXT NOT NULL, instance TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (collector, target, instance));
"""

# The KV-event key. A publisher restarts its seq at 0, so (worker, rank, seq) alone would
# collide across restarts; the batch's wall-clock ts tells incarnations apart, and idx (the
# event's position in its batch) tells a batch's events apart. A batch stored twice (a replay
# after kill -9, a second collector, a resync after a reconnect) maps to the same keys.
# Led by ts, the key's index is also the ts index of reads and retention: one index, not two
# (SQLite, measured: ~15 % less CPU per stored event than a ts index beside the key).
KV_COLUMNS = "ts, worker, rank, seq, kind, n_blocks, parent, hashes, images, idx, content"
KV_KEY = ("ts", "worker", "rank", "seq", "idx")
# Schema 2 → 3, both backends: each event row takes the content keys kv_content held for it.
MOVE_CONTENT = ("UPDATE kv_events SET content = (SELECT c.content FROM kv_content c WHERE "
                + " AND ".join(f"c.{k} = kv_events.{k}" for k in KV_KEY) + ")")



def columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 → 2 in place: old KV rows get distinct negative idx values (they can never
    collide with new rows); health is rewritten every tick, so its table is recreated."""
    kv, health = columns(db, "kv_events"), columns(db, "health")
    if (not kv or "idx" in kv) and (not health or "instance" in health):
        return
    with db:
        if kv and "idx" not in kv:
            db.execute("ALTER TABLE kv_events ADD COLUMN idx INTEGER NOT NULL DEFAULT 0")
            db.execute("UPDATE kv_events SET idx = -rowid")
        if health and "instance" not in health:
            db.execute("DROP TABLE health")
        db.execute("UPDATE meta SET value='2' WHERE key='schema_version' AND value='1'")


def migrate_v2(db: sqlite3.Connection) -> None:
    """Schema 2 → 3 in place: the content keys of kv_content move into their event's row
    (``content``); the two kv_events indexes give way to the ts-led key (``SCHEMA``)."""
    kv = columns(db, "kv_events")
    if not kv or "content" in kv:
        return
    with db:
        db.execute("ALTER TABLE kv_events ADD COLUMN content BLOB")
        if columns(db, "kv_content"):
            db.execute(MOVE_CONTENT)
            db.execute("DELETE FROM kv_content")
        db.execute("DROP INDEX IF EXISTS kv_events_ts")
        db.execute("DROP INDEX IF EXISTS kv_events_key")
        db.execute("UPDATE meta SET value='3' WHERE key='schema_version' AND value='2'")


# Schema 3 → 4, both backends: each one-decision row becomes a row of one.
FOLD_DECISIONS = "UPDATE decisions SET body = '[' || body || ']'"


def migrate_v3(db: sqlite3.Connection) -> None:
    """Schema 3 → 4 in place: each decision's row holds it as a one-decision array. Read
    and rewritten under the write lock: two writers opening the store at once fold once."""
    if not columns(db, "meta"):
        return
    with db:
        db.execute("BEGIN IMMEDIATE")
        if db.execute("SELECT 1 FROM meta WHERE key='schema_version' AND value='3'"
                      ).fetchone() is None:
            return
        if columns(db, "decisions"):
            db.execute(FOLD_DECISIONS)
        db.execute("UPDATE meta SET value='4' WHERE key='schema_version' AND value='3'")

