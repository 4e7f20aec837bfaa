"""The current normalized state of a store, as one JSON-ready dict (``mmlens snapshot``)."""

from __future__ import annotations

import time
from typing import Any

from mmlens.ingest.metrics_normalize import normalize_samples
from mmlens.store.decisions import attach, trace_keys
from mmlens.store.sqlite import Store


def build_snapshot(store: Store, window_s: float = 300.0, n_traces: int = 20,
                   now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    latest = store.latest_sample_ts()
    since = (latest if latest is not None else now) - window_s
    norm = normalize_samples(store.samples_since(since)).to_json()
    health = store.health()
    kv_endpoints = {h["target"]: {
        "last_success": h["last_success"],
        "batches": h["counters"].get("batches", 0),
        "events": h["counters"].get("events", 0),
        "gaps": h["counters"].get("gaps", 0),
        "missed_batches": h["counters"].get("missed_batches", 0),
        "replays": h["counters"].get("replays", 0),
        "replayed_batches": h["counters"].get("replayed_batches", 0),
        "initial_sync_batches": h["counters"].get("initial_sync_batches", 0),
        "restarts": h["counters"].get("restarts", 0),
        "stale_batches": h["counters"].get("stale_batches", 0),
        "mean_lag_s": h["counters"].get("mean_lag_s"),
        "last_seq": h["counters"].get("last_seq"),
        "errors": h["errors"],
    } for h in health if h["collector"] == "kv_events"}
    resident = store.kv_state()
    return {
        "schema_version": store.schema_version(),
        "generated_at": now,
        "window_s": window_s,
        "latest_sample_ts": latest,
        "targets": store.meta("targets"),
        "router_state": store.meta("router_state"),
        "health": health,
        "flavors": norm["flavors"],
        "hit_rates": norm["hit_rates"],
        "mm_processing": norm["mm_processing"],
        "cache_aware_branches": norm["cache_aware_branches"],
        "match_ratio": norm["match_ratio"],
        "worker_requests": norm["worker_requests"],
        "dynamo": norm["dynamo"],
        "dynamo_mm_routing": store.meta("dynamo_mm_routing") or {},
        "worker_health": norm["worker_health"],
        "dynamo_worker_ids": norm["dynamo_worker_ids"],
        "router_kv_event_health": norm["kv_event_health"],
        "kv_event_health": {"endpoints": kv_endpoints, "stored": store.kv_event_counts()},
        "resident_blocks": {f"{r['worker']}#{r['rank']}": {
            "worker": r["worker"], "rank": r["rank"], "blocks": r["resident_blocks"],
            "images": r["images"], "updated": r["updated"]} for r in resident},
        "traces": _traces_with_decisions(store, n_traces),
    }


def _traces_with_decisions(store: Store, n: int) -> list[dict[str, Any]]:
    traces = store.traces(n)
    attach(traces, store.decisions(sorted({k for t in traces for k in trace_keys(t)})))
    return traces
