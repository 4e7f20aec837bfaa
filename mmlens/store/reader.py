"""The dashboard's and the CLIs' read side over a store (SQLite or PostgreSQL): bounded,
index-friendly queries (recent windows, one trace by id, KV-event buckets) returning typed
records, with the routing decisions router logs gave joined to each trace (the one join).
A page renders in milliseconds on a store of 100k traces and millions of KV blocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mmlens.ingest.metric_series import Series
from mmlens.ingest.metrics_normalize import (
    READ_NAMES,
    READ_PREFIXES,
    NormalizedMetrics,
    normalize,
)
from mmlens.records import (
    Availability,
    CollectorHealth,
    KVEventRow,
    MetricSample,
    RequestTrace,
    ResidentSummary,
    RoutingDecision,
    Verdict,
    WorkerMinute,
)
from mmlens.store.base import SQLStore, StoreError
from mmlens.store.codec import TraceLabels
from mmlens.store.decisions import attach, trace_keys
from mmlens.store.open import open_store
from mmlens.whatif.workload import RecordedRequest, workload

T = TypeVar("T")
ENGINE_PREFIXES = ("vllm:", "sglang:", "sglang_")  # the workers' own series


class StoreReader:
    """A read-only store connection shared by the dashboard's sessions (one lock: a
    connection is not meant for concurrent use from several threads)."""

    def __init__(self, path: str | Path) -> None:
        self.store = open_store(path, readonly=True)
        self.path = str(path)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def _locked(self, read: Callable[[SQLStore], T]) -> T:
        with self.lock:
            return read(self.store)

    # --- traces ----------------------------------------------------------------------------

    def recent_traces(self, limit: int = 300) -> list[RequestTrace]:
        """The newest traces, each with the decisions router logs gave for it."""
        return self.with_decisions(self._locked(lambda s: s.traces(limit)))

    def traces_from(self, since: float, limit: int = 300) -> list[RequestTrace]:
        """``recent_traces`` of those recorded at or after ``since``."""
        return self.with_decisions(self._locked(lambda s: s.traces_from(since, limit)))

    def trace_labels(self) -> list[TraceLabels]:
        """Every stored request's id, time, router, model and worker, without its body."""
        return self._locked(SQLStore.trace_labels)

    def traces_before(self, ts: float, limit: int = 500) -> list[RequestTrace]:
        """The ``limit`` traces recorded just before ``ts`` (a request's history)."""
        return self._locked(lambda s: s.traces(limit, before=ts))

    def traces_between(self, since: float, until: float, limit: int = 1000,
                       ) -> list[RequestTrace]:
        return self._locked(lambda s: s.traces_between(since, until, limit))

    def window_traces(self, since: float, until: float, limit: int = 100_000,
                      ) -> list[RequestTrace]:
        """Every trace from ``since`` to ``until`` (oldest first), with its decisions."""
        return self.with_decisions(self.traces_between(since, until, limit))

    def workload(self, since: float, until: float, limit: int = 1_000_000,
                 ) -> list[RecordedRequest]:
        """Every request recorded from ``since`` to ``until`` as the what-if models and
        ``mmlens replay`` read it (``mmlens.whatif.workload``): its trace, the decisions
        router logs gave for it and its stored verdict."""
        traces = self.window_traces(since, until, limit)
        verdicts = self._locked(lambda s: s.verdicts_between(since, until, limit))
        return workload(traces, {v.request_id: v for v in verdicts})

    def trace_span(self) -> tuple[float, float] | None:
        """The first and last stored trace's times (None: no traces)."""
        return self._locked(SQLStore.trace_span)

    def trace(self, request_id: str) -> RequestTrace | None:
        """A trace by its request id, or by any other id it is known by (response id,
        engine id, trace id: see ``mmlens.ingest.observed.keys_of``)."""
        found = self._locked(lambda s: s.trace(request_id) or s.trace_by_key(request_id))
        return None if found is None else self.with_decisions([found])[0]

    def trace_count(self) -> int:
        return self._locked(SQLStore.trace_count)

    # --- routing decisions from router logs ---------------------------------------------------

    def decisions_for(self, request_id: str, response_id: str | None = None,
                      ) -> list[RoutingDecision]:
        """Decisions logged for one request (by its id, or its response id: SMG gRPC answers
        ``<rid>-<uuid>``, Dynamo ``chatcmpl-<id>``)."""
        keys = trace_keys(RequestTrace(request_id, "", "", "", 0.0, False,
                                       response_id=response_id))
        return self._locked(lambda s: s.decisions(sorted(keys)))

    def decisions_for_traces(self, traces: Sequence[RequestTrace]) -> list[RoutingDecision]:
        """Decisions logged for any of ``traces``, in one bounded query."""
        keys = sorted({k for t in traces for k in trace_keys(t)})
        return self._locked(lambda s: s.decisions(keys)) if keys else []

    def with_decisions(self, traces: list[RequestTrace]) -> list[RequestTrace]:
        attach(traces, self.decisions_for_traces(traces))
        return traces

    # --- metrics -----------------------------------------------------------------------------

    def latest_sample_ts(self) -> float | None:
        return self._locked(lambda s: s.latest_ts("samples"))

    def samples(self, since: float, names: Sequence[str] | None = None) -> list[MetricSample]:
        return self._locked(lambda s: s.samples_since(since, names))

    def last_samples(self, since: float, names: Sequence[str]) -> list[MetricSample]:
        """The newest sample of each series and value of ``names`` since ``since``."""
        return self._locked(lambda s: s.last_samples(since, names))

    def series(self, since: float, names: Sequence[str] | None = None,
               prefixes: Sequence[str] = ()) -> Series:
        """Samples since ``since`` as series, of ``names`` and ``prefixes`` (default: all)."""
        return self._locked(lambda s: s.series_since(since, names, prefixes))

    def recent_series(self, window_s: float, names: Sequence[str]) -> Series:
        """``recent_samples`` as series."""
        latest = self.latest_sample_ts()
        return {} if latest is None else self.series(latest - window_s, names)

    def sample_names(self, since: float) -> dict[str, set[str]]:
        return self._locked(lambda s: s.sample_names(since))

    def normalized_since(self, since: float) -> NormalizedMetrics:
        """The window normalized from only the series the normalizers read (and every
        target's names, for its flavor): a vLLM worker exposes 60+ series, they read a few."""
        return normalize(self.series(since, sorted(READ_NAMES), READ_PREFIXES),
                         self.sample_names(since))

    def router_metrics(self, window_s: float = 300.0, skip: Sequence[str] = (),
                       ) -> NormalizedMetrics:
        """The window normalized from the routers' series only (SMG's and Dynamo's, not the
        engines'): what the Routing and Lab pages show, without reading a fleet's worker
        series; ``skip``: names (and ``READ_PREFIXES``) the caller does not show."""
        latest = self.latest_sample_ts()
        if latest is None:
            return normalize({})
        names = sorted(n for n in READ_NAMES
                       if not n.startswith(ENGINE_PREFIXES) and n not in skip)
        prefixes = [p for p in READ_PREFIXES if p not in skip]
        return normalize(self.series(latest - window_s, names, prefixes))

    def recent_samples(self, window_s: float, names: Sequence[str] | None = None,
                       ) -> list[MetricSample]:
        """Samples of the ``window_s`` before the latest one (empty on a store without any)."""
        latest = self.latest_sample_ts()
        return [] if latest is None else self.samples(latest - window_s, names)

    def normalized(self, window_s: float = 300.0) -> NormalizedMetrics:
        latest = self.latest_sample_ts()
        return normalize({}) if latest is None else self.normalized_since(latest - window_s)

    # --- KV events ---------------------------------------------------------------------------

    def latest_kv_ts(self) -> float | None:
        return self._locked(lambda s: s.latest_ts("kv_events"))

    def kv_timeline(self, window_s: float = 900.0, bucket_s: float = 10.0,
                    ) -> list[tuple[float, str, str, int]]:
        """Blocks per (bucket, worker, kind) over the last ``window_s`` of events."""
        latest = self.latest_kv_ts()
        if latest is None:
            return []
        return self._locked(lambda s: s.kv_timeline(latest - window_s, bucket_s))

    def folded_minutes(self, window_s: float, measure: str, keep: int,
                       ) -> tuple[list[WorkerMinute], int] | None:
        """The rollup minutes of the last ``window_s`` (up to the newest minute): the ``keep``
        busiest workers by ``measure`` (``mmlens.store.rollups.MEASURES``) by name, every
        other worker summed per minute (``worker`` None), and how many workers there are.
        Three queries whatever the raw events behind them; None before any rollup."""
        def read(s: SQLStore) -> tuple[list[WorkerMinute], int] | None:
            latest = s.latest_minute()
            if latest is None:
                return None
            since = latest + 60.0 - window_s
            top, n = s.busiest_workers(since, measure, keep)
            rows = s.worker_minutes(since, top)
            if n > len(top):
                rows += s.other_minutes(since, top)
            return sorted(rows, key=lambda r: r.ts), n
        return self._locked(read)

    def worker_hit_sums(self, window_s: float) -> list[tuple[str, float, float, int]] | None:
        """Per worker, its prefix hit and queried tokens over the rollup minutes of the last
        ``window_s`` (up to the newest minute) and how many minutes; None before any
        rollup. One query, one row per worker."""
        def read(s: SQLStore) -> list[tuple[str, float, float, int]] | None:
            latest = s.latest_minute()
            return None if latest is None else s.worker_hit_sums(latest + 60.0 - window_s)
        return self._locked(read)

    def recent_kv_events(self, limit: int = 300) -> list[KVEventRow]:
        return self._locked(lambda s: s.kv_event_rows(limit))

    def removals(self, since: float, until: float) -> list[KVEventRow]:
        """KV removals and clears between two times (what eviction is judged on); block
        hashes are not decoded."""
        return self._locked(lambda s: s.kv_event_rows(
            None, since=since, until=until, kinds=("removed", "cleared"), hashes=False))

    def kv_event_counts(self) -> dict[str, dict[str, int]]:
        """Events and blocks per worker and kind over the whole store (a full scan)."""
        return self._locked(SQLStore.kv_event_counts)

    def kv_blocks(self, worker: str, kind: str, since: float, until: float) -> int:
        """Blocks one worker stored (or removed) between two times, from its KV events."""
        return self._locked(lambda s: s.kv_blocks(worker, kind, since, until))

    def first_stored_parent(self, worker: str, since: float, until: float) -> str | None:
        """The parent hash of the first block a worker stored in a time window (None: the
        chain starts at the root, or nothing was stored)."""
        return self._locked(lambda s: s.first_stored_parent(worker, since, until))

    def has_kv_events(self, worker: str) -> bool:
        return self._locked(lambda s: s.has_kv_events(worker))

    def kv_state(self) -> list[ResidentSummary]:
        return self._locked(SQLStore.kv_state)

    def kv_views(self, since: float) -> list[tuple[float, str, str, int | None, int | None, int,
                                                   int]]:
        """Router view vs engine holdings per worker since ``since`` (an older store: none)."""
        return self._locked(lambda s: s.kv_views(since))

    def scrape_times(self, since: float, targets: Sequence[str]) -> dict[str, list[float]]:
        """When each of ``targets`` was scraped since ``since`` (liveness needs the scrapes
        that listed no worker too)."""
        return self._locked(lambda s: s.scrape_times(since, targets))

    # --- health and meta ----------------------------------------------------------------------

    # --- available vs achieved ---------------------------------------------------------------

    def availability_window(self, window_s: float, recent: int = 50,
                            ) -> tuple[list[tuple[float, str, str, str, dict[str, int]]],
                                       list[Availability]]:
        """Per-minute cells and the newest per-request records of the last ``window_s`` of
        evaluated requests (up to the newest one, or now)."""
        def read(s: SQLStore) -> tuple[list[tuple[float, str, str, str, dict[str, int]]],
                                       list[Availability]]:
            latest = s.latest_availability_ts()
            since = (time.time() if latest is None else latest) - window_s
            return s.cells(since), s.availability_rows(since, recent)

        return self._locked(read)

    # --- stored verdicts (the verdict job's; every view reads them) ---------------------------

    def verdicts_for(self, traces: Sequence[RequestTrace]) -> dict[str, Verdict]:
        """Request id → stored verdict, for those of ``traces`` judged already."""
        return self.store_verdicts([t.request_id for t in traces])

    def store_verdicts(self, request_ids: Sequence[str]) -> dict[str, Verdict]:
        """Request id → stored verdict, for those judged already."""
        ids = list(request_ids)
        return self._locked(lambda s: s.verdicts_for(ids)) if ids else {}

    def verdicts_judged_since(self, judged_at: float, limit: int = 5_000) -> list[Verdict]:
        """Verdicts judged or re-judged at ``judged_at`` or later (at most ``limit``)."""
        return self._locked(lambda s: s.verdicts_judged_since(judged_at, limit))

    def verdict(self, request_id: str) -> Verdict | None:
        """A request's stored verdict by any id it is known by (None: not judged yet)."""
        t = self.trace(request_id)
        rid = request_id if t is None else t.request_id
        return self._locked(lambda s: s.verdicts_for([rid])).get(rid)

    def verdict_counts(self, since: float, until: float | None = None) -> dict[str, int]:
        return self._locked(lambda s: s.verdict_counts(since, until))

    def health(self) -> list[CollectorHealth]:
        return self._locked(SQLStore.health)

    def meta(self, key: str) -> Any:
        return self._locked(lambda s: s.meta(key))

    def quarantined(self) -> list[dict[str, Any]]:
        return self._locked(SQLStore.quarantined)

    def schema_version(self) -> int:
        return self._locked(SQLStore.schema_version)

    def data_versions(self) -> dict[str, tuple[Any, ...]]:
        """Per table, a version that moves only when its rows do
        (``mmlens.store.versions``)."""
        return self._locked(SQLStore.data_versions)


def open_reader(path: str | Path | None) -> StoreReader:
    if not path:
        raise StoreError("no store configured (set MMLENS_DB or start `mmlens dashboard`)")
    return StoreReader(path)
