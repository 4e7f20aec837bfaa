"""Store tables of the available-vs-achieved analysis (SQLite DDL here, PostgreSQL's in
``mmlens.store.postgres``).

- ``kv_content``: content keys that became known after their event was stored without them
  (``kv_events.content`` holds each event's own: the content keys the resident index
  computed and, for stored image blocks, their shape keys and image refs — what a replay
  needs, without token ids). Keyed like ``kv_events`` (ts, worker, rank, seq, idx), so keys
  handed over twice are kept once.
- ``availability``: one row per request (re-evaluating replaces it): its counts and the
  whole record as JSON;
- ``availability_cells``: the sums the aggregates need per (minute, router, model, worker),
  added to as requests are evaluated, so a page over 100k requests reads a few thousand rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from mmlens.records import Availability, BlockRemoved, BlockStored, KVEvent
from mmlens.store.dialect import SQLBase, StoreError, marks
from mmlens.store.tail import IdTail

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv_content (
    ts REAL NOT NULL, worker TEXT NOT NULL, rank INTEGER NOT NULL, seq INTEGER NOT NULL,
    idx INTEGER NOT NULL, kind TEXT NOT NULL, content BLOB);
CREATE UNIQUE INDEX IF NOT EXISTS kv_content_key ON kv_content (worker, rank, seq, ts, idx);
CREATE INDEX IF NOT EXISTS kv_content_ts ON kv_content (ts);
CREATE TABLE IF NOT EXISTS availability (
    ts REAL NOT NULL, request_id TEXT NOT NULL PRIMARY KEY, router TEXT NOT NULL,
    model TEXT NOT NULL, worker TEXT NOT NULL, block_size INTEGER NOT NULL,
    prompt INTEGER NOT NULL, best INTEGER NOT NULL, realized INTEGER NOT NULL,
    avoidable INTEGER NOT NULL, not_cacheable INTEGER NOT NULL, false_hit INTEGER NOT NULL,
    predicted INTEGER, images INTEGER NOT NULL, fidelity TEXT NOT NULL,
    load_spill INTEGER NOT NULL, content_blind INTEGER NOT NULL, stale_index INTEGER NOT NULL,
    count_drift INTEGER NOT NULL, unattributed INTEGER NOT NULL, evicted INTEGER NOT NULL,
    unexplained INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS availability_ts ON availability (ts);
CREATE TABLE IF NOT EXISTS availability_cells (
    ts REAL NOT NULL, router TEXT NOT NULL, model TEXT NOT NULL, worker TEXT NOT NULL,
    sums TEXT NOT NULL, PRIMARY KEY (ts, router, model, worker));
"""
CONTENT_COLUMNS = "ts, worker, rank, seq, idx, kind, content"
# A row's content keys go in where its event is stored without any (values from that row).
_UNKEYED = ("INSERT INTO kv_content (ts, worker, rank, seq, idx, kind, content) "
            "SELECT e.ts, e.worker, e.rank, e.seq, e.idx, e.kind, ? FROM kv_events e "
            "WHERE e.ts = ? AND e.worker = ? AND e.rank = ? AND e.seq = ? AND e.idx = ? "
            "AND e.content IS NULL ON CONFLICT DO NOTHING")
TABLES = ("kv_content", "availability", "availability_cells")
CAUSE_COLUMNS = ("load_spill", "content_blind", "stale_index", "count_drift", "unattributed",
                 "evicted", "unexplained")
_AVAILABILITY = ("ts", "request_id", "router", "model", "worker", "block_size", "prompt", "best",
                 "realized", "avoidable", "not_cacheable", "false_hit", "predicted", "images",
                 "fidelity", *CAUSE_COLUMNS, "body")

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
_sums = msgspec.json.Decoder(dict[str, int])


@dataclass(slots=True)
class KeyedRow:
    """A stored KV event as the availability replay reads it."""

    rowid: int
    ts: float
    unit: str  # worker, or worker#rank beyond rank 0
    kind: str
    keys: list[int]
    images: list[tuple[int, int, Any]]  # stored image blocks: (shape, key, refs)


def content_rows(events: Iterable[KVEvent]) -> list[tuple[Any, ...]]:
    """The ``kv_content`` rows of events the index gave content keys (a clear has none: its
    ``kv_events`` row is all the replay needs)."""
    return [(ev.ts, ev.worker, ev.rank, ev.seq, ev.idx, ev.kind, content_of(ev))
            for ev in events if getattr(ev, "keys", None)]


def content_of(ev: KVEvent) -> bytes | None:
    """The event's content keys as stored (msgpack), None where the index gave none."""
    if isinstance(ev, BlockStored):
        return stored_content(ev.keys, ev.images, ev.shapes, ev.prompt_end) \
            if ev.keys else None
    if isinstance(ev, BlockRemoved):
        return _enc.encode({"k": ev.keys}) if ev.keys else None
    return None


def stored_content(keys: list[int], images: list[Any] | None, shapes: list[int] | None,
                   prompt_end: int | None = None) -> bytes:
    """A store's content keys and, per image block, (shape key, content key, image refs);
    ``e``: where a prompt ended in a one-block store (``BlockStored.prompt_end``)."""
    blocks = [] if not (images and shapes) else [  # tuples: the same msgpack arrays as lists
        (shape, key, refs) for shape, key, refs in zip(shapes, keys, images, strict=False)
        if refs]
    if prompt_end is not None:
        return _enc.encode({"k": keys, "i": blocks, "e": prompt_end})
    return _enc.encode({"k": keys, "i": blocks})


class AvailabilityTables(SQLBase):
    """The tables' reads and writes, one SQL for every backend (a part of the store)."""

    def add_kv_content(self, events: Iterable[KVEvent]) -> int:
        """Content keys of events stored before without them (``kv_late``)."""
        rows = content_rows(events)
        if not rows:
            return 0
        self._before_append("kv_content", (r[0] for r in rows))
        with self._tx():
            return self._insert_new("kv_content", CONTENT_COLUMNS, rows)

    def add_keys_where_missing(self, rows: Sequence[Sequence[Any]]) -> None:
        """``kv_content`` rows (``CONTENT_COLUMNS``) of the events stored without content
        keys (the others have theirs in their row)."""
        args = [(r[6], r[0], r[1], r[2], r[3], r[4]) for r in rows]
        self._before_append("kv_content", (r[0] for r in rows))
        try:
            with self._tx():
                self._many(_UNKEYED, args)
            return
        except Exception as exc:
            if self.is_outage(exc) or isinstance(exc, StoreError):
                raise
        for one in args:  # a row the event table refused (counted there) has none to key
            try:
                with self._tx():
                    self._many(_UNKEYED, [one])
            except Exception as exc:
                if self.is_outage(exc):
                    raise

    def _insert_new(self, table: str, columns: str, rows: Sequence[Sequence[Any]],
                    values: str | None = None) -> int:
        """Insert the rows whose key is not stored yet, inside the caller's transaction
        (``values``: SQL of a row's VALUES, one ``?`` per column by default); returns the rows
        added (PostgreSQL: COPY, ``PostgresStore``)."""
        return self._many(f"INSERT INTO {table} ({columns}) VALUES "
                          f"({values or marks(len(rows[0]))}) ON CONFLICT DO NOTHING", rows)

    def kv_keyed_tail(self, tail: IdTail, limit: int = 50_000) -> list[KeyedRow]:
        """KV events with their content keys (none: ``keys`` empty) ``tail`` has not
        returned yet (up to ``limit`` new ones and any committed late, ``IdTail``), in the
        order they were stored."""
        return self._keyed_tail("kv_events", tail, limit)

    def kv_content_tail(self, tail: IdTail, limit: int = 50_000) -> list[KeyedRow]:
        """Like ``kv_keyed_tail``, the content keys that came late (``kv_content``)."""
        return self._keyed_tail("kv_content", tail, limit)

    def _keyed_tail(self, table: str, tail: IdTail, limit: int) -> list[KeyedRow]:
        out = []
        for rid, ts, worker, rank, kind, content in self._tail(
                table, f"{self.key}, ts, worker, rank, kind, content", tail, limit):
            body = _dec.decode(content) if content else {}
            out.append(KeyedRow(int(rid), float(ts), worker if not rank else f"{worker}#{rank}",
                                kind, body.get("k") or [],
                                [(s, k, tuple(tuple(r) for r in refs))
                                 for s, k, refs in body.get("i") or []]))
        return out

    def add_availability(self, results: Iterable[Availability]) -> int:
        rows = []
        for a in results:
            rows.append((a.ts, a.request_id, a.router, a.model, a.worker or "", a.block_size,
                         a.prompt_tokens, a.best_tokens, a.realized_tokens, a.avoidable_tokens,
                         a.not_cacheable_tokens, a.false_hit_tokens, a.predicted_tokens,
                         a.images, a.fidelity, *(a.causes.get(c, 0) for c in CAUSE_COLUMNS),
                         json.dumps(a.to_json(), default=str)))
        return self._upsert("availability", _AVAILABILITY, rows)

    def evaluated(self, request_ids: Sequence[str]) -> set[str]:
        return {r for (r,) in self._rows_by_ids("availability", "request_id", request_ids)}

    def add_cells(self, cells: dict[tuple[float, str, str, str], dict[str, int]]) -> None:
        """Add per-cell sums (``mmlens.analysis.availability.aggregate.SUMS``) to the stored
        cells."""
        if not cells:
            return
        with self._tx(exclusive=True):  # read, add, write: one writer at a time
            for key, sums in cells.items():
                old_text = self._one("SELECT sums FROM availability_cells WHERE ts=? AND "
                                     "router=? AND model=? AND worker=?", key)
                if old_text is not None:
                    old = json.loads(old_text)
                    sums = {k: old.get(k, 0) + v for k, v in sums.items()} | {
                        k: v for k, v in old.items() if k not in sums}
                self._exec("INSERT INTO availability_cells (ts, router, model, worker, sums) "
                           "VALUES (?,?,?,?,?) ON CONFLICT (ts, router, model, worker) "
                           "DO UPDATE SET sums = excluded.sums",
                           (*key, json.dumps(sums, separators=(",", ":"))))

    def cells(self, since: float, until: float | None = None,
              ) -> list[tuple[float, str, str, str, dict[str, int]]]:
        """Stored cells of the buckets starting in [since, until]."""
        sql = "SELECT ts, router, model, worker, sums FROM availability_cells WHERE ts >= ?"
        args: list[Any] = [since]
        if until is not None:
            sql += " AND ts <= ?"
            args.append(until)
        rows = self._rows_if_table(sql + " ORDER BY ts", args) or []
        return [(ts, r, m, w, _sums.decode(sums)) for ts, r, m, w, sums in rows]

    def latest_availability_ts(self) -> float | None:
        rows = self._rows_if_table("SELECT max(ts) FROM availability")
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def availability_rows(self, since: float, limit: int = 500) -> list[Availability]:
        """Whole records of the newest requests decided since ``since``."""
        rows = self._rows_if_table("SELECT body FROM availability WHERE ts >= ? "
                                   "ORDER BY ts DESC LIMIT ?", (since, limit)) or []
        out = []
        for (body,) in rows:
            try:
                out.append(msgspec.json.decode(body, type=Availability, strict=False))
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # a row this version cannot read stays stored
        return out
