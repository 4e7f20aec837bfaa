"""The embedded store: one SQLite file in WAL mode (collector writes, dashboard reads).

Holds metric samples, compact KV events (one row per event, hashes as msgpack), the latest
resident-block summary per worker, request traces (JSON), routing decisions from router logs
(JSON, keyed by request id, joined to traces when read) and collector health. Reads return
typed records (``mmlens.records``); ``mmlens.store.codec`` decodes the stored JSON.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mmlens.ingest import observed
from mmlens.ingest.router_logs import request_keys
from mmlens.records import (
    BlockRemoved,
    BlockStored,
    CollectorHealth,
    KVEvent,
    KVEventRow,
    MetricSample,
    RequestTrace,
    ResidentSummary,
    RoutingDecision,
)
from mmlens.store import availability, codec
from mmlens.store.schema import KV_COLUMNS, SCHEMA, SCHEMA_VERSION, columns, migrate_v1

__all__ = ["SCHEMA_VERSION", "Store", "StoreError"]

PRUNED_TABLES = ("samples", "kv_events", "traces", "decisions", "kv_views",
                 *availability.TABLES)

_enc = msgspec.msgpack.Encoder()


class StoreError(RuntimeError):
    pass


class Store:
    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = str(path)
        if readonly:
            if not Path(self.path).exists():
                raise StoreError(f"no store at {self.path}")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0,
                                      check_same_thread=False)
        else:
            self.db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            migrate_v1(self.db)
            self.db.executescript(SCHEMA)
            self.db.executescript(availability.SCHEMA)
            self._check_version()
        self.db.execute("PRAGMA busy_timeout=5000")

    def _columns(self, table: str) -> set[str]:
        return columns(self.db, table)

    def _check_version(self) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            with self.db:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"store schema {row[0]}, this mmlens expects {SCHEMA_VERSION}")

    def schema_version(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.db.close()

    # --- writes -----------------------------------------------------------------------------

    def set_meta(self, key: str, value: Any) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def add_samples(self, samples: Iterable[MetricSample]) -> int:
        rows = [(s.ts, s.target, s.name, json.dumps(dict(s.labels), separators=(",", ":")),
                 s.value) for s in samples]
        with self.db:
            self.db.executemany("INSERT INTO samples VALUES (?,?,?,?,?)", rows)
        return len(rows)

    def add_kv_events(self, events: Iterable[KVEvent]) -> int:
        """Store events idempotently (see ``KV_COLUMNS``), with their content keys; returns
        the rows actually added, so events already stored are not counted twice."""
        events = list(events)
        availability.add_kv_content(self.db, events)
        rows = []
        for ev in events:
            if isinstance(ev, BlockStored):
                images = None
                if ev.images:
                    images = json.dumps(sorted({r[0] for refs in ev.images if refs
                                                for r in refs}))
                rows.append((ev.ts, ev.worker, ev.rank, ev.seq, "stored", len(ev.block_hashes),
                             None if ev.parent is None else str(ev.parent),
                             _enc.encode(ev.block_hashes), images, ev.idx))
            elif isinstance(ev, BlockRemoved):
                rows.append((ev.ts, ev.worker, ev.rank, ev.seq, "removed", len(ev.block_hashes),
                             None, _enc.encode(ev.block_hashes), None, ev.idx))
            else:
                rows.append((ev.ts, ev.worker, ev.rank, ev.seq, "cleared", 0, None, None, None,
                             ev.idx))
        with self.db:
            cur = self.db.executemany(
                f"INSERT OR IGNORE INTO kv_events ({KV_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                rows)
        return max(cur.rowcount, 0)

    def add_kv_views(self, points: Iterable[Any]) -> int:
        """Router view vs engine holdings (``mmlens.analysis.kv_divergence.ViewPoint``)."""
        rows = [(p.ts, p.worker, p.source, p.router_blocks, p.engine_blocks, p.router_only,
                 p.engine_only) for p in points]
        with self.db:
            self.db.executemany("INSERT INTO kv_views VALUES (?,?,?,?,?,?,?)", rows)
        return len(rows)

    def set_kv_state(self, summary: dict[str, dict[str, Any]], ts: float) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO kv_state VALUES (?,?,?,?)",
                [(s["worker"], s["rank"], ts, json.dumps(s)) for s in summary.values()])

    def add_traces(self, traces: Iterable[RequestTrace]) -> int:
        """Store traces, one row per request: a trace sharing a key (request id, response
        id, engine id, trace id) with a stored one is merged into it
        (``mmlens.ingest.observed.merge``), whichever source wrote first."""
        n = 0
        with self.db:
            # One writer at a time from the read of matching rows to the write: the tap and
            # the collector may record the same request from two processes.
            if not self.db.in_transaction:
                self.db.execute("BEGIN IMMEDIATE")
            for t in traces:
                self._upsert(t)
                n += 1
        return n

    def _upsert(self, t: RequestTrace) -> None:
        matches = [(row, old) for row, old in self._rows_sharing_keys(t)
                   if observed.same_request(old, t)]
        if not matches:
            cur = self.db.execute("INSERT INTO traces VALUES (?,?,?,?)", (
                t.ts, t.request_id, t.router, codec.trace_body(t)))
            self._index_keys(t, int(cur.lastrowid or 0))
            return
        merged = matches[0][1]
        for _, old in matches[1:]:
            merged = observed.merge(merged, old)
        t = observed.merge(merged, t)
        keep, extra = matches[0][0], [row for row, _ in matches[1:]]
        self.db.execute("UPDATE traces SET ts=?, request_id=?, router=?, body=? WHERE rowid=?",
                        (t.ts, t.request_id, t.router, codec.trace_body(t), keep))
        if extra:  # `t` joined records that were apart so far
            marks = ",".join("?" * len(extra))
            self.db.execute(f"DELETE FROM traces WHERE rowid IN ({marks})", extra)
            self.db.execute(f"UPDATE trace_keys SET row=? WHERE row IN ({marks})",
                            [keep, *extra])
        self._index_keys(t, keep)

    def _rows_sharing_keys(self, t: RequestTrace) -> list[tuple[int, RequestTrace]]:
        keys = sorted(observed.keys_of(t))
        rows = sorted({r for (r,) in self.db.execute(
            f"SELECT row FROM trace_keys WHERE key IN ({','.join('?' * len(keys))})", keys)})
        if not rows:
            return []
        out = []
        for rowid, body in self.db.execute(
                f"SELECT rowid, body FROM traces WHERE rowid IN ({','.join('?' * len(rows))})"
                " ORDER BY rowid", rows):
            old = codec.trace(body)
            if old is not None:  # an unreadable row is left as it is
                out.append((int(rowid), old))
        return out

    def _index_keys(self, t: RequestTrace, row: int) -> None:
        self.db.executemany("INSERT OR REPLACE INTO trace_keys VALUES (?, ?)",
                            [(k, row) for k in observed.keys_of(t)])

    def add_decisions(self, decisions: Iterable[RoutingDecision], ts: float | None = None,
                      ) -> int:
        """Routing decisions read from router logs; ``ts`` stands in where a decision has
        no time of its own."""
        now = time.time() if ts is None else ts
        rows = [(now if d.ts is None else d.ts, d.request_id, d.router, d.source,
                 codec.decision_body(d)) for d in decisions]
        with self.db:
            self.db.executemany("INSERT INTO decisions VALUES (?,?,?,?,?)", rows)
        return len(rows)

    def set_health(self, items: Iterable[CollectorHealth], ts: float | None = None,
                   instance: str = "") -> None:
        """Health rows of one collector process (``instance``): two collectors writing to one
        store keep a row each instead of overwriting the other's."""
        ts = time.time() if ts is None else ts
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO health VALUES (?,?,?,?,?,?,?,?,?)",
                [(h.collector, h.target, ts, h.last_success, h.last_error, h.last_error_ts,
                  json.dumps(h.errors), json.dumps(h.counters), instance) for h in items])

    def prune(self, retention_s: float, max_bytes: float, now: float | None = None) -> int:
        """Drop rows older than ``retention_s``; then, while the live data is larger than
        ``max_bytes``, the oldest tenth of samples and KV events. Returns rows deleted."""
        now = time.time() if now is None else now
        cutoff = now - retention_s
        deleted = 0
        with self.db:
            for table in PRUNED_TABLES:
                deleted += self.db.execute(f"DELETE FROM {table} WHERE ts < ?", (cutoff,)).rowcount
            self._prune_keys()
        for _ in range(20):
            if self.used_bytes() <= max_bytes:
                break
            with self.db:
                for table in PRUNED_TABLES:
                    n = self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    if n:
                        deleted += self.db.execute(
                            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                            "ORDER BY ts LIMIT ?)", (max(1, n // 10),)).rowcount
                self._prune_keys()
        return deleted

    def _prune_keys(self) -> None:
        self.db.execute("DELETE FROM trace_keys WHERE row NOT IN (SELECT rowid FROM traces)")

    def used_bytes(self) -> int:
        page_size = self.db.execute("PRAGMA page_size").fetchone()[0]
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        free = self.db.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

    # --- reads ------------------------------------------------------------------------------

    def samples_since(self, since: float, names: Sequence[str] | None = None,
                      ) -> list[MetricSample]:
        sql = "SELECT ts, target, name, labels, value FROM samples WHERE ts >= ?"
        args: list[Any] = [since]
        if names:
            sql += f" AND name IN ({','.join('?' * len(names))})"
            args += list(names)
        parsed: dict[str, tuple[tuple[str, str], ...]] = {}
        out = []
        for ts, target, name, labels, value in self.db.execute(sql, args):
            pairs = parsed.get(labels)
            if pairs is None:
                pairs = parsed[labels] = tuple(sorted(json.loads(labels).items()))
            out.append(MetricSample(target, name, pairs, value, ts))
        return out

    def latest_sample_ts(self) -> float | None:
        row = self.db.execute("SELECT max(ts) FROM samples").fetchone()
        return row[0] if row else None

    def kv_state(self) -> list[ResidentSummary]:
        out = []
        for ts, summary in self.db.execute(
                "SELECT ts, summary FROM kv_state ORDER BY worker, rank"):
            row = codec.resident(summary, ts)
            if row is not None:
                out.append(row)
        return out

    def kv_event_rows(self, limit: int | None = 100, *, since: float | None = None,
                      until: float | None = None, kinds: Sequence[str] = (),
                      hashes: bool = True) -> list[KVEventRow]:
        """Stored KV events, newest first; ``hashes=False`` skips decoding block hashes (a
        window of removals needs only counts)."""
        where, args = [], []
        if since is not None:
            where.append("ts >= ?")
            args.append(since)
        if until is not None:
            where.append("ts <= ?")
            args.append(until)
        if kinds:
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += list(kinds)
        sql = ("SELECT ts, worker, rank, seq, kind, n_blocks, parent, "
               f"{'hashes' if hashes else 'NULL'}, images FROM kv_events")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY ts DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [codec.kv_row(row) for row in self.db.execute(sql, args)]

    def kv_event_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for worker, kind, n, blocks in self.db.execute(
                "SELECT worker, kind, count(*), sum(n_blocks) FROM kv_events "
                "GROUP BY worker, kind"):
            w = out.setdefault(worker, {})
            w[f"{kind}_events"] = n
            w[f"{kind}_blocks"] = blocks or 0
        return out

    def traces(self, limit: int = 20, before: float | None = None) -> list[RequestTrace]:
        """The newest ``limit`` traces (those recorded before ``before`` when given), newest
        first, as recorded: logged decisions are joined by ``StoreReader``."""
        if before is None:
            rows = self.db.execute(
                "SELECT body FROM traces ORDER BY ts DESC, rowid DESC LIMIT ?", (limit,))
        else:
            rows = self.db.execute("SELECT body FROM traces WHERE ts < ? "
                                   "ORDER BY ts DESC, rowid DESC LIMIT ?", (before, limit))
        return codec.traces(body for (body,) in rows)

    def traces_between(self, since: float, until: float, limit: int = 1000,
                       ) -> list[RequestTrace]:
        """Traces from ``since`` to ``until``, oldest first."""
        return codec.traces(body for (body,) in self.db.execute(
            "SELECT body FROM traces WHERE ts BETWEEN ? AND ? ORDER BY ts LIMIT ?",
            (since, until, limit)))

    def trace(self, request_id: str) -> RequestTrace | None:
        rows = self.db.execute("SELECT body FROM traces WHERE request_id = ? "
                               "ORDER BY ts DESC, rowid DESC LIMIT 1", (request_id,)).fetchall()
        found = codec.traces(body for (body,) in rows)
        return found[0] if found else None

    def trace_by_key(self, key: str) -> RequestTrace | None:
        """The trace known by ``key`` as another id (response id, engine id, trace id)."""
        keys = [*sorted(request_keys(key, key)), "trace:" + key]
        try:
            rows = self.db.execute(
                "SELECT t.body FROM trace_keys k JOIN traces t ON t.rowid = k.row "
                f"WHERE k.key IN ({','.join('?' * len(keys))}) LIMIT 1", keys).fetchall()
        except sqlite3.OperationalError:  # an older store without the key table
            return None
        found = codec.traces(body for (body,) in rows)
        return found[0] if found else None

    def trace_count(self) -> int:
        # max(rowid) is O(1); traces are append-only apart from pruning the oldest.
        row = self.db.execute("SELECT max(rowid) FROM traces").fetchone()
        return int(row[0] or 0)

    def decisions(self, request_ids: Sequence[str]) -> list[RoutingDecision]:
        """Decisions logged under any of ``request_ids``, oldest first (an older store without
        the table has none)."""
        out: list[RoutingDecision] = []
        ids = list(dict.fromkeys(request_ids))
        for start in range(0, len(ids), 500):  # below SQLite's bound-parameter limit
            chunk = ids[start:start + 500]
            try:
                rows = self.db.execute(
                    f"SELECT body FROM decisions WHERE request_id IN ({','.join('?' * len(chunk))})"
                    " ORDER BY ts, rowid", chunk).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise
            out += codec.decisions(body for (body,) in rows)
        out.sort(key=lambda d: d.ts or 0.0)  # stable: rowid order within a timestamp
        return out

    def health(self) -> list[CollectorHealth]:
        # SELECT *: a read-only schema-1 store has no instance column yet.
        return [CollectorHealth(*row[:6], errors=codec.json_dict(row[6]),
                                counters=codec.json_dict(row[7]),
                                instance=row[8] if len(row) > 8 else "")
                for row in self.db.execute(
                    "SELECT * FROM health ORDER BY collector, target, instance"
                    if "instance" in self._columns("health") else
                    "SELECT * FROM health ORDER BY collector, target")]

    def meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None
