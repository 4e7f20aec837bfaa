"""The server store for fleets: PostgreSQL through psycopg 3 (``--db postgresql://…``).

Same tables, rows and reads as the SQLite store; the append-only tables (``APPEND_ONLY``:
samples, KV events and their content keys, traces, decisions, router views) are
range-partitioned on ``ts`` into windows of ``partition_s`` (an hour by default, fixed when the
store is created), created on demand, so retention drops whole partitions instead of deleting
rows. Several collectors (``--shard I/N``) write concurrently;
DDL is serialized by an advisory lock. A read-only store sets its session read-only.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import psycopg

from mmlens.store import rollups
from mmlens.store.base import PRUNED_TABLES, SCHEMA_VERSION, NoStoreYet, SQLStore, StoreError
from mmlens.store.dialect import APPEND_ONLY
from mmlens.store.open import redact
from mmlens.store.schema import FOLD_DECISIONS, MOVE_CONTENT

PARTITION_S = 3600.0
# pg_advisory_xact_lock keys: schema and partition DDL; trace merging (read, then write).
_DDL_LOCK = 0x6D6D6C656E73
_WRITE_LOCK = _DDL_LOCK + 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    target text NOT NULL, name text NOT NULL, labels text NOT NULL,
    value double precision NOT NULL) PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS samples_ts ON samples (ts);
CREATE INDEX IF NOT EXISTS samples_name_ts ON samples (name, ts);
CREATE TABLE IF NOT EXISTS kv_events (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    worker text NOT NULL, rank integer NOT NULL, seq bigint NOT NULL, kind text NOT NULL,
    n_blocks integer NOT NULL, parent text, hashes bytea, images text,
    idx integer NOT NULL DEFAULT 0, content bytea,
    CONSTRAINT kv_events_key UNIQUE (worker, rank, seq, ts, idx)) PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS kv_events_ts ON kv_events (ts);
CREATE INDEX IF NOT EXISTS kv_events_id ON kv_events (id);
CREATE TABLE IF NOT EXISTS kv_state (
    worker text NOT NULL, rank integer NOT NULL, ts double precision NOT NULL,
    summary text NOT NULL, PRIMARY KEY (worker, rank));
CREATE TABLE IF NOT EXISTS traces (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    request_id text NOT NULL, router text NOT NULL, body text NOT NULL)
    PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS traces_ts ON traces (ts);
CREATE INDEX IF NOT EXISTS traces_id ON traces (id);
CREATE INDEX IF NOT EXISTS traces_request_id ON traces (request_id);
CREATE TABLE IF NOT EXISTS trace_keys (key text PRIMARY KEY, row bigint NOT NULL);
CREATE INDEX IF NOT EXISTS trace_keys_row ON trace_keys (row);
CREATE TABLE IF NOT EXISTS decisions (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    request_id text NOT NULL, router text NOT NULL, source text NOT NULL, body text NOT NULL)
    PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
CREATE INDEX IF NOT EXISTS decisions_request_id ON decisions (request_id);
CREATE INDEX IF NOT EXISTS decisions_id ON decisions (id);
CREATE TABLE IF NOT EXISTS kv_views (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    worker text NOT NULL, source text NOT NULL, router_blocks integer, engine_blocks integer,
    router_only integer NOT NULL, engine_only integer NOT NULL) PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS kv_views_ts ON kv_views (ts);
CREATE TABLE IF NOT EXISTS kv_content (
    id bigint GENERATED ALWAYS AS IDENTITY, ts double precision NOT NULL,
    worker text NOT NULL, rank integer NOT NULL, seq bigint NOT NULL, idx integer NOT NULL,
    kind text NOT NULL, content bytea,
    CONSTRAINT kv_content_key UNIQUE (worker, rank, seq, ts, idx)) PARTITION BY RANGE (ts);
CREATE INDEX IF NOT EXISTS kv_content_id ON kv_content (id);
CREATE TABLE IF NOT EXISTS availability (
    ts double precision NOT NULL, request_id text NOT NULL PRIMARY KEY, router text NOT NULL,
    model text NOT NULL, worker text NOT NULL, block_size integer NOT NULL,
    prompt integer NOT NULL, best integer NOT NULL, realized integer NOT NULL,
    avoidable integer NOT NULL, not_cacheable integer NOT NULL, false_hit integer NOT NULL,
    predicted integer, images integer NOT NULL, fidelity text NOT NULL,
    load_spill integer NOT NULL, content_blind integer NOT NULL, stale_index integer NOT NULL,
    count_drift integer NOT NULL, unattributed integer NOT NULL, evicted integer NOT NULL,
    unexplained integer NOT NULL, body text NOT NULL);
CREATE INDEX IF NOT EXISTS availability_ts ON availability (ts);
CREATE TABLE IF NOT EXISTS availability_cells (
    ts double precision NOT NULL, router text NOT NULL, model text NOT NULL,
    worker text NOT NULL, sums text NOT NULL, PRIMARY KEY (ts, router, model, worker));
CREATE TABLE IF NOT EXISTS verdicts (
    request_id text NOT NULL PRIMARY KEY, ts double precision NOT NULL,
    category text NOT NULL, headline text NOT NULL, worker text, better_worker text,
    better_blocks integer, judged_at double precision NOT NULL, version integer NOT NULL,
    body text NOT NULL);
CREATE INDEX IF NOT EXISTS verdicts_ts ON verdicts (ts);
CREATE INDEX IF NOT EXISTS verdicts_judged ON verdicts (judged_at);
CREATE TABLE IF NOT EXISTS health (
    collector text NOT NULL, target text NOT NULL, updated double precision NOT NULL,
    last_success double precision, last_error text, last_error_ts double precision,
    errors text NOT NULL, counters text NOT NULL, instance text NOT NULL DEFAULT '',
    PRIMARY KEY (collector, target, instance));
"""

try:  # the COPY stream of a write built in one compiled call (``_kvrows.c``)
    from mmlens.store._kvrows import copy_binary as _copy_binary
except ImportError:
    _copy_binary = None
# Column types the compiled COPY writes, by their PostgreSQL names.
_COPY_CODES = {"float8": "d", "int4": "i", "int8": "q", "text": "t", "bytea": "b"}


def copy_data(rows: Sequence[Sequence[Any]], types: list[str]) -> bytes | None:
    """The rows as one binary COPY stream, compiled: psycopg's ``write_row`` per row was a
    third of the client's CPU per stored KV event (``benchmarks/kv_ingest.py``). None where
    it is not built or a column's type is not one it writes: ``write_row`` then. A value a
    column cannot take raises here, before the COPY starts, as ``write_row`` would."""
    if _copy_binary is None or not all(t in _COPY_CODES for t in types):
        return None
    return _copy_binary(rows if type(rows) is list else list(rows),
                        "".join(_COPY_CODES[t] for t in types))


_PART = re.compile(rf"^({'|'.join(APPEND_ONLY)})_p(\d+)$")


class PostgresStore(SQLStore):
    key = "id"

    def __init__(self, url: str, readonly: bool = False,
                 partition_s: float = PARTITION_S) -> None:
        self.path = redact(url)
        self._url = url
        try:
            self.db = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self.path}: {exc}") from None
        self.readonly = readonly
        self._parts: dict[str, set[int]] = {t: set() for t in APPEND_ONLY}
        self._types: dict[tuple[str, str], list[str]] = {}
        if readonly:
            if self._one("SELECT to_regclass('meta')") is None:
                self.db.close()
                raise NoStoreYet(f"no store at {self.path}")
            self.db.execute("SET default_transaction_read_only = on")
        else:
            with self._tx():
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                self.db.execute(_SCHEMA)
                self.db.execute(rollups.POSTGRES_SCHEMA)
                self._migrate_v2()
                self._migrate_v3()
                self._check_version()
                if self.meta("partition_s") is None:
                    self.set_meta("partition_s", partition_s)
        self.partition_s = float(self.meta("partition_s") or partition_s)
        self._load_partitions()

    # --- the hooks of SQLStore ----------------------------------------------------------------

    @staticmethod
    def _pg(sql: str) -> str:
        return sql.replace("?", "%s")

    def _id_in(self) -> str:
        return f"{self.key} = ANY(?)"  # 1,000 ids in ~6 ms; as many range lookups ~130 ms

    @staticmethod
    def _id_set(ids: list[int]) -> Any:
        return ids  # psycopg sends a list as an array

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(self._pg(sql), list(args)).fetchall()

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.execute(self._pg(sql), list(args)).rowcount

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        with self.db.cursor() as cur:
            cur.executemany(self._pg(sql), rows)
            return max(cur.rowcount, 0)

    def _insert_new(self, table: str, columns: str, rows: Sequence[Sequence[Any]],
                    values: str | None = None) -> int:
        # COPY into a session-local staging table, then one INSERT … SELECT that skips the
        # keys stored already: a tenth of executemany's client CPU per row. Binary COPY: no
        # hex text of each bytea value (hashes, content keys) to build on this side.
        stage, types = f"{table}_in", self._column_types(table, columns)
        data = copy_data(rows, types)
        with self.db.cursor() as cur:
            cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS "
                        f"SELECT {columns} FROM {table} WITH NO DATA")
            with cur.copy(f"COPY {stage} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
                if data is not None:
                    copy.write(data)
                else:
                    copy.set_types(types)
                    for row in rows:
                        copy.write_row(row)
            cur.execute(f"WITH moved AS (DELETE FROM {stage} RETURNING {columns}) "
                        f"INSERT INTO {table} ({columns}) SELECT {columns} FROM moved "
                        "ON CONFLICT DO NOTHING")
            return max(cur.rowcount, 0)

    def _column_types(self, table: str, columns: str) -> list[str]:
        """The type names of ``columns`` of ``table`` (fixed by the schema: asked once)."""
        found = self._types.get((table, columns))
        if found is None:
            types = dict(self._rows(
                "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON "
                "t.oid = a.atttypid WHERE a.attrelid = to_regclass(?) AND a.attnum > 0 AND "
                "NOT a.attisdropped", (table,)))
            found = self._types[table, columns] = [types[c.strip()] for c in columns.split(",")]
        return found

    @contextlib.contextmanager
    def _tx(self, exclusive: bool = False) -> Iterator[None]:
        self._writable()
        with self.db.transaction():
            if exclusive:
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            yield

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        """One transaction around several writes (theirs nest in it as savepoints); the
        partitions it made are forgotten again when it rolls back."""
        try:
            with self._tx():
                yield
        except BaseException:
            with contextlib.suppress(Exception):
                self._load_partitions()
            raise

    _given_ids = "OVERRIDING SYSTEM VALUE"

    def _reserve_ids(self, table: str, n: int) -> list[int]:
        return [int(i) for (i,) in self._rows(
            "SELECT nextval(pg_get_serial_sequence(?, 'id')) FROM generate_series(1, ?)",
            (table, n))]

    def _bucket(self, column: str) -> str:
        return f"floor({column} / ?) * ?"

    def _columns(self, table: str) -> set[str]:
        return {c for (c,) in self._rows(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?", (table,))}

    def is_outage(self, exc: Exception) -> bool:
        # Connection lost or refused, server shutting down, disk full (class 53), ...
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError)

    def reconnect(self) -> None:
        if not (self.db.closed or self.db.broken):
            return
        self.db = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
        if self.readonly:
            self.db.execute("SET default_transaction_read_only = on")
        self._load_partitions()

    def _missing_table(self, exc: Exception) -> bool:
        return isinstance(exc, psycopg.errors.UndefinedTable)

    def _before_append(self, table: str, timestamps: Iterable[float]) -> None:
        self._ensure_partitions(table, timestamps)

    def close(self) -> None:
        self.db.close()

    # --- partitions ----------------------------------------------------------------------------

    def _start(self, ts: float) -> int:
        return int(math.floor(ts / self.partition_s) * self.partition_s)

    def _load_partitions(self) -> None:
        for table in self._parts:
            self._parts[table] = {int(m.group(2)) for (name,) in self._rows(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(?)", (table,))
                if (m := _PART.match(name))}

    def _ensure_partitions(self, table: str, timestamps: Iterable[float]) -> None:
        times = set(timestamps)  # a batch's events share their time
        if not times:
            return
        start, parts = self._start(min(times)), self._parts[table]
        if start in parts and start == self._start(max(times)):
            return  # the common case: all in one partition that is there
        missing = {self._start(ts) for ts in times} - parts
        if not missing:
            return
        if len(missing) > 1000:
            raise StoreError(f"{table}: rows span {len(missing)} partitions of "
                             f"{self.partition_s:.0f} s (timestamps far apart?)")
        with self._tx():
            self.db.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            for start in sorted(missing):
                self.db.execute(
                    f"CREATE TABLE IF NOT EXISTS {table}_p{start} PARTITION OF {table} "
                    f"FOR VALUES FROM ({start}) TO ({start + int(self.partition_s)})")
        self._parts[table] |= missing

    def partitions(self, table: str) -> list[int]:
        """Start times of ``table``'s partitions, oldest first."""
        self._load_partitions()
        return sorted(self._parts[table])

    # --- retention -----------------------------------------------------------------------------

    def prune(self, retention_s: float, max_bytes: float, now: float | None = None) -> int:
        """Drop the partitions wholly older than ``retention_s`` and delete the older rows of
        the one that straddles the cutoff; then, while the store is larger than ``max_bytes``,
        drop the oldest partitions (never the one holding a table's newest rows: deleted rows
        free no space in PostgreSQL until a vacuum, dropped partitions do at once). Creates
        the next window's partitions ahead of time. Returns rows deleted."""
        now = self._now(now)
        cutoff = now - retention_s
        width = int(self.partition_s)
        deleted = 0
        for table in APPEND_ONLY:
            for start in self.partitions(table):
                if start + width <= cutoff:
                    deleted += self._drop(table, start)
            self._ensure_partitions(table, [now, now + self.partition_s])
        for table in PRUNED_TABLES:
            with self._tx():
                deleted += self._exec(f"DELETE FROM {table} WHERE ts < ?", (cutoff,))
        while self.used_bytes() > max_bytes:
            older = [(start, table) for table in APPEND_ONLY
                     for start in self.partitions(table)
                     if start < self._start(self.latest_ts(table) or now)]
            if not older:
                break
            start, table = min(older)
            deleted += self._drop(table, start)
        with self._tx():
            self._prune_keys()
        return deleted

    def _drop(self, table: str, start: int) -> int:
        name = f"{table}_p{start}"
        with self._tx():
            self.db.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            n = self._one(f"SELECT count(*) FROM {name}") or 0
            self.db.execute(f"DROP TABLE IF EXISTS {name}")
        self._parts[table].discard(start)
        return int(n)

    def used_bytes(self) -> int:
        return int(self._one(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'") or 0)

    def _migrate_v2(self) -> None:
        """Schema 2 → 3 in place (``mmlens.store.schema.migrate_v2``): the content keys of
        kv_content move into their event rows (every partition gains the column)."""
        if "content" in self._columns("kv_events"):
            return
        self.db.execute("ALTER TABLE kv_events ADD COLUMN content bytea")
        self.db.execute(MOVE_CONTENT)
        self.db.execute("DELETE FROM kv_content")
        self.db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version' AND "
                        "value = '2'")

    def _migrate_v3(self) -> None:
        """Schema 3 → 4 in place (``mmlens.store.schema.migrate_v3``), under the DDL lock."""
        if self._one("SELECT value FROM meta WHERE key = 'schema_version'") != "3":
            return
        self.db.execute(FOLD_DECISIONS)
        self.db.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version' AND "
                        "value = '3'")

    def _check_version(self) -> None:
        found = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
        if found is None:
            self.db.execute("INSERT INTO meta VALUES ('schema_version', %s)",
                            (str(SCHEMA_VERSION),))
        elif int(found) != SCHEMA_VERSION:
            raise StoreError(f"store schema {found}, this mmlens expects {SCHEMA_VERSION}")
