"""The store's reads, one SQL for every backend, returning typed records (``mmlens.records``;
``mmlens.store.codec`` decodes the stored JSON). Bounded and index-friendly: recent windows,
one trace by id, KV-event buckets, so a page renders in milliseconds on a large store."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, cast

from mmlens.ingest.metric_series import Series
from mmlens.ingest.router_logs import request_keys
from mmlens.records import (
    CollectorHealth,
    KVEventRow,
    Labels,
    MetricSample,
    RequestTrace,
    ResidentSummary,
    RoutingDecision,
)
from mmlens.store import codec
from mmlens.store.dialect import SQLBase, marks

ViewRow = tuple[float, str, str, int | None, int | None, int, int]


class StoreReads(SQLBase):
    def schema_version(self) -> int:
        found = self._one("SELECT value FROM meta WHERE key='schema_version'")
        return int(found) if found is not None else 0

    def meta(self, key: str) -> Any:
        found = self._one("SELECT value FROM meta WHERE key=?", (key,))
        return json.loads(found) if found is not None else None

    def quarantined(self) -> list[dict[str, Any]]:
        """The latest bad items each collector process set aside (``set_quarantined``)."""
        out: list[dict[str, Any]] = []
        for key, value in self._rows(
                "SELECT key, value FROM meta WHERE key LIKE ? ORDER BY key", ("quarantine:%",)):
            items = json.loads(value)
            out += [{**item, "instance": key.split(":", 1)[1]} for item in items
                    if isinstance(item, dict)] if isinstance(items, list) else []
        return out

    def health(self) -> list[CollectorHealth]:
        has_instance = "instance" in self._columns("health")  # not in a schema-1 store
        cols = ("collector, target, updated, last_success, last_error, last_error_ts, errors, "
                "counters" + (", instance" if has_instance else ""))
        order = "collector, target" + (", instance" if has_instance else "")
        return [CollectorHealth(*row[:6], errors=codec.json_dict(row[6]),
                                counters=codec.json_dict(row[7]),
                                instance=row[8] if has_instance else "")
                for row in self._rows(f"SELECT {cols} FROM health ORDER BY {order}")]

    # --- metrics ------------------------------------------------------------------------------

    def samples_since(self, since: float, names: Sequence[str] | None = None,
                      ) -> list[MetricSample]:
        return [MetricSample(target, name, labels, value, ts)
                for ts, target, name, labels, value in self._sample_rows(since, names)]

    def series_since(self, since: float, names: Sequence[str] | None = None,
                     prefixes: Sequence[str] = (), until: float | None = None) -> Series:
        """The same window as series (``mmlens.ingest.metric_series.to_series``), built
        without a record per sample (a fleet's five minutes are 300k+ samples); ``names``
        and ``prefixes``: only those names and the names starting with one of them; ``until``:
        the samples before it only."""
        series: Series = {}
        for ts, target, name, labels, value in self._sample_rows(since, names, prefixes,
                                                                 until):
            points = series.get((target, name, labels))
            if points is None:
                points = series[(target, name, labels)] = []
            points.append((ts, value))
        for points in series.values():
            points.sort()
        return series

    def sample_names(self, since: float) -> dict[str, set[str]]:
        """The metric names each target exposed since ``since``."""
        out: dict[str, set[str]] = {}
        for target, name in self._rows("SELECT DISTINCT target, name FROM samples WHERE ts >= ?",
                                       (since,)):
            out.setdefault(target, set()).add(name)
        return out

    def _sample_rows(self, since: float, names: Sequence[str] | None,
                     prefixes: Sequence[str] = (), until: float | None = None,
                     ) -> Iterator[tuple[float, str, str, Labels, float]]:
        # one query per name set and per prefix: ORed together no index serves them, and
        # every sample of the window is read to keep a few (the 100k-request store's 5
        # minutes: 24,766 samples read for 488)
        sql = "SELECT ts, target, name, labels, value FROM samples WHERE ts >= ?"
        args: list[Any] = [since]
        if until is not None:
            sql += " AND ts < ?"
            args.append(until)
        queries: list[tuple[str, list[Any], Sequence[str]]] = []  # SQL, args, prefixes
        if names:
            queries.append((f"{sql} AND name IN ({marks(len(names))})", [*args, *names], ()))
        for i, prefix in enumerate(prefixes):
            match, more = self._prefix("name", prefix)
            queries.append((f"{sql} AND {match}", [*args, *more], prefixes[:i]))
        if not queries:
            queries.append((sql, args, ()))
        listed = set(names or ())
        rows = []
        for i, (q, a, earlier) in enumerate(queries):
            fresh = self._rows(q, a)
            if i:  # a row an earlier query gave is not read twice
                fresh = [r for r in fresh if r[2] not in listed and not r[2].startswith(
                    tuple(earlier))]
            rows += fresh
        parsed: dict[str, Labels] = {}
        for ts, target, name, labels, value in rows:
            pairs = parsed.get(labels)
            if pairs is None:
                pairs = parsed[labels] = tuple(sorted(json.loads(labels).items()))
            yield ts, target, name, pairs, value

    def latest_ts(self, table: str) -> float | None:
        """The newest ``ts`` in an append-only table (``samples``, ``kv_events``…)."""
        found = self._one(f"SELECT max(ts) FROM {table}")
        return None if found is None else float(found)

    def latest_sample_ts(self) -> float | None:
        return self.latest_ts("samples")

    def last_samples(self, since: float, names: Sequence[str]) -> list[MetricSample]:
        """Per series of ``names`` and each value it took since ``since``, the newest such
        sample: one row per series and value, however many scrapes the window holds."""
        if not names:
            return []
        rows = self._rows(
            "SELECT max(ts), target, name, labels, value FROM samples WHERE ts >= ? AND name IN "
            f"({marks(len(names))}) GROUP BY target, name, labels, value", (since, *names))
        return [MetricSample(target, name, tuple(sorted(json.loads(labels).items())), value, ts)
                for ts, target, name, labels, value in rows]

    def scrape_times(self, since: float, targets: Sequence[str]) -> dict[str, list[float]]:
        """When each of ``targets`` was scraped since ``since``."""
        if not targets:
            return {}
        out: dict[str, list[float]] = {}
        for target, ts in self._rows(
                f"SELECT DISTINCT target, ts FROM samples WHERE ts >= ? AND target IN "
                f"({marks(len(targets))})", (since, *targets)):
            out.setdefault(target, []).append(ts)
        return out

    # --- KV events ----------------------------------------------------------------------------

    def kv_state(self) -> list[ResidentSummary]:
        out = []
        for ts, summary in self._rows("SELECT ts, summary FROM kv_state ORDER BY worker, rank"):
            row = codec.resident(summary, ts)
            if row is not None:
                out.append(row)
        return out

    def kv_state_times(self) -> list[tuple[str, int, float]]:
        """(worker, rank, when its summary was last written) per worker rank."""
        return [(str(w), int(r), float(ts))
                for w, r, ts in self._rows("SELECT worker, rank, ts FROM kv_state")]

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
            where.append(f"kind IN ({marks(len(kinds))})")
            args += list(kinds)
        sql = ("SELECT ts, worker, rank, seq, kind, n_blocks, parent, "
               f"{'hashes' if hashes else 'NULL'}, images FROM kv_events")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY ts DESC, {self.key} DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [codec.kv_row(row) for row in self._rows(sql, args)]

    def kv_event_counts(self) -> dict[str, dict[str, int]]:
        """Events and blocks per worker and kind over the whole store (a full scan)."""
        out: dict[str, dict[str, int]] = {}
        for worker, kind, n, blocks in self._rows(
                "SELECT worker, kind, count(*), sum(n_blocks) FROM kv_events "
                "GROUP BY worker, kind"):
            w = out.setdefault(worker, {})
            w[f"{kind}_events"] = int(n)
            w[f"{kind}_blocks"] = int(blocks or 0)
        return out

    def kv_timeline(self, since: float, bucket_s: float, until: float | None = None,
                    ) -> list[tuple[float, str, str, int]]:
        """Blocks per (bucket, worker, kind) of the events since ``since`` (and before
        ``until``)."""
        upto = "" if until is None else " AND ts < ?"
        args = (bucket_s, bucket_s, since) + (() if until is None else (until,))
        rows = self._rows(
            f"SELECT {self._bucket('ts')}, worker, kind, sum(n_blocks) FROM kv_events "
            f"WHERE ts >= ?{upto} GROUP BY 1, 2, 3 ORDER BY 1", args)
        return [(float(b), w, k, int(n or 0)) for b, w, k, n in rows]

    def kv_blocks(self, worker: str, kind: str, since: float, until: float) -> int:
        """Blocks one worker stored (or removed) between two times, from its KV events."""
        found = self._one("SELECT sum(n_blocks) FROM kv_events WHERE worker = ? AND kind = ? "
                          "AND ts BETWEEN ? AND ?", (worker, kind, since, until))
        return int(found or 0)

    def first_stored_parent(self, worker: str, since: float, until: float) -> str | None:
        """The parent hash of the first block a worker stored in a time window (None: the
        chain starts at the root, or nothing was stored)."""
        found = self._one(
            "SELECT parent FROM kv_events WHERE worker = ? AND kind = 'stored' "
            f"AND ts BETWEEN ? AND ? ORDER BY ts, {self.key} LIMIT 1", (worker, since, until))
        return None if found is None else str(found)

    def has_kv_events(self, worker: str) -> bool:
        return bool(self._rows("SELECT 1 FROM kv_events WHERE worker = ? LIMIT 1", (worker,)))

    def kv_views(self, since: float) -> list[ViewRow]:
        """Router view vs engine holdings per worker since ``since`` (an older store: none)."""
        rows = self._rows_if_table(
            "SELECT ts, worker, source, router_blocks, engine_blocks, router_only, "
            "engine_only FROM kv_views WHERE ts >= ? ORDER BY ts", (since,))
        # The SELECT's columns are ViewRow's, in its order.
        return cast(list[ViewRow], [tuple(r) for r in rows or []])

    # --- traces and decisions -----------------------------------------------------------------

    def traces(self, limit: int = 20, before: float | None = None) -> list[RequestTrace]:
        """The newest ``limit`` traces (those recorded before ``before`` when given), newest
        first, as recorded: logged decisions are joined by ``StoreReader``."""
        where, args = ("", [limit]) if before is None else ("WHERE ts < ? ", [before, limit])
        return codec.traces(body for (body,) in self._rows(
            f"SELECT body FROM traces {where}ORDER BY ts DESC, {self.key} DESC LIMIT ?", args))

    def traces_from(self, since: float, limit: int) -> list[RequestTrace]:
        """The newest ``limit`` traces recorded at or after ``since``, newest first."""
        return codec.traces(body for (body,) in self._rows(
            f"SELECT body FROM traces WHERE ts >= ? ORDER BY ts DESC, {self.key} DESC "
            "LIMIT ?", (since, limit)))

    def trace_labels(self) -> list[codec.TraceLabels]:
        """Every stored request's id, time, router, model and worker (the exporter's labels)."""
        return codec.trace_labels(body for (body,) in self._rows("SELECT body FROM traces"))

    def traces_between(self, since: float, until: float, limit: int = 1000,
                       ) -> list[RequestTrace]:
        """Traces from ``since`` to ``until``, oldest first."""
        return codec.traces(body for (body,) in self._rows(
            "SELECT body FROM traces WHERE ts BETWEEN ? AND ? ORDER BY ts LIMIT ?",
            (since, until, limit)))

    def trace(self, request_id: str) -> RequestTrace | None:
        found = codec.traces(body for (body,) in self._rows(
            "SELECT body FROM traces WHERE request_id = ? "
            f"ORDER BY ts DESC, {self.key} DESC LIMIT 1", (request_id,)))
        return found[0] if found else None

    def trace_by_key(self, key: str) -> RequestTrace | None:
        """The trace known by ``key`` as another id (response id, engine id, trace id)."""
        keys = [*sorted(request_keys(key, key)), "trace:" + key]
        rows = self._rows_if_table(
            f"SELECT t.body FROM trace_keys k JOIN traces t ON t.{self.key} = k.row "
            f"WHERE k.key IN ({marks(len(keys))}) LIMIT 1", keys)
        found = codec.traces(body for (body,) in rows or [])
        return found[0] if found else None

    def trace_span(self) -> tuple[float, float] | None:
        """The first and last trace's times (None: no traces); both ends by the ts index."""
        rows = self._rows("SELECT min(ts), max(ts) FROM traces")
        if not rows or rows[0][0] is None:
            return None
        return float(rows[0][0]), float(rows[0][1])

    def trace_count(self) -> int:
        # max(key) is O(1) by its index; traces are append-only apart from pruning the oldest.
        return int(self._one(f"SELECT max({self.key}) FROM traces") or 0)

    def decisions(self, request_ids: Sequence[str]) -> list[RoutingDecision]:
        """Decisions logged under any of ``request_ids``, oldest first (an older store without
        the table has none)."""
        found: list[tuple[Any, ...]] = []
        ids = list(dict.fromkeys(request_ids))
        for start in range(0, len(ids), 500):  # below SQLite's bound-parameter limit
            chunk = ids[start:start + 500]
            rows = self._rows_if_table(
                f"SELECT {self.key}, body FROM decisions WHERE request_id IN "
                f"({marks(len(chunk))})", chunk)
            if rows is None:
                return []
            found += rows
        found.sort(key=lambda r: r[0])
        out = codec.decisions(body for _, body in found)
        # Stable: decisions of one time stay in the order written (by row, then in a row).
        out.sort(key=lambda d: d.ts or 0.0)
        return out
