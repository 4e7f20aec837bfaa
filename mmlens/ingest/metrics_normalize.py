"""Metric flavors and the normalized series the dashboard shows, from raw samples.

One place per metric name's meaning. Input is a window of samples per series (from direct
scrapes or PromQL range queries, both give MetricSample records); counters are turned into
increases with Prometheus reset semantics, never read as instantaneous ratios. The SMG and
Dynamo series are read by `metrics_smg` and `metrics_dynamo`; the engines' hit rates and the
workers' health and load here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

from mmlens.ingest.metric_series import (
    Series,
    SeriesIndex,
    increase,
    label,
    latest,
    to_series,
)
from mmlens.ingest.metrics_dynamo import dynamo_worker_ids, normalize_dynamo
from mmlens.ingest.metrics_records import HitRate, NormalizedMetrics
from mmlens.ingest.metrics_smg import normalize_smg
from mmlens.records import MetricSample

__all__ = ["READ_NAMES", "READ_PREFIXES", "HitRate", "NormalizedMetrics", "Series",
           "detect_flavors", "increase", "latest", "normalize", "normalize_samples", "reads",
           "to_series"]

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


def normalize(series: Series, names_by_target: Mapping[str, Set[str]] | None = None,
              ) -> NormalizedMetrics:
    """``names_by_target``: every metric name each target exposed in the window, when
    ``series`` holds only the names the normalizers read (``reads``)."""
    idx = SeriesIndex(series)
    if names_by_target is not None:
        idx.names_by_target = {t: set(n) for t, n in names_by_target.items()}
    return _normalize(idx)


def _normalize(idx: SeriesIndex) -> NormalizedMetrics:
    out = NormalizedMetrics()
    out.flavors = {t: detect_flavors(names) for t, names in sorted(idx.names_by_target.items())}
    _hit_rates(idx, out)
    normalize_smg(idx, out)
    normalize_dynamo(idx, out)
    _health(idx, out)
    dynamo_worker_ids(idx, out)
    return out


def normalize_samples(samples: Iterable[MetricSample]) -> NormalizedMetrics:
    return normalize(to_series(samples))


# --- hit rates --------------------------------------------------------------------------------


def _hit_rates(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    # vLLM: tokens hit / tokens queried. `worker_addr` appears when SMG's /engine_metrics
    # fans the scrape out; `engine` is the engine index (DP rank per API server).
    keys = ("worker_addr", "model_name", "engine")
    seen: set[tuple[str, ...]] = set()
    for hits_name, q_name in (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                              ("vllm:gpu_prefix_cache_hits_total",
                               "vllm:gpu_prefix_cache_queries_total")):
        hits, queries = idx.grouped(hits_name, keys), idx.grouped(q_name, keys)
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
    cached = idx.grouped("sglang:cached_tokens_total", keys)
    prompt = idx.grouped("sglang:prompt_tokens_total", keys)
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
    cached = idx.grouped("dynamo_frontend_cached_tokens_sum", ("model",))
    isl = idx.grouped("dynamo_frontend_input_sequence_tokens_sum", ("model",))
    images = idx.grouped("dynamo_frontend_images_per_request_sum", ("model",))
    for key in sorted(isl):
        target, model = key
        hr = HitRate.build(target, "(frontend)", model, "dynamo_frontend",
                           cached.get(key, []), isl[key])
        if any(latest(p) > 0 for p in images.get(key, [])) or (hr.hit_rate or 0) > 1:
            hr.warning = ("image requests: input_sequence_tokens excludes image tokens that "
                          "cached_tokens includes; use the workers' token counters")
            hr.hit_rate = None
        out.hit_rates.append(hr)


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


def _health(idx: SeriesIndex, out: NormalizedMetrics) -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, (fld, worker_label) in _HEALTH_GAUGES.items():
        for target, labels, points in idx.get(name):
            worker = (label(labels, worker_label) if worker_label else "") or target
            dp = label(labels, "dp_rank") or label(labels, "engine")
            if dp not in ("", "0"):
                worker = f"{worker}#{dp}"
            row = rows.setdefault((target, worker), {"target": target, "worker": worker})
            value = latest(points)
            row[fld] = bool(value == 1) if fld == "healthy" else value
    out.worker_health = [rows[k] for k in sorted(rows)]


# --- what the normalizers read -----------------------------------------------------------------
class _Asked(SeriesIndex):
    """An empty index noting every name the normalizers ask it for."""

    def __init__(self) -> None:
        super().__init__({})
        self.asked: set[str] = set()

    def get(self, name: str) -> list[tuple[str, Any, Any]]:
        self.asked.add(name)
        return super().get(name)


def _names_asked() -> frozenset[str]:
    idx = _Asked()
    _normalize(idx)
    return frozenset(idx.asked)


# The names the normalizers read: every one they ask for by name (noted by running them on an
# empty window, so a new one is never missed) and Dynamo's per-stage router overhead series,
# found by prefix. Everything else in a window (most of a vLLM worker's 60+ series) only
# tells a target's flavor, which needs names, not samples.
READ_NAMES = _names_asked()
READ_PREFIXES = ("dynamo_router_overhead_",)


def reads(name: str) -> bool:
    return name in READ_NAMES or name.startswith(READ_PREFIXES)
