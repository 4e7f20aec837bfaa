"""The ``verdicts`` table: one row per request, the verdict job's judgement
(``mmlens.analysis.judgement``) with the evidence it used, re-judged in place (``version``
counts it). SQLite's DDL here, PostgreSQL's in ``mmlens.store.postgres``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import msgspec

from mmlens.records import Verdict
from mmlens.store.codec import verdict_body
from mmlens.store.dialect import SQLBase
from mmlens.store.tail import IdTail

SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    request_id TEXT NOT NULL PRIMARY KEY, ts REAL NOT NULL, category TEXT NOT NULL,
    headline TEXT NOT NULL, worker TEXT, better_worker TEXT, better_blocks INTEGER,
    judged_at REAL NOT NULL, version INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS verdicts_ts ON verdicts (ts);
CREATE INDEX IF NOT EXISTS verdicts_judged ON verdicts (judged_at);
"""
_COLUMNS = ("request_id", "ts", "category", "headline", "worker", "better_worker",
            "better_blocks", "judged_at", "version", "body")
_hashes = msgspec.msgpack.Decoder()


def _images(text: str | None) -> list[str]:
    """An event's stored image identities (a JSON list), [] when none or unreadable."""
    if not text:
        return []
    try:
        got = json.loads(text)
    except ValueError:
        return []
    return [str(i) for i in got] if isinstance(got, list) else []


class _End(msgspec.Struct):
    e: int | None = None


_end = msgspec.msgpack.Decoder(_End)


def _prompt_end(content: bytes | None) -> int | None:
    """Where a prompt ended in a one-block store (its content's ``e``), None when not told
    or unreadable."""
    if not content:
        return None
    try:
        return _end.decode(content).e
    except msgspec.DecodeError:
        return None


def _decode(body: str) -> Verdict | None:
    try:
        return msgspec.json.decode(body, type=Verdict, strict=False)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None  # a row this version cannot read stays stored


class VerdictTables(SQLBase):
    """Writes and reads of stored verdicts, one SQL for every backend (a part of the store)."""

    def add_verdicts(self, verdicts: Iterable[Verdict]) -> int:
        rows = [(v.request_id, v.ts, v.category, v.headline, v.worker, v.better_worker,
                 v.better_blocks, v.judged_at, v.version,
                 verdict_body(v)) for v in verdicts]
        return self._upsert("verdicts", _COLUMNS, rows)

    def verdict_versions(self, request_ids: Sequence[str]) -> dict[str, int]:
        """Request id → how often it was re-judged, for those judged already."""
        return {rid: int(v) for rid, v in self._rows_by_ids("verdicts", "request_id, version",
                                                                request_ids)}

    def verdicts_for(self, request_ids: Sequence[str]) -> dict[str, Verdict]:
        out = {}
        for (body,) in self._rows_by_ids("verdicts", "body", request_ids):
            v = _decode(body)
            if v is not None:
                out[v.request_id] = v
        return out

    def verdicts_judged_since(self, judged_at: float, limit: int = 5_000) -> list[Verdict]:
        """Verdicts judged (or judged again) at ``judged_at`` or later, oldest judgement
        first, at most ``limit``."""
        rows = self._rows_if_table("SELECT body FROM verdicts WHERE judged_at >= ? "
                                   "ORDER BY judged_at LIMIT ?", (judged_at, limit)) or []
        return [v for (body,) in rows if (v := _decode(body)) is not None]

    def verdicts_between(self, since: float, until: float | None = None,
                         limit: int = 10_000) -> list[Verdict]:
        """Verdicts of the requests made in [since, until], newest first."""
        sql, args = "SELECT body FROM verdicts WHERE ts >= ?", [since]
        if until is not None:
            sql += " AND ts <= ?"
            args.append(until)
        rows = self._rows_if_table(sql + " ORDER BY ts DESC LIMIT ?", [*args, limit]) or []
        return [v for (body,) in rows if (v := _decode(body)) is not None]

    def verdict_counts(self, since: float, until: float | None = None) -> dict[str, int]:
        """Requests per category over a window (all judged requests made in it)."""
        sql, args = "SELECT category, count(*) FROM verdicts WHERE ts >= ?", [since]
        if until is not None:
            sql += " AND ts <= ?"
            args.append(until)
        rows = self._rows_if_table(sql + " GROUP BY category", args) or []
        return {str(c): int(n) for c, n in rows}

    def kv_chain_tail(self, tail: IdTail, limit: int = 50_000,
                      ) -> list[tuple[float, str, str, str | None, list[str], list[str],
                                      int | None]]:
        """KV events ``tail`` has not returned yet (``IdTail``), in store order, as the
        verdict job's chain index reads them: (ts, worker#rank, kind, parent, hashes, the
        identities of the images in the blocks, where a prompt ended in a one-block store),
        the hashes as text like a stored parent."""
        out = []
        for _, ts, worker, rank, kind, parent, hashes, images, n, content in self._tail(
                "kv_events", f"{self.key}, ts, worker, rank, kind, parent, hashes, images, "
                "n_blocks, content", tail, limit):
            unit = worker if not rank else f"{worker}#{rank}"
            out.append((float(ts), unit, kind, None if parent is None else str(parent),
                        [str(h) for h in _hashes.decode(hashes)] if hashes else [],
                        _images(images),
                        _prompt_end(content) if n == 1 and kind == "stored" else None))
        return out

    def trace_rows_from(self, since: float, limit: int) -> tuple[int, list[tuple[int, str]]]:
        """The highest trace row id, then (row, body) of the traces from ``since`` on,
        oldest first, at most ``limit``: where the verdict job's window starts (rows
        added since come by ``trace_rows_tail`` from that id)."""
        top = int(self._one(f"SELECT max({self.key}) FROM traces") or 0)
        return top, [(int(r), body) for r, body in self._rows(
            f"SELECT {self.key}, body FROM traces WHERE ts >= ? ORDER BY ts, {self.key} "
            "LIMIT ?", (since, limit))]

    def trace_rows_tail(self, tail: IdTail, limit: int = 50_000) -> list[tuple[int, str]]:
        """(row, body) of the trace rows ``tail`` has not returned yet. A merge rewrites a
        row in place and is not among them: ``trace_bodies`` tells it."""
        return [(int(r), body) for r, body in self._tail("traces", f"{self.key}, body", tail,
                                                          limit)]

    def trace_bodies(self, rows: Sequence[int]) -> dict[int, str]:
        """The bodies of these trace rows as stored now (a row merged away is absent)."""
        out: dict[int, str] = {}
        ids = sorted(set(rows))
        for start in range(0, len(ids), 5000):
            out.update((int(r), body) for r, body in self._rows(
                f"SELECT {self.key}, body FROM traces WHERE {self._id_in()}",
                (self._id_set(ids[start:start + 5000]),)))
        return out

    def oldest_trace_ts(self) -> float | None:
        found = self._one("SELECT min(ts) FROM traces")
        return None if found is None else float(found)

    def decision_tail(self, tail: IdTail, limit: int = 50_000) -> list[tuple[str, float]]:
        """Logged decisions ``tail`` has not returned yet: (request id as logged, ts)."""
        return [(str(rid), float(ts)) for _, rid, ts in self._tail(
            "decisions", f"{self.key}, request_id, ts", tail, limit)]

    def trace_ids_for_keys(self, keys: Sequence[str]) -> set[str]:
        """The request ids of the traces known by any of ``keys`` (ids, aliases)."""
        out = set()
        for k in keys:
            t = self.trace(k) or self.trace_by_key(k)  # type: ignore[attr-defined]
            if t is not None:
                out.add(t.request_id)
        return out
