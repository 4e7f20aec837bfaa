"""Read helpers the dashboard needs on top of ``mmlens.store.sqlite.Store``: bounded, index-friendly
queries (recent windows, one trace by id, KV-event buckets) so a page renders in
milliseconds on a store of 100k traces and millions of KV blocks.

The store's own API stays the collectors'; this module only reads (plus one optional index).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from mmlens.ingest.metrics_normalize import normalize_samples
from mmlens.ingest.router_logs import request_keys
from mmlens.records import MetricSample
from mmlens.store.decisions import attach, trace_keys
from mmlens.store.sqlite import Store, StoreError

_dec = msgspec.msgpack.Decoder()


def ensure_read_indexes(path: str | Path) -> bool:
    """Index traces by request id (deep links ``?request=<id>``). Needs write access; a
    reader without it falls back to scanning the recent window. Returns True when present."""
    try:
        db = sqlite3.connect(str(path), timeout=5.0)
        try:
            db.execute("CREATE INDEX IF NOT EXISTS traces_request_id ON traces (request_id)")
            db.commit()
        finally:
            db.close()
        return True
    except sqlite3.Error:
        return False


class StoreReader:
    """A read-only store connection shared by the dashboard's sessions (one lock: sqlite3
    connections are not meant for concurrent use from several threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.store = Store(self.path, readonly=True)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return self.store.db.execute(sql, list(args)).fetchall()

    # --- traces ----------------------------------------------------------------------------

    def recent_traces(self, limit: int = 300) -> list[dict[str, Any]]:
        """The newest traces, each with the decisions router logs gave for it."""
        return self.with_decisions([json.loads(body) for (body,) in self._rows(
            "SELECT body FROM traces ORDER BY ts DESC LIMIT ?", (limit,))])

    def traces_before(self, ts: float, limit: int = 500) -> list[dict[str, Any]]:
        """The ``limit`` traces recorded just before ``ts`` (a request's history)."""
        return [json.loads(body) for (body,) in self._rows(
            "SELECT body FROM traces WHERE ts < ? ORDER BY ts DESC LIMIT ?", (ts, limit))]

    def removals(self, since: float, until: float) -> list[dict[str, Any]]:
        """KV removals and clears between two times (what eviction is judged on)."""
        rows = self._rows(
            "SELECT ts, worker, kind, n_blocks FROM kv_events WHERE ts BETWEEN ? AND ? "
            "AND kind IN ('removed', 'cleared')", (since, until))
        return [{"ts": ts, "worker": w, "kind": k, "n_blocks": n} for ts, w, k, n in rows]

    def kv_blocks(self, worker: str, kind: str, since: float, until: float) -> int:
        """Blocks one worker stored (or removed) between two times, from its KV events."""
        row = self._rows("SELECT sum(n_blocks) FROM kv_events WHERE worker = ? AND kind = ? "
                         "AND ts BETWEEN ? AND ?", (worker, kind, since, until))
        return int(row[0][0] or 0) if row else 0

    def first_stored_parent(self, worker: str, since: float, until: float) -> str | None:
        """The parent hash of the first block a worker stored in a time window (None: the
        chain starts at the root, or nothing was stored)."""
        row = self._rows("SELECT parent FROM kv_events WHERE worker = ? AND kind = 'stored' "
                         "AND ts BETWEEN ? AND ? ORDER BY ts, rowid LIMIT 1",
                         (worker, since, until))
        return row[0][0] if row else None

    def has_kv_events(self, worker: str) -> bool:
        return bool(self._rows("SELECT 1 FROM kv_events WHERE worker = ? LIMIT 1", (worker,)))

    def traces_between(self, since: float, until: float, limit: int = 1000,
                       ) -> list[dict[str, Any]]:
        return [json.loads(body) for (body,) in self._rows(
            "SELECT body FROM traces WHERE ts BETWEEN ? AND ? ORDER BY ts LIMIT ?",
            (since, until, limit))]

    def trace(self, request_id: str) -> dict[str, Any] | None:
        """A trace by its request id, or by any other id it is known by (response id,
        engine id, trace id: see ``mmlens.ingest.observed.keys_of``)."""
        rows = self._rows("SELECT body FROM traces WHERE request_id = ? "
                          "ORDER BY ts DESC LIMIT 1", (request_id,))
        if not rows:
            keys = [*sorted(request_keys(request_id, request_id)), "trace:" + request_id]
            try:
                rows = self._rows("SELECT t.body FROM trace_keys k JOIN traces t "
                                  f"ON t.rowid = k.row WHERE k.key IN ({','.join('?' * len(keys))})"
                                  " LIMIT 1", keys)
            except sqlite3.OperationalError:  # an older store without the key table
                rows = []
        return self.with_decisions([json.loads(rows[0][0])])[0] if rows else None

    # --- routing decisions from router logs ---------------------------------------------------

    def decisions_for(self, request_id: str, response_id: str | None = None,
                      ) -> list[dict[str, Any]]:
        """Decisions logged for one request (by its id, or its response id: SMG gRPC answers
        ``<rid>-<uuid>``, Dynamo ``chatcmpl-<id>``)."""
        keys = trace_keys({"request_id": request_id, "response_id": response_id})
        with self.lock:
            return self.store.decisions(sorted(keys))

    def decisions_for_traces(self, traces: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Decisions logged for any of ``traces``, in one bounded query."""
        keys = sorted({k for t in traces for k in trace_keys(t)})
        if not keys:
            return []
        with self.lock:
            return self.store.decisions(keys)

    def with_decisions(self, traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
        attach(traces, self.decisions_for_traces(traces))
        return traces

    def has_request_index(self) -> bool:
        return bool(self._rows("SELECT 1 FROM sqlite_master WHERE type='index' "
                               "AND name='traces_request_id'"))

    def trace_count(self) -> int:
        # max(rowid) is O(1); traces are append-only apart from pruning the oldest.
        row = self._rows("SELECT max(rowid) FROM traces")
        return int(row[0][0] or 0)

    # --- metrics -----------------------------------------------------------------------------

    def latest_sample_ts(self) -> float | None:
        row = self._rows("SELECT max(ts) FROM samples")
        return row[0][0] if row else None

    def samples(self, since: float, names: Sequence[str] | None = None) -> list[MetricSample]:
        with self.lock:
            return self.store.samples_since(since, names)

    def normalized(self, window_s: float = 300.0) -> dict[str, Any]:
        latest = self.latest_sample_ts()
        if latest is None:
            return normalize_samples([]).to_json()
        return normalize_samples(self.samples(latest - window_s)).to_json()

    # --- KV events ---------------------------------------------------------------------------

    def latest_kv_ts(self) -> float | None:
        row = self._rows("SELECT max(ts) FROM kv_events")
        return row[0][0] if row else None

    def kv_timeline(self, window_s: float = 900.0, bucket_s: float = 10.0,
                    ) -> list[tuple[float, str, str, int]]:
        """Blocks per (bucket, worker, kind) over the last ``window_s`` of events."""
        latest = self.latest_kv_ts()
        if latest is None:
            return []
        rows = self._rows(
            "SELECT CAST(ts / ? AS INTEGER) * ?, worker, kind, sum(n_blocks) FROM kv_events "
            "WHERE ts >= ? GROUP BY 1, 2, 3 ORDER BY 1", (bucket_s, bucket_s, latest - window_s))
        return [(float(b), w, k, int(n or 0)) for b, w, k, n in rows]

    def recent_kv_events(self, limit: int = 300) -> list[dict[str, Any]]:
        out = []
        for ts, worker, rank, seq, kind, n, parent, hashes, images in self._rows(
                "SELECT ts, worker, rank, seq, kind, n_blocks, parent, hashes, images "
                "FROM kv_events ORDER BY ts DESC LIMIT ?", (limit,)):
            out.append({"ts": ts, "worker": worker, "rank": rank, "seq": seq, "kind": kind,
                        "n_blocks": n, "parent": _int_or_str(parent),
                        "block_hashes": _dec.decode(hashes) if hashes else [],
                        "images": json.loads(images) if images else []})
        return out

    def kv_state(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.store.kv_state()

    def kv_views(self, since: float) -> list[tuple[float, str, str, int | None, int | None, int,
                                                   int]]:
        """Router view vs engine holdings per worker since ``since`` (an older store: none)."""
        try:
            return [tuple(r) for r in self._rows(  # type: ignore[misc]
                "SELECT ts, worker, source, router_blocks, engine_blocks, router_only, "
                "engine_only FROM kv_views WHERE ts >= ? ORDER BY ts", (since,))]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise

    def scrape_times(self, since: float, targets: Sequence[str]) -> dict[str, list[float]]:
        """When each of ``targets`` was scraped since ``since`` (liveness needs the scrapes
        that listed no worker too)."""
        if not targets:
            return {}
        rows = self._rows(
            f"SELECT DISTINCT target, ts FROM samples WHERE ts >= ? AND target IN "
            f"({','.join('?' * len(targets))})", (since, *targets))
        out: dict[str, list[float]] = {}
        for target, ts in rows:
            out.setdefault(target, []).append(ts)
        return out

    # --- health and meta ----------------------------------------------------------------------

    def health(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.store.health()

    def meta(self, key: str) -> Any:
        with self.lock:
            return self.store.meta(key)

    def snapshot(self, window_s: float = 300.0, n_traces: int = 200) -> dict[str, Any]:
        """The parts of ``mmlens.store.snapshot.build_snapshot`` the pages use, without its full
        KV-event table scan."""
        norm = self.normalized(window_s)
        health = self.health()
        endpoints = {h["target"]: {
            "last_success": h["last_success"], "errors": h["errors"],
            **{k: h["counters"].get(k, 0) for k in (
                "batches", "events", "gaps", "missed_batches", "replays",
                "replayed_batches", "restarts")},
            "mean_lag_s": h["counters"].get("mean_lag_s")}
            for h in health if h["collector"] == "kv_events"}
        return {
            "generated_at": time.time(),
            "latest_sample_ts": self.latest_sample_ts(),
            "targets": self.meta("targets"),
            "router_state": self.meta("router_state"),
            "health": health,
            "flavors": norm["flavors"],
            "hit_rates": norm["hit_rates"],
            "mm_processing": norm["mm_processing"],
            "cache_aware_branches": norm["cache_aware_branches"],
            "worker_requests": norm["worker_requests"],
            "dynamo": norm["dynamo"],
            "worker_health": norm["worker_health"],
            "router_kv_event_health": norm["kv_event_health"],
            "kv_event_health": {"endpoints": endpoints},
            "traces": self.recent_traces(n_traces),
        }


def _int_or_str(value: str | None) -> int | str | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def open_reader(path: str | Path | None) -> StoreReader:
    if not path:
        raise StoreError("no store configured (set MMLENS_DB or start `mmlens dashboard`)")
    return StoreReader(path)
