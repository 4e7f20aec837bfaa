"""What a store backend provides to the shared SQL (``writes``, ``reads``): running
statements, transactions, and the few spots where SQLite and PostgreSQL differ.

The shared SQL is written once with ``?`` placeholders and ``self.key`` for the row-order
column (SQLite's ``rowid``, PostgreSQL's identity ``id``); upserts, ``ON CONFLICT DO NOTHING``
and ``RETURNING`` are spelled the same on both (SQLite ≥ 3.35).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from mmlens.store.schema import SCHEMA_VERSION
from mmlens.store.tail import IdTail

__all__ = ["APPEND_ONLY", "PRUNED_TABLES", "SCHEMA_VERSION", "NoStoreYet", "SQLBase",
           "StoreError", "marks"]

# Tables pruned by age; PostgreSQL partitions the append-only ones by time.
APPEND_ONLY = ("samples", "kv_events", "traces", "decisions", "kv_views", "kv_content")
PRUNED_TABLES = (*APPEND_ONLY, "availability", "availability_cells", "verdicts",
                 "worker_minutes")


class StoreError(RuntimeError):
    pass


class NoStoreYet(StoreError):
    """Opened read-only before any collector created the store."""


class SQLBase:
    """The hooks. ``path`` names the store in messages (a URL without its password)."""

    path: str
    readonly: bool = False
    key = "rowid"

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        raise NotImplementedError

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run one statement per row; the rows changed in all."""
        raise NotImplementedError

    def _tx(self, exclusive: bool = False) -> contextlib.AbstractContextManager[None]:
        """A transaction; ``exclusive``: one such writer at a time across processes, from
        its first read on (trace merging reads, then writes)."""
        raise NotImplementedError

    # KV event rows are written as ``writes.bound_row`` gives them (SQLite), not as ``kv_row``.
    binds_kv_rows = False

    # SQL between an INSERT's column list and its VALUES that lets it give the row-order
    # column (``_reserve_ids``) a value.
    _given_ids = ""

    def _reserve_ids(self, table: str, n: int) -> list[int]:
        """The row-order ids the next ``n`` rows of ``table`` get, in order, inside a write
        transaction that holds the write lock (``_tx(exclusive=True)``)."""
        raise NotImplementedError

    def _bucket(self, column: str) -> str:
        """SQL for ``column`` rounded down to a multiple of a ``?`` bucket width (two
        placeholders: width, width)."""
        raise NotImplementedError

    def _prefix(self, column: str, prefix: str) -> tuple[str, list[Any]]:
        """SQL (and its arguments) for "``column`` starts with ``prefix``", possibly a
        superset (callers check): ``LIKE``, whose ``_`` matches any one character."""
        return f"{column} LIKE ?", [prefix + "%"]

    def _columns(self, table: str) -> set[str]:
        """``table``'s columns (empty when it does not exist: an older store)."""
        raise NotImplementedError

    def _missing_table(self, exc: Exception) -> bool:
        """``exc`` says a table is not there (an older store read-only)."""
        raise NotImplementedError

    def _before_append(self, table: str, timestamps: Iterable[float]) -> None:
        """Called before rows with these ``ts`` go into an append-only table."""

    def is_outage(self, exc: Exception) -> bool:
        """``exc`` says the store is unreachable or out of space (try again later), not that
        the rows were bad."""
        return isinstance(exc, OSError)

    def reconnect(self) -> None:
        """Open the connection again if it was lost (PostgreSQL restarted)."""

    def lock_wait(self, seconds: float | None = None) -> float | None:
        """How long a write waits for another writer's lock, in seconds (None where the
        store has no such wait); with ``seconds``, set to that first."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    def used_bytes(self) -> int:
        raise NotImplementedError

    def prune(self, retention_s: float, max_bytes: float, now: float | None = None) -> int:
        raise NotImplementedError

    # --- helpers on top of the hooks -----------------------------------------------------------

    def _writable(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only")

    def _one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        rows = self._rows(sql, args)
        return rows[0][0] if rows else None

    @staticmethod
    def _now(now: float | None) -> float:
        return time.time() if now is None else now

    def _rows_if_table(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
        """``_rows``, or None when the table is not there (an older store opened read-only)."""
        try:
            return self._rows(sql, args)
        except Exception as exc:
            if self._missing_table(exc):
                return None
            raise

    def _upsert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                key: str = "request_id") -> int:
        """Insert rows, replacing those with the same ``key``; returns the rows written."""
        if not rows:
            return 0
        update = ", ".join(f"{c} = excluded.{c}" for c in columns if c != key)
        with self._tx():
            self._many(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                       f"({marks(len(columns))}) ON CONFLICT ({key}) DO UPDATE SET {update}",
                       rows)
        return len(rows)

    def _rows_by_ids(self, table: str, columns: str, request_ids: Sequence[str],
                     chunk: int = 500) -> list[tuple[Any, ...]]:
        """``columns`` of the rows whose request_id is one of ``request_ids`` (none: an
        older store without the table)."""
        ids = list(dict.fromkeys(request_ids))
        out: list[tuple[Any, ...]] = []
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            out += self._rows_if_table(f"SELECT {columns} FROM {table} WHERE request_id IN "
                                       f"({marks(len(part))})", part) or []
        return out

    def _id_in(self) -> str:
        """SQL: the row-order column is in a set of ids given as one ``?`` (``_id_set``)."""
        return f"{self.key} IN (SELECT value FROM json_each(?))"

    @staticmethod
    def _id_set(ids: list[int]) -> Any:
        return json.dumps(ids)

    def _tail(self, table: str, columns: str, tail: IdTail, limit: int,
              ) -> list[tuple[Any, ...]]:
        """``table``'s rows ``tail`` has not returned yet, by increasing id: those committed
        late into its gaps, then up to ``limit`` new ones (``columns`` start with the id)."""
        ids, wide = tail.pending_ids()
        late: list[tuple[Any, ...]] = []
        if ids:
            late += self._rows(f"SELECT {columns} FROM {table} WHERE {self._id_in()} "
                               f"ORDER BY {self.key}", (self._id_set(ids),))
        # A statement a wide range: a plan over many ORed ranges turns into a full scan on a
        # partition PostgreSQL has no statistics for yet (the newest, where gaps are).
        for first, last in wide:
            late += self._rows(f"SELECT {columns} FROM {table} WHERE {self.key} BETWEEN ? "
                               f"AND ? ORDER BY {self.key}", (first, last))
        tail.filled(int(r[0]) for r in late)
        new = self._rows(f"SELECT {columns} FROM {table} WHERE {self.key} > ? "
                         f"ORDER BY {self.key} LIMIT ?", (tail.after, limit))
        tail.advance(int(r[0]) for r in new)
        return late + new


def marks(n: int) -> str:
    return ",".join("?" * n)
