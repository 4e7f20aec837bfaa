"""Writes per-worker, per-minute rollups (``worker_minutes``) from every shard's raw rows.

The lead collector runs it every ``every_s``: it rewrites the minutes of the last ``settle_s``
(KV events and scrapes that arrive late still land in their minute), and fills the
``backfill_s`` before its start a ``chunk_s`` per run (a restarted collector fills what it
missed without one long first pass over a fleet's hour of raw rows).
"""

from __future__ import annotations

import time

from mmlens.analysis.rollups import MINUTE_S, build_minutes, minute_of
from mmlens.analysis.timeseries import HIT_NAMES, worker_hit_counts
from mmlens.records import WorkerMinute
from mmlens.store.base import SQLStore


def rollup_window(store: SQLStore, since: float, until: float, now: float,
                  ) -> list[WorkerMinute]:
    """The minutes from ``since`` to ``until`` (minute starts) from the raw rows; the
    counters are read from a minute earlier, so each minute's first rise is counted; the
    resident blocks known now go on the minute of ``now`` (when it is in the window)."""
    kv = store.kv_timeline(since, MINUTE_S, until)
    series = store.series_since(since - MINUTE_S, HIT_NAMES, until=until)
    hits = worker_hit_counts(series, MINUTE_S)
    resident = store.kv_state() if since <= now < until else []
    return [m for m in build_minutes(kv, hits, resident, since, now) if m.ts < until]


class RollupJob:
    def __init__(self, store: SQLStore, every_s: float = 10.0, settle_s: float = 120.0,
                 backfill_s: float = 3600.0, chunk_s: float = 600.0) -> None:
        self.store = store
        self.every_s = every_s
        self.settle_s = settle_s
        self.backfill_s = backfill_s
        self.chunk_s = chunk_s
        self.last_run: float | None = None
        self.filled_from: float | None = None  # minutes from here on are written
        self.fill_stop: float | None = None

    def run(self, now: float | None = None, force: bool = False) -> int:
        """Rewrite the recent minutes and fill one older chunk (when ``every_s`` has passed,
        or ``force``); returns the rows written."""
        now = time.time() if now is None else now
        if not force and self.last_run is not None and now - self.last_run < self.every_s:
            return 0
        self.last_run = now
        since = minute_of(now - self.settle_s)
        if self.filled_from is None:
            self.filled_from, self.fill_stop = since, minute_of(since - self.backfill_s)
        end = minute_of(now) + MINUTE_S
        n = self.store.set_worker_minutes(rollup_window(self.store, since, end, now))
        if self.fill_stop is not None and self.filled_from > self.fill_stop:
            lo = max(self.fill_stop, minute_of(self.filled_from - self.chunk_s))
            n += self.store.set_worker_minutes(rollup_window(self.store, lo, self.filled_from,
                                                             now))
            self.filled_from = lo
        return n

    def fill(self, now: float | None = None) -> int:
        """Every minute of the backfill at once (tests, benchmarks, ``flush``)."""
        n = self.run(now, force=True)
        while self.filled_from is not None and self.fill_stop is not None \
                and self.filled_from > self.fill_stop:
            n += self.run(now, force=True)
        return n
