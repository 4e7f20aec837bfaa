"""Metric flavors and the normalized series the dashboard shows, from raw samples.

One place per metric name's meaning. Input is a window of samples per series (from direct
scrapes or PromQL range queries, both give MetricSample records); counters are turned into
increases with Prometheus reset semantics, never read as instantaneous ratios.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from mmlens.records import Labels, MetricSample

SeriesKey = tuple[str, str, Labels]  # target, sample name, labels
Series = dict[SeriesKey, list[tuple[float, float]]]

FLAVOR_ORDER = ("smg", "dynamo_frontend", "dynamo_worker", "sglang", "vllm")


def detect_flavors(names: Iterable[str]) -> list[str]:
    """Flavors present in one target's metric names, most specific first.

    A target can show several: SMG's ``/engine_metrics`` and Dynamo's mocker re-export
    ``vllm:*`` series; the Dynamo frontend also carries ``dynamo_component_router_*``.
    """
    found: set[str] = set()
    for name in names:
        if name.startswith("smg_"):
            found.add("smg")
        elif name.startswith("dynamo_frontend_"):
            found.add("dynamo_frontend")
        elif name.startswith("dynamo_component_"):
            found.add("dynamo_component")
        elif name.startswith("vllm:"):
            found.add("vllm")
        elif name.startswith(("sglang:", "sglang_")):
            found.add("sglang")
    if "dynamo_component" in found:
        found.discard("dynamo_component")
        if "dynamo_frontend" not in found:
            found.add("dynamo_worker")
    return [f for f in FLAVOR_ORDER if f in found] or ["unknown"]


def to_series(samples: Iterable[MetricSample]) -> Series:
    series: Series = defaultdict(list)
    for s in samples:
        series[(s.target, s.name, s.labels)].append((s.ts, s.value))
    for points in series.values():
        points.sort()
    return dict(series)


def increase(points: list[tuple[float, float]]) -> float:
    """Counter increase over the points; a drop is a reset and the new value counts whole.

    ``[(0, 10), (5, 14), (10, 3), (15, 6)]`` → 4 + 3 + 3 = 10.
    """
    total = 0.0
    prev: float | None = None
    for _, v in points:
        if v != v:  # NaN
            continue
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
    return total


def latest(points: list[tuple[float, float]]) -> float:
    return points[-1][1] if points else 0.0


def _span(points: list[tuple[float, float]]) -> float:
    return points[-1][0] - points[0][0] if len(points) > 1 else 0.0


def _label(labels: Labels, key: str, default: str = "") -> str:
    for k, v in labels:
        if k == key:
            return v
    return default


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


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
              hits: list[list[tuple[float, float]]], queries: list[list[tuple[float, float]]],
              ) -> HitRate:
        h_inc = sum(increase(p) for p in hits)
        q_inc = sum(increase(p) for p in queries)
        window = max((_span(p) for p in queries), default=0.0)
        rate = _ratio(h_inc, q_inc)
        cum = _ratio(sum(latest(p) for p in hits), sum(latest(p) for p in queries))
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


class _Index:
    """Series grouped by sample name for the normalizers below."""

    def __init__(self, series: Series) -> None:
        self.by_name: dict[str, list[tuple[str, Labels, list[tuple[float, float]]]]] = (
            defaultdict(list))
        self.names_by_target: dict[str, set[str]] = defaultdict(set)
        for (target, name, labels), points in series.items():
            self.by_name[name].append((target, labels, points))
            self.names_by_target[target].add(name)

    def get(self, name: str) -> list[tuple[str, Labels, list[tuple[float, float]]]]:
        return self.by_name.get(name, [])


def normalize(series: Series) -> NormalizedMetrics:
    idx = _Index(series)
    out = NormalizedMetrics()
    out.flavors = {t: detect_flavors(names) for t, names in sorted(idx.names_by_target.items())}
    _hit_rates(idx, out)
    _smg(idx, out)
    _dynamo(idx, out)
    _health(idx, out)
    _dynamo_worker_ids(idx, out)
    return out


def _dynamo_worker_ids(idx: _Index, out: NormalizedMetrics) -> None:
    for target, labels, _ in idx.get("dynamo_component_uptime_seconds"):
        if "dynamo_frontend" in out.flavors.get(target, []):
            continue  # a frontend's own id is no worker
        hex_id = _label(labels, "worker_id")
        try:
            out.dynamo_worker_ids[target] = str(int(hex_id, 16))
        except ValueError:
            continue


def normalize_samples(samples: Iterable[MetricSample]) -> NormalizedMetrics:
    return normalize(to_series(samples))


# --- hit rates --------------------------------------------------------------------------------


def _grouped(idx: _Index, name: str, key_labels: tuple[str, ...],
             ) -> dict[tuple[str, ...], list[list[tuple[float, float]]]]:
    groups: dict[tuple[str, ...], list[list[tuple[float, float]]]] = defaultdict(list)
    for target, labels, points in idx.get(name):
        groups[(target, *(_label(labels, k) for k in key_labels))].append(points)
    return groups


def _hit_rates(idx: _Index, out: NormalizedMetrics) -> None:
    # vLLM: tokens hit / tokens queried. `worker_addr` appears when SMG's /engine_metrics
    # fans the scrape out; `engine` is the engine index (DP rank per API server).
    keys = ("worker_addr", "model_name", "engine")
    seen: set[tuple[str, ...]] = set()
    for hits_name, q_name in (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                              ("vllm:gpu_prefix_cache_hits_total",
                               "vllm:gpu_prefix_cache_queries_total")):
        hits, queries = _grouped(idx, hits_name, keys), _grouped(idx, q_name, keys)
        for key in sorted(queries):
            if key in seen:
                continue  # the deprecated gpu_ alias of a series already counted
            seen.add(key)
            target, addr, model, engine = key
            worker = addr or target
            if engine not in ("", "0"):
                worker = f"{worker}#{engine}"
            out.hit_rates.append(HitRate.build(target, worker, model, "vllm",
                                               hits.get(key, []), queries[key]))
    # SGLang: cached prompt tokens / prompt tokens (cache_source label summed); never the
    # per-batch `sglang:cache_hit_rate` gauge.
    keys = ("model_name", "dp_rank")
    cached = _grouped(idx, "sglang:cached_tokens_total", keys)
    prompt = _grouped(idx, "sglang:prompt_tokens_total", keys)
    for key in sorted(prompt):
        target, model, dp = key
        worker = target if dp in ("", "0") else f"{target}#{dp}"
        out.hit_rates.append(HitRate.build(target, worker, model, "sglang",
                                           cached.get(key, []), prompt[key]))
    # Dynamo frontend: per model, token-weighted from the two histogram sums.
    # Observed with Dynamo 1.6.1: `input_sequence_tokens` is the prompt before image
    # expansion (18 for a one-image Qwen3-VL chat) while `cached_tokens` comes from the engine
    # and counts expanded tokens (80), so the ratio exceeds 1 once images are cached. It is a
    # hit rate only for text traffic.
    cached = _grouped(idx, "dynamo_frontend_cached_tokens_sum", ("model",))
    isl = _grouped(idx, "dynamo_frontend_input_sequence_tokens_sum", ("model",))
    images = _grouped(idx, "dynamo_frontend_images_per_request_sum", ("model",))
    for key in sorted(isl):
        target, model = key
        hr = HitRate.build(target, "(frontend)", model, "dynamo_frontend",
                           cached.get(key, []), isl[key])
        if any(latest(p) > 0 for p in images.get(key, [])) or (hr.hit_rate or 0) > 1:
            hr.warning = ("image requests: input_sequence_tokens excludes image tokens that "
                          "cached_tokens includes; use the workers' token counters")
            hr.hit_rate = None
        out.hit_rates.append(hr)


# --- SMG ----------------------------------------------------------------------------------


def _counter_rows(idx: _Index, name: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for target, labels, points in sorted(idx.get(name), key=lambda r: (r[0], r[1])):
        row: dict[str, Any] = {"target": target}
        row.update({k: _label(labels, k) for k in keys})
        row["count"] = latest(points)
        row["increase"] = increase(points)
        rows.append(row)
    return rows


def _smg(idx: _Index, out: NormalizedMetrics) -> None:
    out.mm_processing = _counter_rows(idx, "smg_mm_processing_total", ("model", "mode", "reason"))
    out.worker_requests = _counter_rows(idx, "smg_worker_requests_total", ("worker", "model"))
    for target, labels, points in idx.get("smg_cache_aware_policy_branch_total"):
        out.cache_aware_branches.setdefault(target, {})[_label(labels, "branch")] = latest(points)
    for target, labels, points in idx.get("smg_cache_aware_match_ratio_bucket"):
        hist = out.match_ratio.setdefault(target, {"buckets": {}, "sum": 0.0, "count": 0.0})
        hist["buckets"][_label(labels, "le")] = latest(points)
    for suffix in ("sum", "count"):
        for target, _, points in idx.get(f"smg_cache_aware_match_ratio_{suffix}"):
            out.match_ratio.setdefault(target, {"buckets": {}, "sum": 0.0, "count": 0.0})[
                suffix] = latest(points)
    for hist in out.match_ratio.values():
        hist["mean"] = _ratio(hist["sum"], hist["count"])

    # KV-event health as SMG sees its gRPC workers' streams.
    for target, labels, points in idx.get("smg_kv_event_batches_total"):
        w = _kv_health(out, target, _label(labels, "worker"))
        w.setdefault("batches", {})[_label(labels, "disposition")] = latest(points)
    for target, labels, points in idx.get("smg_kv_event_blocks_total"):
        w = _kv_health(out, target, _label(labels, "worker"))
        w.setdefault("blocks", {})[_label(labels, "op")] = latest(points)
    for name, key, sub in (("smg_kv_event_gaps_total", "gaps", "outcome"),
                           ("smg_kv_event_resyncs_total", "resyncs", "reason"),
                           ("smg_kv_event_subscription_failures_total", "subscription_failures",
                            "reason")):
        for target, labels, points in idx.get(name):
            w = _kv_health(out, target, _label(labels, "worker"))
            w.setdefault(key, {})[_label(labels, sub)] = latest(points)
    for name, key in (("smg_kv_event_subscriptions_total", "subscriptions"),
                      ("smg_kv_event_missed_batches_total", "missed_batches"),
                      ("smg_kv_event_parentless_blocks_total", "parentless_blocks"),
                      ("smg_kv_events_unavailable", "unavailable"),
                      ("smg_kv_event_degraded_ranks", "degraded_ranks"),
                      ("smg_kv_index_blocks", "index_blocks")):
        for target, labels, points in idx.get(name):
            _kv_health(out, target, _label(labels, "worker"))[key] = latest(points)
    lag_sum = {(t, _label(lb, "worker")): latest(p)
               for t, lb, p in idx.get("smg_kv_event_lag_seconds_sum")}
    for target, labels, points in idx.get("smg_kv_event_lag_seconds_count"):
        worker = _label(labels, "worker")
        _kv_health(out, target, worker)["mean_lag_s"] = _ratio(
            lag_sum.get((target, worker), 0.0), latest(points))


def _kv_health(out: NormalizedMetrics, target: str, worker: str) -> dict[str, Any]:
    return out.kv_event_health.setdefault(target, {"source": "smg", "workers": {}})[
        "workers"].setdefault(worker, {})


# --- Dynamo -------------------------------------------------------------------------------


def _dynamo(idx: _Index, out: NormalizedMetrics) -> None:
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
        e["predicted_hit_rate_mean"] = _ratio(e.pop("_pred_sum", 0.0), e["predicted_requests"])
    for name, key in (("dynamo_frontend_cached_tokens_sum", "cached_tokens_sum"),
                      ("dynamo_frontend_input_sequence_tokens_sum", "input_tokens_sum"),
                      ("dynamo_frontend_model_kv_cache_block_size", "block_size")):
        for target, labels, points in idx.get(name):
            entry(target)[key][_label(labels, "model")] = latest(points)
    for target, labels, points in idx.get("dynamo_component_router_worker_registered"):
        # `worker_id` on component metrics is the frontend's own id (hex); the backend worker
        # is `router_worker_id` (decimal).
        entry(target)["registered_workers"].append({
            "worker_id": _label(labels, "router_worker_id"), "dp_rank": _label(labels, "dp_rank"),
            "worker_type": _label(labels, "worker_type"), "registered": latest(points) == 1})

    _dynamo_mm_and_overhead(idx, entry)

    # Event-plane health. `kv_cache_events_applied` also rises in approximate mode, so the
    # ZMQ ingress counters are reported beside it and `events_flowing` needs both.
    for target, labels, points in idx.get("dynamo_component_kv_cache_events_applied"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        applied = h.setdefault("events_applied", {})
        applied[f"{_label(labels, 'event_type')}/{_label(labels, 'status')}"] = latest(points)
    for target, labels, points in idx.get("dynamo_component_kv_cache_event_warnings"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h.setdefault("warnings", {})[_label(labels, "warning_kind")] = latest(points)
    for target, _, points in idx.get("dynamo_component_router_kv_zmq_ingress_batches_total"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h["zmq_ingress_batches"] = h.get("zmq_ingress_batches", 0.0) + latest(points)
    for target, labels, points in idx.get("dynamo_component_router_kv_zmq_ingress_sources"):
        h = out.kv_event_health.setdefault(target, {"source": "dynamo"})
        h.setdefault("zmq_ingress_sources", {})[_label(labels, "state")] = latest(points)
    for h in out.kv_event_health.values():
        if h.get("source") == "dynamo":
            applied_ok = sum(v for k, v in h.get("events_applied", {}).items()
                             if k.endswith("/ok"))
            h["events_flowing"] = bool(applied_ok and h.get("zmq_ingress_batches", 0) > 0)


def _dynamo_mm_and_overhead(idx: _Index, entry: Callable[[str], dict[str, Any]]) -> None:
    """Per model: image-bearing requests (``images_per_request`` count minus its ``le="0"``
    bucket) and those Dynamo counted image tokens for (``image_tokens_per_request`` count,
    recorded only when every image's dims resolved); the difference is requests that fell
    back to text-prefix routing for want of image dims. Per stage: mean router overhead."""
    zero: dict[tuple[str, str], float] = {}
    for target, labels, points in idx.get("dynamo_frontend_images_per_request_bucket"):
        if _label(labels, "le") in ("0", "0.0"):
            zero[(target, _label(labels, "model"))] = latest(points)
    for target, labels, points in idx.get("dynamo_frontend_images_per_request_count"):
        model = _label(labels, "model")
        mm = entry(target).setdefault("image_requests", {}).setdefault(model, {})
        mm["with_images"] = latest(points) - zero.get((target, model), 0.0)
    for target, labels, points in idx.get("dynamo_frontend_image_tokens_per_request_count"):
        model = _label(labels, "model")
        mm = entry(target).setdefault("image_requests", {}).setdefault(model, {})
        mm["counted"] = latest(points)
    for e in [entry(t) for t in {t for t, _, _ in
                                 idx.get("dynamo_frontend_images_per_request_count")}]:
        for mm in e.get("image_requests", {}).values():
            if "with_images" in mm and "counted" in mm:
                mm["uncounted"] = max(0.0, mm["with_images"] - mm["counted"])
    prefix, suffix = "dynamo_router_overhead_", "_ms_sum"
    for name in [n for n in idx.by_name if n.startswith(prefix) and n.endswith(suffix)]:
        stage = name[len(prefix):-len(suffix)]
        counts = {t: latest(p) for t, _, p in idx.get(f"{prefix}{stage}_ms_count")}
        totals: dict[str, float] = {}
        for target, _, points in idx.get(name):
            totals[target] = totals.get(target, 0.0) + latest(points)
        for target, total in totals.items():
            entry(target).setdefault("router_overhead_ms_mean", {})[stage] = _ratio(
                total, counts.get(target, 0.0))


# --- worker health and load ---------------------------------------------------------------------

_HEALTH_GAUGES: dict[str, tuple[str, str]] = {
    # name: (field, worker label)
    "smg_worker_health": ("healthy", "worker"),
    "smg_worker_cb_state": ("circuit_breaker", "worker"),
    "smg_worker_requests_active": ("router_inflight", "worker"),
    "smg_engine_token_usage": ("token_usage", "worker"),
    "smg_engine_running_requests": ("running", "worker"),
    "smg_engine_waiting_requests": ("waiting", "worker"),
    "smg_engine_cache_hit_rate": ("engine_reported_hit_rate_gauge", "worker"),
    "smg_kv_index_blocks": ("router_index_blocks", "worker"),
    "vllm:kv_cache_usage_perc": ("token_usage", "worker_addr"),
    "vllm:num_requests_running": ("running", "worker_addr"),
    "vllm:num_requests_waiting": ("waiting", "worker_addr"),
    "sglang:token_usage": ("token_usage", ""),
    "sglang:num_running_reqs": ("running", ""),
    "sglang:num_queue_reqs": ("waiting", ""),
    "dynamo_frontend_worker_active_decode_blocks": ("active_decode_blocks", "worker_id"),
    "dynamo_frontend_worker_active_prefill_tokens": ("active_prefill_tokens", "worker_id"),
}


def _health(idx: _Index, out: NormalizedMetrics) -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, (fld, worker_label) in _HEALTH_GAUGES.items():
        for target, labels, points in idx.get(name):
            worker = (_label(labels, worker_label) if worker_label else "") or target
            dp = _label(labels, "dp_rank") or _label(labels, "engine")
            if dp not in ("", "0"):
                worker = f"{worker}#{dp}"
            row = rows.setdefault((target, worker), {"target": target, "worker": worker})
            value = latest(points)
            row[fld] = bool(value == 1) if fld == "healthy" else value
    out.worker_health = [rows[k] for k in sorted(rows)]
