"""Worker liveness from the routers' own per-worker series: a worker whose series vanished from
its router's scrapes is gone, since the first scrape that no longer listed it (a worker that
left stays "registered" nowhere else: Dynamo drops its ``router_worker_registered`` series,
SMG its ``smg_worker_health``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.analysis import kv_divergence
from mmlens.analysis.overview import Alert
from mmlens.records import MetricSample, RequestTrace, ResidentSummary, Verdict

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


@dataclass(frozen=True, slots=True)
class WorkersView:
    rows: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)


def _clock(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%H:%M:%S", time.gmtime(ts))


def workers_view(live: Sequence[WorkerLiveness], kv_state: Sequence[ResidentSummary],
                 views: Sequence[Sequence[Any]], traces: Sequence[RequestTrace],
                 verdicts: Mapping[str, Verdict], now: float) -> WorkersView:
    """The Overview's worker rows (state, since when, KV transport, resident blocks) and its
    alerts for gone workers and router views that diverge from the engines' holdings."""
    kv: dict[str, dict[str, Any]] = {}
    for s in kv_state:
        entry = kv.setdefault(s.worker, {"transport": s.transport, "resident": 0})
        entry["resident"] += s.resident_blocks
    rows: list[dict[str, Any]] = []
    alerts: list[Alert] = []
    named = set()
    for w in live:
        named.add(w.worker)
        k = kv.get(w.worker, {})
        rows.append({"router": w.router, "worker": w.worker, "state": w.state,
                     "since (UTC)": _clock(w.gone_since if w.state == "gone" else None),
                     "last seen (s ago)": round(max(0.0, now - w.last_seen), 1),
                     "KV transport": k.get("transport") or "—",
                     "resident blocks": k.get("resident")})
        if w.state == "gone":
            alerts.append(Alert("warning", "worker_gone", (
                f"{w.router}: worker {w.worker} is gone since {_clock(w.gone_since)} UTC "
                "(its series vanished from the router's metrics)"), since=w.gone_since))
    for worker, k in sorted(kv.items()):
        if worker not in named:
            rows.append({"router": "", "worker": worker, "state": "—", "since (UTC)": "",
                         "last seen (s ago)": None, "KV transport": k.get("transport") or "—",
                         "resident blocks": k.get("resident")})
    points = [kv_divergence.ViewPoint(float(r[0]), str(r[1]), str(r[2]), r[3], r[4],
                                      int(r[5]), int(r[6])) for r in views]
    points += kv_divergence.prediction_points(traces)
    alerts += [Alert("warning", "kv_view_divergence", a.message, since=a.since)
               for a in kv_divergence.alerts(
                   points, counted=kv_divergence.counted_ids(verdicts))]
    return WorkersView(rows, alerts)
