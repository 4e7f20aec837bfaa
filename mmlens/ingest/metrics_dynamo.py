"""Dynamo frontend and router metrics: predicted hit rates, token sums, registered workers,
image requests that fell back to text routing, router overhead, event-plane health, and
the worker ids of worker targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmlens.ingest.metric_series import SeriesIndex, label, latest, ratio
from mmlens.ingest.metrics_records import NormalizedMetrics

Entry = Callable[[str], dict[str, Any]]


def normalize_dynamo(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    def entry(target: str) -> dict[str, Any]:
        return out.dynamo.setdefault(target, {
            "predicted_hit_rate_mean": None, "predicted_requests": 0.0,
            "cached_tokens_sum": {}, "input_tokens_sum": {}, "block_size": {},
            "registered_workers": []})

    # `router_kv_hit_rate` is one predicted ratio per request: mean of ratios, not tokens.
    sums = {(t, lb): latest(p) for t, lb, p in idx.get("dynamo_component_router_kv_hit_rate_sum")}
    for target, labels, points in idx.get("dynamo_component_router_kv_hit_rate_count"):
        e = entry(target)
        e["predicted_requests"] += latest(points)
        e["_pred_sum"] = e.get("_pred_sum", 0.0) + sums.get((target, labels), 0.0)
    for e in out.dynamo.values():
        e["predicted_hit_rate_mean"] = ratio(e.pop("_pred_sum", 0.0), e["predicted_requests"])
    for name, key in (("dynamo_frontend_cached_tokens_sum", "cached_tokens_sum"),
                      ("dynamo_frontend_input_sequence_tokens_sum", "input_tokens_sum"),
                      ("dynamo_frontend_model_kv_cache_block_size", "block_size")):
        for target, labels, points in idx.get(name):
            entry(target)[key][label(labels, "model")] = latest(points)
    for target, labels, points in idx.get("dynamo_component_router_worker_registered"):
        # `worker_id` on component metrics is the frontend's own id (hex); the backend worker
        # is `router_worker_id` (decimal).
        entry(target)["registered_workers"].append({
            "worker_id": label(labels, "router_worker_id"), "dp_rank": label(labels, "dp_rank"),
            "worker_type": label(labels, "worker_type"), "registered": latest(points) == 1})

    _image_requests(idx, entry)
    _router_overhead(idx, entry)
    _event_plane_health(idx, out)


def _image_requests(idx: SeriesIndex, entry: Entry) -> None:
    """Per model: image-bearing requests (``images_per_request`` count minus its ``le="0"``
    bucket) and those Dynamo counted image tokens for (``image_tokens_per_request`` count,
    recorded only when every image's dims resolved); the difference is requests that fell
    back to text-prefix routing for want of image dims."""
    zero: dict[tuple[str, str], float] = {}
    for target, labels, points in idx.get("dynamo_frontend_images_per_request_bucket"):
        if label(labels, "le") in ("0", "0.0"):
            zero[(target, label(labels, "model"))] = latest(points)
    for target, labels, points in idx.get("dynamo_frontend_images_per_request_count"):
        model = label(labels, "model")
        mm = entry(target).setdefault("image_requests", {}).setdefault(model, {})
        mm["with_images"] = latest(points) - zero.get((target, model), 0.0)
    for target, labels, points in idx.get("dynamo_frontend_image_tokens_per_request_count"):
        model = label(labels, "model")
        mm = entry(target).setdefault("image_requests", {}).setdefault(model, {})
        mm["counted"] = latest(points)
    for e in [entry(t) for t in {t for t, _, _ in
                                 idx.get("dynamo_frontend_images_per_request_count")}]:
        for mm in e.get("image_requests", {}).values():
            if "with_images" in mm and "counted" in mm:
                mm["uncounted"] = max(0.0, mm["with_images"] - mm["counted"])


def _router_overhead(idx: SeriesIndex, entry: Entry) -> None:
    """Per stage: mean router overhead in ms."""
    prefix, suffix = "dynamo_router_overhead_", "_ms_sum"
    for name in [n for n in idx.by_name if n.startswith(prefix) and n.endswith(suffix)]:
        stage = name[len(prefix):-len(suffix)]
        counts = {t: latest(p) for t, _, p in idx.get(f"{prefix}{stage}_ms_count")}
        totals: dict[str, float] = {}
        for target, _, points in idx.get(name):
            totals[target] = totals.get(target, 0.0) + latest(points)
        for target, total in totals.items():
            entry(target).setdefault("router_overhead_ms_mean", {})[stage] = ratio(
                total, counts.get(target, 0.0))


def _event_plane_health(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    # `kv_cache_events_applied` also rises in approximate mode, so the ZMQ ingress counters
    # are reported beside it and `events_flowing` needs both.
    for target, labels, points in idx.get("dynamo_component_kv_cache_events_applied"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        applied = h.setdefault("events_applied", {})
        applied[f"{label(labels, 'event_type')}/{label(labels, 'status')}"] = latest(points)
    for target, labels, points in idx.get("dynamo_component_kv_cache_event_warnings"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h.setdefault("warnings", {})[label(labels, "warning_kind")] = latest(points)
    for target, _, points in idx.get("dynamo_component_router_kv_zmq_ingress_batches_total"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h["zmq_ingress_batches"] = h.get("zmq_ingress_batches", 0.0) + latest(points)
    for target, labels, points in idx.get("dynamo_component_router_kv_zmq_ingress_sources"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h.setdefault("zmq_ingress_sources", {})[label(labels, "state")] = latest(points)
    for h in out.kv_event_health.values():
        if h.get("source") == "dynamo":
            applied_ok = sum(v for k, v in h.get("events_applied", {}).items()
                             if k.endswith("/ok"))
            h["events_flowing"] = bool(applied_ok and h.get("zmq_ingress_batches", 0) > 0)


def dynamo_worker_ids(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    for target, labels, _ in idx.get("dynamo_component_uptime_seconds"):
        if "dynamo_frontend" in out.flavors.get(target, []):
            continue  # a frontend's own id is no worker
        hex_id = label(labels, "worker_id")
        try:
            out.dynamo_worker_ids[target] = str(int(hex_id, 16))
        except ValueError:
            continue
