"""The one snapshot builder: the store's current state as a ``mmlens.state.Snapshot``
(``mmlens snapshot`` prints its JSON; the pages build it without the full KV-event count)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from mmlens.ingest.metrics_records import NormalizedMetrics
from mmlens.records import CollectorHealth, RequestTrace, Verdict
from mmlens.state import KVEndpointHealth, Snapshot

if TYPE_CHECKING:
    from mmlens.store.reader import StoreReader


def build_snapshot(reader: StoreReader, window_s: float = 300.0, n_traces: int = 20,
                   now: float | None = None, *, count_kv_events: bool = True,
                   metrics: NormalizedMetrics | None = None, resident: bool = True,
                   health: list[CollectorHealth] | None = None,
                   traces: list[RequestTrace] | None = None,
                   verdicts: dict[str, Verdict] | None = None) -> Snapshot:
    """``count_kv_events=False`` skips the one full-table scan (per-worker stored-event
    counts) for the pages, which refresh every few seconds; ``metrics``: the window's metrics
    as the caller read them (a fleet page's from the rollups), instead of normalizing every
    raw sample of the window; ``resident=False`` leaves the resident summaries out;
    ``health``, ``traces``, ``verdicts`` (those of ``traces``): as the caller already read
    them."""
    now = time.time() if now is None else now
    latest = reader.latest_sample_ts()
    since = (latest if latest is not None else now) - window_s
    health = reader.health() if health is None else health
    traces = reader.recent_traces(n_traces) if traces is None else traces
    return Snapshot(
        schema_version=reader.schema_version(),
        generated_at=now,
        window_s=window_s,
        latest_sample_ts=latest,
        targets=reader.meta("targets"),
        router_state=reader.meta("router_state"),
        health=health,
        metrics=reader.normalized_since(since) if metrics is None else metrics,
        dynamo_mm_routing=reader.meta("dynamo_mm_routing") or {},
        kv_endpoints=kv_endpoints(health),
        kv_stored=reader.kv_event_counts() if count_kv_events else None,
        resident=reader.kv_state() if resident else [],
        traces=traces,
        verdicts=reader.verdicts_for(traces) if verdicts is None else verdicts,
        quarantined=reader.quarantined(),
    )


def kv_endpoints(health: list[CollectorHealth]) -> dict[str, KVEndpointHealth]:
    return {h.target: KVEndpointHealth.of(h) for h in health if h.collector == "kv_events"}


def with_health(snap: Snapshot, health: list[CollectorHealth]) -> Snapshot:
    """``snap`` with newer collector health (rewritten on every collector tick, so the pages
    read it on each run and cache the rest of the snapshot)."""
    return replace(snap, health=health, kv_endpoints=kv_endpoints(health))
