"""The normalized metrics the dashboard shows: per-worker hit rates and the per-flavor parts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mmlens.ingest.metric_series import Points, increase, latest, ratio, span


@dataclass(slots=True)
class HitRate:
    """Token-weighted prefix hit rate of one worker (or a Dynamo model at the frontend)."""

    target: str
    worker: str
    model: str
    source: str
    hits_increase: float
    queries_increase: float
    window_s: float
    rate: float | None  # over the window; None when no query tokens in the window
    cumulative_rate: float | None  # since the counters started (last values)
    hit_rate: float | None  # rate when defined, else cumulative; None when not a hit rate
    warning: str | None = None

    @classmethod
    def build(cls, target: str, worker: str, model: str, source: str,
              hits: list[Points], queries: list[Points]) -> HitRate:
        h_inc = sum(increase(p) for p in hits)
        q_inc = sum(increase(p) for p in queries)
        window = max((span(p) for p in queries), default=0.0)
        rate = ratio(h_inc, q_inc)
        cum = ratio(sum(latest(p) for p in hits), sum(latest(p) for p in queries))
        return cls(target, worker, model, source, h_inc, q_inc, window, rate, cum,
                   rate if rate is not None else cum)


@dataclass(slots=True)
class NormalizedMetrics:
    flavors: dict[str, list[str]] = field(default_factory=dict)
    hit_rates: list[HitRate] = field(default_factory=list)
    mm_processing: list[dict[str, Any]] = field(default_factory=list)
    cache_aware_branches: dict[str, dict[str, float]] = field(default_factory=dict)
    match_ratio: dict[str, dict[str, Any]] = field(default_factory=dict)
    worker_requests: list[dict[str, Any]] = field(default_factory=list)
    dynamo: dict[str, dict[str, Any]] = field(default_factory=dict)
    kv_event_health: dict[str, dict[str, Any]] = field(default_factory=dict)
    worker_health: list[dict[str, Any]] = field(default_factory=list)
    # Dynamo worker targets: their own id, decimal as in nvext.worker_id and the frontend's
    # `dynamo_frontend_worker_*{worker_id}` (their `/metrics` label carries it in hex).
    dynamo_worker_ids: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
