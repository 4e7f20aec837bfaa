"""The store's current state as one typed record: ``mmlens snapshot --json`` prints its
``to_json()``; the Overview and Routing pages read it (``mmlens.store.snapshot`` builds it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mmlens.ingest.metrics_records import NormalizedMetrics
from mmlens.records import CollectorHealth, RequestTrace, ResidentSummary, Verdict


@dataclass(slots=True)
class KVEndpointHealth:
    """One KV-event endpoint's counters as its collector last reported them."""

    last_success: float | None
    batches: float = 0
    events: float = 0
    gaps: float = 0
    missed_batches: float = 0
    replays: float = 0
    replayed_batches: float = 0
    initial_sync_batches: float = 0
    restarts: float = 0
    stale_batches: float = 0
    lost_batches: float = 0  # published - received - owed: given up for good
    owed_batches: float = 0  # a silent replay's batches, still asked for
    late_recovered_batches: float = 0
    mean_lag_s: float | None = None
    last_seq: float | None = None
    errors: dict[str, int] | None = None

    @classmethod
    def of(cls, h: CollectorHealth) -> KVEndpointHealth:
        c = h.counters
        return cls(h.last_success, *(c.get(k, 0) for k in (
            "batches", "events", "gaps", "missed_batches", "replays", "replayed_batches",
            "initial_sync_batches", "restarts", "stale_batches", "lost_batches",
            "owed_batches", "late_recovered_batches")),
            mean_lag_s=c.get("mean_lag_s"), last_seq=c.get("last_seq"), errors=h.errors)


@dataclass(slots=True)
class Snapshot:
    schema_version: int = 0
    generated_at: float = 0.0
    window_s: float = 300.0
    latest_sample_ts: float | None = None
    targets: dict[str, Any] | None = None
    router_state: list[dict[str, Any]] | None = None
    health: list[CollectorHealth] = field(default_factory=list)
    metrics: NormalizedMetrics = field(default_factory=NormalizedMetrics)
    dynamo_mm_routing: dict[str, Any] = field(default_factory=dict)
    kv_endpoints: dict[str, KVEndpointHealth] = field(default_factory=dict)
    kv_stored: dict[str, dict[str, int]] | None = None  # None: not counted (the pages' build)
    resident: list[ResidentSummary] = field(default_factory=list)
    traces: list[RequestTrace] = field(default_factory=list)
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # bad items, named
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # the traces' stored ones

    def to_json(self) -> dict[str, Any]:
        """The ``mmlens snapshot --json`` document."""
        m = self.metrics.to_json()
        return {
            "schema_version": self.schema_version,
            "generated_at": self.generated_at,
            "window_s": self.window_s,
            "latest_sample_ts": self.latest_sample_ts,
            "targets": self.targets,
            "router_state": self.router_state,
            "health": [asdict(h) for h in self.health],
            **{k: m[k] for k in ("flavors", "hit_rates", "mm_processing",
                                 "cache_aware_branches", "match_ratio", "worker_requests",
                                 "dynamo")},
            "dynamo_mm_routing": self.dynamo_mm_routing,
            "worker_health": m["worker_health"],
            "dynamo_worker_ids": m["dynamo_worker_ids"],
            "router_kv_event_health": m["kv_event_health"],
            "kv_event_health": {"endpoints": {k: asdict(v) for k, v in self.kv_endpoints.items()},
                                "stored": self.kv_stored},
            "resident_blocks": {f"{r.worker}#{r.rank}": {
                "worker": r.worker, "rank": r.rank, "blocks": r.resident_blocks,
                "images": r.images, "updated": r.updated} for r in self.resident},
            "traces": [t.to_json() for t in self.traces],
            "quarantined": self.quarantined,
        }
