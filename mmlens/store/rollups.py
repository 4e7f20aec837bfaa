"""Per-worker, per-minute rollups (``worker_minutes``): written by the lead collector's rollup
job from the raw KV events and counters, read by the pages on fleets. A fleet page reads the
busiest workers' minutes and one summed row per minute for the rest, so what it reads grows
with the window's minutes, never with the raw events in them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mmlens.records import WorkerMinute
from mmlens.store.dialect import SQLBase, marks

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_minutes (
    ts REAL NOT NULL, worker TEXT NOT NULL, kv_stored INTEGER NOT NULL,
    kv_removed INTEGER NOT NULL, kv_resident INTEGER, hit_tokens REAL NOT NULL,
    query_tokens REAL NOT NULL, PRIMARY KEY (ts, worker));
"""
POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_minutes (
    ts double precision NOT NULL, worker text NOT NULL, kv_stored bigint NOT NULL,
    kv_removed bigint NOT NULL, kv_resident bigint, hit_tokens double precision NOT NULL,
    query_tokens double precision NOT NULL, PRIMARY KEY (ts, worker));
"""

_COLUMNS = "ts, worker, kv_stored, kv_removed, kv_resident, hit_tokens, query_tokens"
# What "busiest" means for each view: KV blocks moved, or prefix-cache tokens queried.
MEASURES = {"kv": "kv_stored + kv_removed", "queries": "query_tokens"}


class RollupTables(SQLBase):
    def set_worker_minutes(self, rows: Iterable[WorkerMinute]) -> int:
        """Write (or rewrite) minutes; a row without a resident count keeps the stored one."""
        values = [(r.ts, r.worker, r.kv_stored, r.kv_removed, r.kv_resident, r.hit_tokens,
                   r.query_tokens) for r in rows if r.worker is not None]
        if not values:
            return 0
        with self._tx():
            self._many(
                f"INSERT INTO worker_minutes ({_COLUMNS}) VALUES ({marks(7)}) "
                "ON CONFLICT (ts, worker) DO UPDATE SET kv_stored = excluded.kv_stored, "
                "kv_removed = excluded.kv_removed, "
                "kv_resident = COALESCE(excluded.kv_resident, worker_minutes.kv_resident), "
                "hit_tokens = excluded.hit_tokens, query_tokens = excluded.query_tokens",
                values)
        return len(values)

    def latest_minute(self) -> float | None:
        rows = self._rows_if_table("SELECT max(ts) FROM worker_minutes")
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def busiest_workers(self, since: float, measure: str, keep: int) -> tuple[list[str], int]:
        """The ``keep`` workers with the most of ``measure`` since ``since``, and how many
        workers have minutes there."""
        rows = self._rows_if_table(
            f"SELECT worker, sum({MEASURES[measure]}) AS m FROM worker_minutes WHERE ts >= ? "
            "GROUP BY worker ORDER BY m DESC, worker LIMIT ?", (since, keep)) or []
        n = self._one("SELECT count(DISTINCT worker) FROM worker_minutes WHERE ts >= ?",
                      (since,)) if rows else 0
        return [w for w, _ in rows], int(n or 0)

    def worker_minutes(self, since: float, workers: Sequence[str] | None = None,
                       ) -> list[WorkerMinute]:
        """Minutes since ``since`` (of ``workers`` only, when given), oldest first."""
        sql = f"SELECT {_COLUMNS} FROM worker_minutes WHERE ts >= ?"
        args: list[Any] = [since]
        if workers is not None:
            if not workers:
                return []
            sql += f" AND worker IN ({marks(len(workers))})"
            args += list(workers)
        return [_minute(r) for r in self._rows_if_table(sql + " ORDER BY ts, worker", args)
                or []]

    def worker_hit_sums(self, since: float) -> list[tuple[str, float, float, int]] | None:
        """Per worker: prefix hit and queried tokens of its minutes since ``since`` and how
        many minutes those are (one row per worker whatever the raw samples behind them);
        None before any rollup."""
        rows = self._rows_if_table(
            "SELECT worker, sum(hit_tokens), sum(query_tokens), count(*) FROM worker_minutes "
            "WHERE ts >= ? GROUP BY worker ORDER BY worker", (since,))
        if rows is None:
            return None
        return [(str(w), float(h or 0.0), float(q or 0.0), int(n)) for w, h, q, n in rows]

    def other_minutes(self, since: float, exclude: Sequence[str]) -> list[WorkerMinute]:
        """Every other worker's minutes summed per minute (``worker`` None)."""
        where = f" AND worker NOT IN ({marks(len(exclude))})" if exclude else ""
        rows = self._rows_if_table(
            "SELECT ts, NULL, sum(kv_stored), sum(kv_removed), sum(kv_resident), "
            f"sum(hit_tokens), sum(query_tokens) FROM worker_minutes WHERE ts >= ?{where} "
            "GROUP BY ts ORDER BY ts", [since, *exclude]) or []
        return [_minute(r) for r in rows]


def _minute(r: Sequence[Any]) -> WorkerMinute:
    return WorkerMinute(float(r[0]), r[1], int(r[2] or 0), int(r[3] or 0),
                        None if r[4] is None else int(r[4]), float(r[5] or 0.0),
                        float(r[6] or 0.0))
