"""The store's writes, one SQL for every backend: metric samples, compact KV events (one row per
event, hashes as msgpack, stored idempotently), the latest resident-block summary per worker,
request traces (JSON, one row per request, merged by shared keys), routing decisions from
router logs (JSON, joined to traces when read), router-vs-engine views and collector health.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgspec

from mmlens.ingest import observed
from mmlens.records import (
    BlockRemoved,
    BlockStored,
    CollectorHealth,
    ErrorCounts,
    KVEvent,
    MetricSample,
    RequestTrace,
    RoutingDecision,
    count_error,
)
from mmlens.store import codec, typed_check
from mmlens.store.availability import AvailabilityTables, content_of
from mmlens.store.dialect import StoreError, marks
from mmlens.store.readback import ENCODE_ERRORS, all_text_ok, checked, text_ok, ts_ok
from mmlens.store.schema import KV_COLUMNS

try:  # the rows built in one compiled call (``_kvrows.c``, built at install time when it can be)
    from mmlens.store._kvrows import kv_rows as _native_rows
except ImportError:
    _native_rows = None

_enc = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


def kv_row(ev: KVEvent) -> tuple[Any, ...]:
    """The event's ``kv_events`` row (``KV_COLUMNS``), its content keys in it."""
    kind = type(ev)
    if kind is BlockStored:
        images = ev.images
        names = None
        if images:
            names = _json.encode(sorted({r[0] for refs in images if refs for r in refs})
                                 ).decode()
        return (ev.ts, ev.worker, ev.rank, ev.seq, "stored", len(ev.block_hashes),
                None if ev.parent is None else str(ev.parent), _enc.encode(ev.block_hashes),
                names, ev.idx, content_of(ev))
    if kind is BlockRemoved:
        return (ev.ts, ev.worker, ev.rank, ev.seq, "removed", len(ev.block_hashes), None,
                _enc.encode(ev.block_hashes), None, ev.idx, content_of(ev))
    return (ev.ts, ev.worker, ev.rank, ev.seq, "cleared", 0, None, None, None, ev.idx, None)


# The nullable columns of a ``kv_events`` row (parent, hashes, images, content).
_NULLABLE = (6, 7, 8, 10)
# The VALUES of a ``bound_row``: '' is each nullable column's NULL (none of them is ever '').
BOUND_VALUES = ",".join("nullif(?,'')" if i in _NULLABLE else "?" for i in range(11))


def bound_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A ``kv_row`` as SQLite's module binds it cheapest: on CPython 3.11 it binds str, int,
    float and bytearray directly but looks up an adapter for bytes and None (a formatted
    AttributeError raised and cleared each), which was a quarter of the insert's CPU per row
    (``benchmarks/kv_store_layouts.py``). Blobs go as bytearray, a NULL as ''
    (``BOUND_VALUES`` turns it back)."""
    out = list(row)
    for i in _NULLABLE:
        v = out[i]
        out[i] = "" if v is None else bytearray(v) if type(v) is bytes else v
    return tuple(out)


def _bound_kv_row(ev: KVEvent) -> tuple[Any, ...]:
    return bound_row(kv_row(ev))


def kv_rows(events: list[KVEvent], bound: bool = False) -> list[tuple[Any, ...]]:
    """``kv_row`` of each event (``bound``: its ``bound_row``): compiled where it is built (an
    event it does not take goes through ``kv_row`` itself), else ``kv_row`` one by one."""
    one = _bound_kv_row if bound else kv_row
    if _native_rows is None:
        return list(map(one, events))
    return _native_rows(events, BlockStored, BlockRemoved, one, bound)


def _sample_reads_back(row: tuple[Any, ...]) -> bool:
    return ts_ok(row[0]) and all_text_ok(*row[1:4])


def _decision_reads_back(row: tuple[Any, ...]) -> bool:
    return ts_ok(row[0]) and all_text_ok(*row[1:4]) and codec.decision(row[4]) is not None


def _decision_rows(decisions: list[RoutingDecision], now: float) -> list[tuple[Any, ...]]:
    """The ``decisions`` rows of a batch: per request and router, its decisions in the order
    given (the body a JSON array of them), at the earliest of their times, under the sources
    they came from."""
    by_request: dict[tuple[str, str], list[RoutingDecision]] = {}
    for d in decisions:
        key = (d.request_id, d.router)
        found = by_request.get(key)
        if found is None:
            by_request[key] = [d]
        else:
            found.append(d)
    rows = []
    for (rid, router), ds in by_request.items():
        ts = min(now if d.ts is None else d.ts for d in ds)
        sources = ",".join(dict.fromkeys(d.source for d in ds))
        rows.append((ts, rid, router, sources, codec.decisions_body(ds)))
    return rows


def _trace_reads_back(t: RequestTrace) -> bool:
    """Its body decodes as the readers decode it, its columns are storable text."""
    return (ts_ok(t.ts) and all_text_ok(t.request_id, t.router)
            and codec.trace(codec.trace_body(t)) is not None)


def _trace_bodies(traces: list[RequestTrace]) -> list[str] | None:
    """The bodies of traces that all read back (``_trace_reads_back``), or None: check each
    then. Traces holding their declared types read back without a decode
    (``typed_check``); an expected layout is written as its own JSON, so a batch with one
    is decoded (once for the batch)."""
    try:
        bodies = [codec.trace_body(t) for t in traces]
        if all(ts_ok(t.ts) and all_text_ok(t.request_id, t.router) for t in traces) and (
                (all(t.expected_layout is None for t in traces)
                 and typed_check.all_typed(traces))
                or codec.all_read_back(bodies, codec.traces_dec)):
            return bodies
    except ENCODE_ERRORS:  # a time that is no number too: each trace checked alone
        pass
    return None


class StoreWrites(AvailabilityTables):
    """The writes; a KV event's content keys go to the availability tables with it. Records
    that would not read back are left out, named in ``rejected`` (``readback``)."""

    @property
    def rejected(self) -> ErrorCounts:
        """Records refused since this store was opened, by kind, the latest named."""
        found = self.__dict__.get("_rejected")
        if found is None:
            found = self.__dict__["_rejected"] = ErrorCounts()
        return found

    def _kv_writable(self, events: list[KVEvent]) -> list[KVEvent]:
        """Events whose row reads back: the hashes and images are msgpack/JSON this module
        encodes from checked ints and UTF-8 text (``kv_events``), so the time and the worker
        are what is left to check (a full decode of each row would cost ~30 µs an event)."""
        # A batch's events share their time and worker: each distinct one checked once.
        if all(map(ts_ok, {ev.ts for ev in events})) and all(
                map(text_ok, {ev.worker for ev in events})):
            return events
        out = []
        for ev in events:
            if ts_ok(ev.ts) and text_ok(ev.worker):
                out.append(ev)
            else:
                count_error(self.rejected, "unwritable_kv_event", f"ts {ev.ts!r}",
                            f"{ev.worker!a}#{ev.rank} seq {ev.seq} event {ev.idx}")
        return out

    def _append(self, table: str, columns: str, rows: list[tuple[Any, ...]],
                ignore_duplicates: bool = False, values: str | None = None) -> int:
        """Insert rows whose first column is ``ts`` (``values``: SQL of a row's VALUES, one
        ``?`` per column by default); returns the rows added."""
        if not rows:
            return 0
        self._before_append(table, (r[0] for r in rows))
        sql = f"INSERT INTO {table} ({columns}) VALUES ({values or marks(len(rows[0]))})"
        sql += " ON CONFLICT DO NOTHING" if ignore_duplicates else ""
        try:
            with self._tx():
                n = self._many(sql, rows)
        except Exception as exc:
            if self.is_outage(exc) or isinstance(exc, StoreError):  # down, or read-only
                raise
            return self._append_each(table, sql, rows, ignore_duplicates)
        return n if ignore_duplicates else len(rows)

    def _append_each(self, table: str, sql: str, rows: list[tuple[Any, ...]],
                     ignore_duplicates: bool) -> int:
        """A batch the backend refused for its content: row by row, each refused row set
        aside alone (``rejected``) instead of the whole batch."""
        added = 0
        for row in rows:
            try:
                with self._tx():
                    n = self._many(sql, [row])
            except Exception as exc:
                if self.is_outage(exc):
                    raise
                count_error(self.rejected, f"unwritable_{table}", f"{type(exc).__name__}: "
                            f"{exc}", f"{table} row at ts {row[0]!r}")
                continue
            added += n if ignore_duplicates else 1
        return added

    def set_meta(self, key: str, value: Any) -> None:
        with self._tx():
            self._exec("INSERT INTO meta (key, value) VALUES (?, ?) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       (key, json.dumps(value)))

    def delete_meta(self, key: str) -> None:
        with self._tx():
            self._exec("DELETE FROM meta WHERE key = ?", (key,))

    def add_samples(self, samples: Iterable[MetricSample]) -> int:
        rows = [(s.ts, s.target, s.name, json.dumps(dict(s.labels), separators=(",", ":")),
                 s.value) for s in samples]
        if not all(map(_sample_reads_back, rows)):
            rows = [r for r in rows if checked(self.rejected, "sample", f"{r[1]!a} {r[2]!a}",
                                               lambda r=r: r, _sample_reads_back) is not None]
        return self._append("samples", "ts, target, name, labels, value", rows)

    def add_kv_events(self, events: Iterable[KVEvent]) -> int:
        """Store events idempotently (the key: ``mmlens.store.schema.KV_COLUMNS``), one row
        each with its content keys; returns the rows actually added, so events already stored
        are not counted twice."""
        events = self._kv_writable(list(events))
        if not events:
            return 0
        values = BOUND_VALUES if self.binds_kv_rows else None
        rows = kv_rows(events, self.binds_kv_rows)
        self._before_append("kv_events", (r[0] for r in rows))
        try:
            with self._tx():
                added = self._insert_new("kv_events", KV_COLUMNS, rows, values)
        except Exception as exc:
            if self.is_outage(exc) or isinstance(exc, StoreError):
                raise
            added = self._append("kv_events", KV_COLUMNS, rows, ignore_duplicates=True,
                                 values=values)
        if added < len(rows):
            self._content_of_stored(rows)
        return added

    def _content_of_stored(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows that were stored already (a replay, a second collector) but without content
        keys, where these rows have them (that collector's index did not know the parent):
        the keys go to ``kv_content``, as late keys do, so the availability replay gets
        them once."""
        keyed = [r for r in rows if r[-1]]  # None, or '' in a ``bound_row``: no keys
        if keyed:
            self.add_keys_where_missing([(r[0], r[1], r[2], r[3], r[9], r[4], r[10])
                                         for r in keyed])

    def add_kv_views(self, points: Iterable[Any]) -> int:
        """Router view vs engine holdings (``mmlens.analysis.kv_divergence.ViewPoint``)."""
        return self._append(
            "kv_views", "ts, worker, source, router_blocks, engine_blocks, router_only, "
            "engine_only", [(p.ts, p.worker, p.source, p.router_blocks, p.engine_blocks,
                             p.router_only, p.engine_only) for p in points])

    def set_kv_state(self, summary: dict[str, dict[str, Any]], ts: float) -> None:
        rows = [(s["worker"], s["rank"], ts, json.dumps(s)) for s in summary.values()]
        with self._tx():
            self._many("INSERT INTO kv_state (worker, rank, ts, summary) VALUES (?,?,?,?) "
                       "ON CONFLICT (worker, rank) DO UPDATE SET ts = excluded.ts, "
                       "summary = excluded.summary", rows)

    def add_decisions(self, decisions: Iterable[RoutingDecision], ts: float | None = None,
                      ) -> int:
        """Routing decisions read from router logs, one row per request (and router) of the
        batch holding its decisions in the order given (``schema.SCHEMA_VERSION`` 4); ``ts``
        stands in where a decision has no time of its own. Returns the decisions stored."""
        now = self._now(ts)
        decisions = list(decisions)
        try:  # the whole batch checked at once; should it fail, each decision alone
            rows = _decision_rows(decisions, now)
            # Decisions holding their declared types read back: no decode needed to know.
            if (all(ts_ok(now if d.ts is None else d.ts) for d in decisions)  # each, not a row's
                    and all(all_text_ok(*r[1:4]) for r in rows)
                    and (typed_check.all_typed(decisions)
                         or codec.all_read_back([r[4] for r in rows], codec.folded_dec))):
                return self._append_decisions(rows, len(decisions))
        except ENCODE_ERRORS:
            pass
        kept = [d for d in decisions if checked(
            self.rejected, "decision", f"request {d.request_id!a}",
            lambda d=d: (now if d.ts is None else d.ts, d.request_id, d.router, d.source,
                         codec.decision_body(d)), _decision_reads_back) is not None]
        return self._append_decisions(_decision_rows(kept, now), len(kept))

    def _append_decisions(self, rows: list[tuple[Any, ...]], n: int) -> int:
        added = self._append("decisions", "ts, request_id, router, source, body", rows)
        return n if added == len(rows) else added  # a row refused: its decisions unknown

    def set_quarantined(self, items: list[dict[str, Any]], instance: str = "") -> None:
        """The latest bad items a collector process set aside, named (kind, detail, where),
        for inspection: one meta row per process, rewritten when they change."""
        self.set_meta(f"quarantine:{instance}", items)

    def set_health(self, items: Iterable[CollectorHealth], ts: float | None = None,
                   instance: str = "") -> None:
        """Health rows of one collector process (``instance``): two collectors writing to one
        store keep a row each instead of overwriting the other's."""
        ts = self._now(ts)
        rows = [(h.collector, h.target, ts, h.last_success, h.last_error, h.last_error_ts,
                 json.dumps(h.errors), json.dumps(h.counters), instance) for h in items]
        with self._tx():
            self._many(
                "INSERT INTO health (collector, target, updated, last_success, last_error, "
                "last_error_ts, errors, counters, instance) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (collector, target, instance) DO UPDATE SET "
                "updated = excluded.updated, last_success = excluded.last_success, "
                "last_error = excluded.last_error, last_error_ts = excluded.last_error_ts, "
                "errors = excluded.errors, counters = excluded.counters", rows)

    # --- traces: one row per request --------------------------------------------------------

    def add_traces(self, traces: Iterable[RequestTrace]) -> int:
        """Store traces, one row per request: a trace sharing a key (request id, response
        id, engine id, trace id) with a stored one is merged into it
        (``mmlens.ingest.observed.merge``), whichever source wrote first."""
        traces = list(traces)
        bodies = _trace_bodies(traces)
        if bodies is None:  # one of them does not read back: each alone
            kept = [checked(self.rejected, "trace", f"request {t.request_id!a}",
                            lambda t=t: t, _trace_reads_back) for t in traces]
            traces = [t for t in kept if t is not None]
            bodies = [codec.trace_body(t) for t in traces]
        self._before_append("traces", (t.ts for t in traces))
        # One writer at a time from the read of matching rows to the write: the tap and
        # the collector may record the same request from two processes.
        with self._tx(exclusive=True):
            self._upsert_traces(traces, bodies)
        return len(traces)

    def _upsert_traces(self, traces: list[RequestTrace], bodies: list[str]) -> None:
        """A request no stored row (nor an earlier one of this batch) shares a key with is
        inserted without a lookup of its own: one query finds the batch's stored keys, and
        such requests go in together (ids reserved for them, one statement per table)."""
        keys = [observed.keys_of(t) for t in traces]
        taken = self._stored_keys(sorted(set().union(*keys)))
        fresh: list[tuple[RequestTrace, str, set[str]]] = []
        for t, body, mine in zip(traces, bodies, keys, strict=True):
            if mine & taken:
                self._insert_fresh(fresh)  # the merge below reads what they wrote
                fresh = []
                taken |= self._upsert_trace(t)
                continue
            fresh.append((t, body, mine))
            taken |= mine
        self._insert_fresh(fresh)

    def _insert_fresh(self, fresh: list[tuple[RequestTrace, str, set[str]]]) -> None:
        if not fresh:
            return
        ids = self._reserve_ids("traces", len(fresh))
        self._many(f"INSERT INTO traces ({self.key}, ts, request_id, router, body) "
                   f"{self._given_ids} VALUES (?,?,?,?,?)",
                   [(row, t.ts, t.request_id, t.router, body)
                    for row, (t, body, _) in zip(ids, fresh, strict=True)])
        self._many("INSERT INTO trace_keys (key, row) VALUES (?, ?) "
                   "ON CONFLICT (key) DO UPDATE SET row = excluded.row",
                   [(k, row) for row, (_, _, mine) in zip(ids, fresh, strict=True)
                    for k in mine])

    def _stored_keys(self, keys: list[str], chunk: int = 500) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(keys), chunk):
            part = keys[i:i + chunk]
            found.update(k for (k,) in self._rows(
                f"SELECT key FROM trace_keys WHERE key IN ({marks(len(part))})", part))
        return found

    def _upsert_trace(self, t: RequestTrace) -> set[str]:
        """Insert or merge one trace; returns the keys it is stored under."""
        matches = [(row, old) for row, old in self._rows_sharing_keys(t)
                   if observed.same_request(old, t)]
        if not matches:
            row = self._one(f"INSERT INTO traces (ts, request_id, router, body) "
                            f"VALUES (?,?,?,?) RETURNING {self.key}",
                            (t.ts, t.request_id, t.router, codec.trace_body(t)))
            return self._index_keys(t, int(row))
        merged = matches[0][1]
        for _, old in matches[1:]:
            merged = observed.merge(merged, old)
        t = observed.merge(merged, t)
        keep, extra = matches[0][0], [row for row, _ in matches[1:]]
        self._exec(f"UPDATE traces SET ts=?, request_id=?, router=?, body=? WHERE {self.key}=?",
                   (t.ts, t.request_id, t.router, codec.trace_body(t), keep))
        if extra:  # `t` joined records that were apart so far
            self._exec(f"DELETE FROM traces WHERE {self.key} IN ({marks(len(extra))})", extra)
            self._exec(f"UPDATE trace_keys SET row=? WHERE row IN ({marks(len(extra))})",
                       [keep, *extra])
        return self._index_keys(t, keep)

    def _rows_sharing_keys(self, t: RequestTrace) -> list[tuple[int, RequestTrace]]:
        keys = sorted(observed.keys_of(t))
        rows = sorted({r for (r,) in self._rows(
            f"SELECT row FROM trace_keys WHERE key IN ({marks(len(keys))})", keys)})
        if not rows:
            return []
        out = []
        for row, body in self._rows(
                f"SELECT {self.key}, body FROM traces WHERE {self.key} IN ({marks(len(rows))})"
                f" ORDER BY {self.key}", rows):
            old = codec.trace(body)
            if old is not None:  # an unreadable row is left as it is
                out.append((int(row), old))
        return out

    def _index_keys(self, t: RequestTrace, row: int) -> set[str]:
        keys = observed.keys_of(t)
        self._many("INSERT INTO trace_keys (key, row) VALUES (?, ?) "
                   "ON CONFLICT (key) DO UPDATE SET row = excluded.row",
                   [(k, row) for k in keys])
        return keys

    def _prune_keys(self) -> None:
        self._exec(f"DELETE FROM trace_keys WHERE row NOT IN (SELECT {self.key} FROM traces)")
