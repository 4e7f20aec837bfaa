"""The store's data versions: per table, a value that changes when its rows do and stays put
otherwise (a collector tick that wrote nothing new leaves it alone), each from an index probe
or a scan of a few small rows. The dashboard keys its cached reads by the versions of the
tables each read uses, instead of re-reading on a timer.

What a version misses: a trace merged in place (its row id stays; the verdict it is
re-judged with moves the verdicts' version), a request evaluated again (availability) and a
resident summary rewritten to the same length. The dashboard's caches expire after a minute
for those."""

from __future__ import annotations

from typing import Any

from mmlens.store.dialect import SQLBase

# Settled rollup minutes are never rewritten: the version sums only the minutes the rollup
# job still rewrites (its settle window, 120 s, and the current minute).
ROLLUP_SETTLE_S = 180.0
QUARANTINE_KEYS = "quarantine:%"  # each collector process's bad items, in meta


def version_queries(key: str) -> dict[str, str]:
    """The SQL of each table's version (``key``: the backend's row-order column)."""
    return {
        "traces": f"SELECT max({key}) FROM traces",
        "decisions": f"SELECT max({key}) FROM decisions",
        "kv_events": f"SELECT max({key}) FROM kv_events",
        "samples": "SELECT max(ts) FROM samples",
        "kv_views": "SELECT max(ts) FROM kv_views",
        "verdicts": "SELECT max(judged_at) FROM verdicts",
        "availability": "SELECT max(ts) FROM availability",
        "kv_state": "SELECT count(*), sum(length(summary)) FROM kv_state",
        "meta": "SELECT count(*), sum(length(value)) FROM meta WHERE key NOT LIKE ?",
        "quarantine": "SELECT count(*), sum(length(value)) FROM meta WHERE key LIKE ?",
        "worker_minutes": (
            "SELECT max(ts), sum(kv_stored + kv_removed), sum(query_tokens), "
            "sum(coalesce(kv_resident, 0)) FROM worker_minutes "
            f"WHERE ts >= (SELECT max(ts) FROM worker_minutes) - {ROLLUP_SETTLE_S}"),
    }


class StoreVersions(SQLBase):
    def data_versions(self) -> dict[str, tuple[Any, ...]]:
        """Table name → its version (None: the table is not there yet)."""
        out: dict[str, tuple[Any, ...]] = {}
        for table, sql in version_queries(self.key).items():
            rows = self._rows_if_table(sql, (QUARANTINE_KEYS,) if "?" in sql else ())
            out[table] = tuple(rows[0]) if rows else ()
        return out
