"""Worker liveness from the routers' own per-worker series: a worker whose series vanished from
its router's scrapes is gone, since the first scrape that no longer listed it (a worker that
left stays "registered" nowhere else: Dynamo drops its ``router_worker_registered`` series,
SMG its ``smg_worker_health``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mmlens.records import MetricSample

# metric name → the label naming the worker
WORKER_SERIES = {
    "dynamo_component_router_worker_registered": "router_worker_id",
    "dynamo_frontend_worker_active_decode_blocks": "worker_id",
    "smg_worker_health": "worker",
}


@dataclass(frozen=True, slots=True)
class WorkerLiveness:
    router: str
    worker: str
    state: str  # live | gone
    last_seen: float
    gone_since: float | None = None


def worker_liveness(samples: Iterable[MetricSample],
                    scrape_times: Mapping[str, Iterable[float]] | None = None,
                    ) -> list[WorkerLiveness]:
    """Per (router target, worker): live when the target's latest scrape lists it; otherwise
    gone since the first later scrape of that target. ``scrape_times`` adds the times of
    scrapes that listed none of these series (a router whose last worker left)."""
    scrapes: dict[str, set[float]] = {t: set(ts) for t, ts in (scrape_times or {}).items()}
    seen: dict[tuple[str, str], float] = {}
    for s in samples:
        scrapes.setdefault(s.target, set()).add(s.ts)
        label = WORKER_SERIES.get(s.name)
        if label is None:
            continue
        worker = s.label(label)
        if not worker:
            continue
        # Dynamo keeps a worker's registered series at 0 for a while after it leaves.
        if s.name == "dynamo_component_router_worker_registered" and s.value != 1:
            continue
        key = (s.target, worker)
        if s.ts > seen.get(key, float("-inf")):
            seen[key] = s.ts
    out = []
    for (target, worker), last in sorted(seen.items()):
        later = sorted(t for t in scrapes[target] if t > last)
        if later:
            out.append(WorkerLiveness(target, worker, "gone", last, later[0]))
        else:
            out.append(WorkerLiveness(target, worker, "live", last))
    return out


def liveness_names() -> tuple[str, ...]:
    return tuple(WORKER_SERIES)
