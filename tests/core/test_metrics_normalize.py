"""Normalized series from the recorded SMG 1.13.0 and Dynamo 1.6.1 metrics, and counter rates."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mmlens.ingest.exposition import parse_exposition
from mmlens.ingest.metrics_normalize import (
    detect_flavors,
    increase,
    normalize,
    normalize_samples,
    reads,
    to_series,
)
from mmlens.records import MetricSample
from tests.fixtures_path import capture


def _norm(*names: str):
    samples = []
    for name in names:
        samples += parse_exposition(capture(name), name, 100.0)
    return normalize_samples(samples)


def test_flavors_of_real_targets() -> None:
    n = _norm("smg_http_metrics.txt", "smg_grpc_metrics_kv.txt", "dyn_frontend_metrics_text.txt",
              "dyn_mocker_metrics.txt", "smg_http_engine_metrics.txt")
    assert n.flavors == {
        "dyn_frontend_metrics_text.txt": ["dynamo_frontend"],
        "dyn_mocker_metrics.txt": ["dynamo_worker", "vllm"],
        "smg_grpc_metrics_kv.txt": ["smg"],
        "smg_http_engine_metrics.txt": ["vllm"],
        "smg_http_metrics.txt": ["smg"],
    }


@pytest.mark.parametrize(("names", "flavors"), [
    (["sglang:num_running_reqs"], ["sglang"]),
    (["up", "process_cpu_seconds_total"], ["unknown"]),
    (["dynamo_component_requests_total"], ["dynamo_worker"]),
])
def test_flavor_detection_by_names(names, flavors) -> None:
    assert detect_flavors(names) == flavors


def test_smg_http_capture() -> None:
    n = _norm("smg_http_metrics.txt")
    t = "smg_http_metrics.txt"
    assert n.cache_aware_branches[t] == {"tree_match": 5.0, "expected_wait_fallback": 2.0}
    hist = n.match_ratio[t]
    assert (hist["sum"], hist["count"]) == (5.0, 7.0)
    assert hist["buckets"]["0"] == 2.0 and hist["buckets"]["1"] == 7.0
    assert hist["mean"] == pytest.approx(5 / 7)
    assert [(r["worker"], r["count"]) for r in n.worker_requests] == [
        ("http://127.0.0.1:18001", 3.0), ("http://127.0.0.1:18002", 4.0)]
    assert n.mm_processing == []  # HTTP mode has no smg_mm_* series
    health = {r["worker"]: r for r in n.worker_health}
    assert health["http://127.0.0.1:18001"]["healthy"] is True
    assert health["http://127.0.0.1:18001"]["engine_reported_hit_rate_gauge"] == 0.5


def test_smg_grpc_capture() -> None:
    n = _norm("smg_grpc_metrics_kv.txt")
    t = "smg_grpc_metrics_kv.txt"
    assert n.mm_processing == [{"target": t, "model": "Qwen/Qwen3-VL-2B-Instruct",
                                "mode": "router", "reason": "auto_mixed", "count": 5.0,
                                "increase": 0.0}]
    assert n.cache_aware_branches[t] == {"event_hit": 5.0, "event_miss": 1.0}
    assert t not in n.match_ratio  # event-driven decisions never enter the histogram
    assert [(r["worker"], r["count"]) for r in n.worker_requests] == [
        ("grpc://127.0.0.1:50051", 7.0), ("grpc://127.0.0.1:50052", 0.0)]
    w1 = n.kv_event_health[t]["workers"]["grpc://127.0.0.1:50051"]
    assert w1["batches"] == {"applied": 3.0}
    assert w1["blocks"] == {"stored": 11.0}
    assert w1["index_blocks"] == 6.0 and w1["subscriptions"] == 1.0
    # Real 1.13.0 labels the gap counter by outcome and resyncs by reason.
    assert set(w1["gaps"]) == {"replay_requested", "unrecovered_cleared", "unrecovered_kept"}
    assert "publisher_restart" in w1["resyncs"]
    assert w1["mean_lag_s"] == pytest.approx(0.0012903213500976563 / 3)


def test_dynamo_frontend_capture() -> None:
    n = _norm("dyn_frontend_metrics_text.txt")
    t = "dyn_frontend_metrics_text.txt"
    d = n.dynamo[t]
    assert d["predicted_requests"] == 13.0
    assert d["predicted_hit_rate_mean"] == pytest.approx(6.666666666666666 / 13)
    assert d["cached_tokens_sum"] == {"Qwen/Qwen3-0.6B": 640.0}
    assert d["input_tokens_sum"] == {"Qwen/Qwen3-0.6B": 1047.0}
    assert d["block_size"] == {"Qwen/Qwen3-0.6B": 16.0}
    # Backend workers are `router_worker_id`, not the frontend's own hex `worker_id`.
    assert sorted(w["worker_id"] for w in d["registered_workers"]) == [
        "12300356780531823171", "14776692058023615686"]
    (hr,) = n.hit_rates
    assert (hr.source, hr.model, hr.worker) == ("dynamo_frontend", "Qwen/Qwen3-0.6B", "(frontend)")
    assert hr.hit_rate == pytest.approx(640 / 1047)
    kv = n.kv_event_health[t]
    assert kv["events_applied"]["stored/ok"] == 6.0
    assert kv["warnings"] == {"duplicate_store": 0.0}
    assert kv["zmq_ingress_batches"] == 6.0 and kv["zmq_ingress_sources"] == {"active": 2.0}
    assert kv["events_flowing"] is True
    health = {r["worker"]: r for r in n.worker_health}
    assert health["12300356780531823171"]["active_decode_blocks"] == 0.0


def test_events_applied_alone_does_not_prove_flow() -> None:
    # Approximate mode: applied rises with duplicate_store warnings, no ZMQ ingress.
    lbl = (("event_type", "stored"), ("status", "ok"), ("worker_id", "66628623aef3424b"))
    n = normalize_samples([MetricSample("fe", "dynamo_component_kv_cache_events_applied", lbl,
                                        14.0, 1.0)])
    assert n.kv_event_health["fe"]["events_flowing"] is False


@pytest.mark.parametrize(("values", "expected"), [
    ([10, 14, 3, 6], 10.0),     # reset between 14 and 3: the 3 counts whole
    ([5, 5, 5], 0.0),
    ([0, 100], 100.0),
    ([7], 0.0),
    ([1, float("nan"), 4], 3.0),
])
def test_counter_increase_with_resets(values, expected) -> None:
    assert increase([(float(i), float(v)) for i, v in enumerate(values)]) == expected


def _vllm(ts: float, hits: float, queries: float, target: str = "w1") -> list[MetricSample]:
    lb = (("engine", "0"), ("model_name", "m"))
    return [MetricSample(target, "vllm:prefix_cache_hits_total", lb, hits, ts),
            MetricSample(target, "vllm:prefix_cache_queries_total", lb, queries, ts)]


def test_vllm_token_weighted_hit_rate_over_window_with_restart() -> None:
    # 0→40 hits of 0→100 queries, then the worker restarts (counters back to 10/20).
    samples = _vllm(0, 0, 0) + _vllm(5, 40, 100) + _vllm(10, 10, 20)
    (hr,) = normalize_samples(samples).hit_rates
    assert (hr.hits_increase, hr.queries_increase) == (50.0, 120.0)
    assert hr.rate == pytest.approx(50 / 120) and hr.hit_rate == hr.rate
    assert hr.window_s == 10.0
    assert hr.cumulative_rate == pytest.approx(0.5)


def test_single_scrape_falls_back_to_cumulative_ratio() -> None:
    (hr,) = normalize_samples(_vllm(0, 30, 120)).hit_rates
    assert hr.rate is None and hr.hit_rate == pytest.approx(0.25)


def test_deprecated_gpu_alias_not_double_counted() -> None:
    lb = (("engine", "0"), ("model_name", "m"))
    samples = [
        *_vllm(0, 1, 4),
        MetricSample("w1", "vllm:gpu_prefix_cache_hits_total", lb, 1, 0),
        MetricSample("w1", "vllm:gpu_prefix_cache_queries_total", lb, 4, 0),
        MetricSample("old", "vllm:gpu_prefix_cache_hits_total", lb, 3, 0),
        MetricSample("old", "vllm:gpu_prefix_cache_queries_total", lb, 4, 0),
    ]
    rates = {h.worker: h.hit_rate for h in normalize_samples(samples).hit_rates}
    assert rates == {"w1": 0.25, "old": 0.75}


def test_sglang_uses_token_counters_not_the_batch_gauge() -> None:
    lb = (("model_name", "m"),)
    samples = [
        MetricSample("sg", "sglang:cache_hit_rate", lb, 0.99, 0),  # per-batch gauge: ignored
        MetricSample("sg", "sglang:cached_tokens_total", (*lb, ("cache_source", "device")), 30, 0),
        MetricSample("sg", "sglang:cached_tokens_total", (*lb, ("cache_source", "host")), 10, 0),
        MetricSample("sg", "sglang:prompt_tokens_total", lb, 200, 0),
    ]
    (hr,) = normalize_samples(samples).hit_rates
    assert (hr.source, hr.hit_rate) == ("sglang", 0.2)


def test_engine_metrics_fanout_names_workers_by_addr() -> None:
    text = capture("smg_http_engine_metrics.txt") + (
        '# TYPE vllm:prefix_cache_queries_total counter\n'
        'vllm:prefix_cache_queries_total{model_name="Qwen/Qwen3-VL-2B-Instruct",'
        'worker_addr="http://127.0.0.1:18002"} 80\n'
    )
    n = normalize_samples(parse_exposition(text, "smg-engine", 0))
    (hr,) = n.hit_rates
    assert (hr.worker, hr.hit_rate) == ("http://127.0.0.1:18002", 0.5)


def test_dynamo_frontend_ratio_is_not_a_hit_rate_for_image_requests() -> None:
    # Observed with the real Dynamo 1.6.1 frontend in the demo: 8 one-image requests, ISL 18
    # each (unexpanded), engine-reported cached tokens 80 on 5 of them.
    model = (("model", "Qwen/Qwen3-VL-2B-Instruct"),)
    samples = [MetricSample("fe", "dynamo_frontend_cached_tokens_sum", model, 400.0, 1.0),
               MetricSample("fe", "dynamo_frontend_input_sequence_tokens_sum", model, 144.0, 1.0),
               MetricSample("fe", "dynamo_frontend_images_per_request_sum", model, 8.0, 1.0)]
    (hr,) = normalize_samples(samples).hit_rates
    assert hr.cumulative_rate == pytest.approx(400 / 144)
    assert hr.hit_rate is None and "image" in hr.warning


def test_dynamo_worker_metrics_name_the_worker_in_hex() -> None:
    # The mocker's `worker_id="c347cdbc09683622"` is the decimal id the frontend returned as
    # nvext.worker_id in the streaming capture of the same run.
    n = _norm("dyn_mocker_metrics.txt", "dyn_frontend_metrics_text.txt")
    assert n.dynamo_worker_ids == {"dyn_mocker_metrics.txt": "14071441768237774370"}
    assert '"decode_worker_id":14071441768237774370' in capture("dyn_stream_sample.txt")
    health = {r["target"]: r for r in n.worker_health}
    assert (health["dyn_mocker_metrics.txt"]["token_usage"],
            health["dyn_mocker_metrics.txt"]["running"]) == (0.0, 0.0)


def test_only_the_series_the_normalizers_read_give_the_same_result() -> None:
    """The store reads only ``reads`` names (and each target's names, for its flavor)."""
    samples = []
    for name in ("smg_http_metrics.txt", "smg_grpc_metrics_kv.txt", "smg_http_engine_metrics.txt",
                 "dyn_frontend_metrics_text.txt", "dyn_mocker_metrics.txt"):
        samples += parse_exposition(capture(name), name, 100.0)
        samples += [replace(s, ts=105.0, value=s.value + 1) for s in
                    parse_exposition(capture(name), name, 100.0)]
    samples.append(MetricSample("w9", "vllm:num_preemptions_total", (), 1.0, 100.0))
    series = to_series(samples)
    names: dict[str, set[str]] = {}
    for target, name, _ in series:
        names.setdefault(target, set()).add(name)
    read = {k: v for k, v in series.items() if reads(k[1])}
    assert len(read) < len(series) / 2  # most series are not read
    assert normalize(read, names) == normalize(series)
    assert "w9" not in normalize(read).flavors  # the flavors need every name
