"""The embedded store: one SQLite file in WAL mode (collector writes, dashboard reads).

The tables, writes and reads are the shared ones (``mmlens.store.writes``, ``reads``); this
module holds the schema, the connection, the hooks and retention by row deletes.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mmlens.store import availability, rollups, verdicts
from mmlens.store.base import PRUNED_TABLES, SCHEMA_VERSION, NoStoreYet, SQLStore, StoreError
from mmlens.store.schema import SCHEMA, columns, migrate_v1, migrate_v2, migrate_v3

__all__ = ["SCHEMA_VERSION", "Store", "StoreError"]

PAGE_SIZE = 8192
# WAL pages between automatic checkpoints (SQLite's default 1000). A checkpoint writes each
# page once however many commits rewrote it, and KV rows append to the same right-edge pages
# commit after commit: 4000 (32 MiB of WAL) cut the store's CPU per KV event by a fifth at
# 60k batches (benchmarks/kv_ingest.py's collector path).
WAL_CHECKPOINT_PAGES = 4000
# How long a writer opening a store keeps trying a setup another writer has locked.
SETUP_WAIT_S = 10.0


class Store(SQLStore):
    binds_kv_rows = True

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        if readonly:
            if not Path(self.path).exists():
                raise NoStoreYet(f"no store at {self.path}")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0,
                                      check_same_thread=False)
        else:
            self.db = self._open_for_writing()
        self.db.execute("PRAGMA busy_timeout=5000")

    def _open_for_writing(self) -> sqlite3.Connection:
        """Connects, sets WAL mode, migrates and creates the tables. Writers opening a new
        store at once can find it locked without SQLite waiting (a reader that would have to
        upgrade its lock behind another's is refused at once), so a locked setup is tried
        again, for up to ``SETUP_WAIT_S``: every step of it is idempotent."""
        deadline = time.monotonic() + SETUP_WAIT_S
        while True:
            db = None
            try:
                db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
                self.db = db
                self._set_up(db)
                self._check_version()
                return db
            except sqlite3.OperationalError as exc:
                if db is not None:
                    db.close()
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open the store {self.path} for writing: {exc}"
                                     ) from None
                time.sleep(random.uniform(0.005, 0.05))
            except StoreError:
                db.close()
                raise
            except sqlite3.Error as exc:  # a read-only file or folder, a full disk, not SQLite
                if db is not None:
                    db.close()
                raise StoreError(f"cannot open the store {self.path} for writing: {exc}"
                                 ) from None

    @staticmethod
    def _set_up(db: sqlite3.Connection) -> None:
        # A new store's pages (an existing one keeps its own): 8 KiB pages halve the writes a
        # WAL checkpoint makes for the same rows (measured below).
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        migrate_v1(db)
        migrate_v2(db)
        migrate_v3(db)
        db.executescript(SCHEMA)
        db.executescript(availability.SCHEMA)
        db.executescript(verdicts.SCHEMA)
        db.executescript(rollups.SQLITE_SCHEMA)

    def _check_version(self) -> None:
        # Two writers opening a new store at once both find no version: the second's insert
        # is ignored and it reads the first's.
        with self.db:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                            (str(SCHEMA_VERSION),))
        found = self._one("SELECT value FROM meta WHERE key='schema_version'")
        if int(found) != SCHEMA_VERSION:
            raise StoreError(f"store schema {found}, this mmlens expects {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    # --- the hooks of SQLStore ----------------------------------------------------------------

    def _prefix(self, column: str, prefix: str) -> tuple[str, list[Any]]:
        # SQLite's LIKE ignores case, so no index serves it; a range of its binary
        # collation is exactly the prefix, and the (name, ts) index serves that
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return f"{column} >= ? AND {column} < ?", [prefix, upper]

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, list(args)).fetchall()

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, list(args)).rowcount

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return max(self.db.executemany(sql, rows).rowcount, 0)

    @contextlib.contextmanager
    def _tx(self, exclusive: bool = False) -> Iterator[None]:
        self._writable()
        if self.__dict__.get("_depth"):  # inside ``atomically``: a savepoint of its transaction
            with self._savepoint():
                yield
            return
        with self.db:
            if exclusive and not self.db.in_transaction:
                self.db.execute("BEGIN IMMEDIATE")  # the write lock before the first read
            yield

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        """One transaction around several writes (each write's own becomes a savepoint of
        it, so a write that falls back to row by row still does inside it)."""
        self._writable()
        with self.db:
            if not self.db.in_transaction:
                self.db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0

    @contextlib.contextmanager
    def _savepoint(self) -> Iterator[None]:
        self._depth += 1
        name = f"mmlens_{self._depth}"
        self.db.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.db.execute(f"ROLLBACK TO {name}")
            self.db.execute(f"RELEASE {name}")
            raise
        else:
            self.db.execute(f"RELEASE {name}")
        finally:
            self._depth -= 1

    def _reserve_ids(self, table: str, n: int) -> list[int]:
        # What SQLite itself gives a rowid table without AUTOINCREMENT: one past the largest.
        first = int(self._one(f"SELECT coalesce(max(rowid), 0) FROM {table}")) + 1
        return list(range(first, first + n))

    def _bucket(self, column: str) -> str:
        return f"CAST({column} / ? AS INTEGER) * ?"  # ts > 0: truncation is floor

    def _columns(self, table: str) -> set[str]:
        return columns(self.db, table)

    def lock_wait(self, seconds: float | None = None) -> float | None:
        if seconds is not None:
            self.db.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")
        return int(self.db.execute("PRAGMA busy_timeout").fetchone()[0]) / 1000

    def is_outage(self, exc: Exception) -> bool:
        # A full disk, an I/O error, a lock held past the busy timeout: all pass.
        return isinstance(exc, sqlite3.OperationalError | OSError) and not self._missing_table(
            exc)

    def _missing_table(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)

    # --- retention ----------------------------------------------------------------------------

    def prune(self, retention_s: float, max_bytes: float, now: float | None = None) -> int:
        """Drop rows older than ``retention_s``; then, while the live data is larger than
        ``max_bytes``, the oldest tenth of samples and KV events. Returns rows deleted."""
        now = self._now(now)
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

    def used_bytes(self) -> int:
        page_size = self.db.execute("PRAGMA page_size").fetchone()[0]
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        free = self.db.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

