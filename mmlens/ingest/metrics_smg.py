"""SMG router metrics: multimodal processing modes, cache-aware branches and match ratios,
per-worker requests, and KV-event health as SMG sees its workers' streams."""

from __future__ import annotations

from typing import Any

from mmlens.ingest.metric_series import SeriesIndex, label, latest, ratio
from mmlens.ingest.metrics_records import NormalizedMetrics

MM_PROCESSING_LABELS = ("model", "mode", "reason")


def normalize_smg(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    out.mm_processing = idx.counter_rows("smg_mm_processing_total", MM_PROCESSING_LABELS)
    out.worker_requests = idx.counter_rows("smg_worker_requests_total", ("worker", "model"))
    for target, labels, points in idx.get("smg_cache_aware_policy_branch_total"):
        out.cache_aware_branches.setdefault(target, {})[label(labels, "branch")] = latest(points)
    for target, labels, points in idx.get("smg_cache_aware_match_ratio_bucket"):
        hist = out.match_ratio.setdefault(target, {"buckets": {}, "sum": 0.0, "count": 0.0})
        hist["buckets"][label(labels, "le")] = latest(points)
    for suffix in ("sum", "count"):
        for target, _, points in idx.get(f"smg_cache_aware_match_ratio_{suffix}"):
            out.match_ratio.setdefault(target, {"buckets": {}, "sum": 0.0, "count": 0.0})[
                suffix] = latest(points)
    for hist in out.match_ratio.values():
        hist["mean"] = ratio(hist["sum"], hist["count"])
    _kv_event_health(idx, out)


def _kv_event_health(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    for target, labels, points in idx.get("smg_kv_event_batches_total"):
        w = _kv_health(out, target, label(labels, "worker"))
        w.setdefault("batches", {})[label(labels, "disposition")] = latest(points)
    for target, labels, points in idx.get("smg_kv_event_blocks_total"):
        w = _kv_health(out, target, label(labels, "worker"))
        w.setdefault("blocks", {})[label(labels, "op")] = latest(points)
    for name, key, sub in (("smg_kv_event_gaps_total", "gaps", "outcome"),
                           ("smg_kv_event_resyncs_total", "resyncs", "reason"),
                           ("smg_kv_event_subscription_failures_total", "subscription_failures",
                            "reason")):
        for target, labels, points in idx.get(name):
            w = _kv_health(out, target, label(labels, "worker"))
            w.setdefault(key, {})[label(labels, sub)] = latest(points)
    for name, key in (("smg_kv_event_subscriptions_total", "subscriptions"),
                      ("smg_kv_event_missed_batches_total", "missed_batches"),
                      ("smg_kv_event_parentless_blocks_total", "parentless_blocks"),
                      ("smg_kv_events_unavailable", "unavailable"),
                      ("smg_kv_event_degraded_ranks", "degraded_ranks"),
                      ("smg_kv_index_blocks", "index_blocks")):
        for target, labels, points in idx.get(name):
            _kv_health(out, target, label(labels, "worker"))[key] = latest(points)
    lag_sum = {(t, label(lb, "worker")): latest(p)
               for t, lb, p in idx.get("smg_kv_event_lag_seconds_sum")}
    for target, labels, points in idx.get("smg_kv_event_lag_seconds_count"):
        worker = label(labels, "worker")
        _kv_health(out, target, worker)["mean_lag_s"] = ratio(
            lag_sum.get((target, worker), 0.0), latest(points))


def _kv_health(out: NormalizedMetrics, target: str, worker: str) -> dict[str, Any]:
    return out.kv_event_health.setdefault(target, {"source": "smg", "workers": {}})[
        "workers"].setdefault(worker, {})
