"""A store filled with constructed records, through the store's own write API: two workers,
metric counters over two minutes, KV events with parent chains and image keys, and traces
that cover a hit, a content-blind false hit, a count drift and a strict-mode error."""

from __future__ import annotations

from dataclasses import dataclass

from mmlens.collectors.trace_sink import SentRequest, TraceSink
from mmlens.collectors.traces import ImagePart, solid_png
from mmlens.collectors.verdict_job import VerdictJob

from mmlens.analysis.availability.aggregate import cell_sums
from mmlens.analysis.availability.tracker import history_summary
from mmlens.records import (
    BlockStored,
    CollectorHealth,
    ImageRef,
    MetricSample,
    RequestTrace,
    RoutingCandidate,
    RoutingDecision,
    RoutingScore,
    SpillGate,
    labels_of,
)
from mmlens.store.base import SQLStore
from mmlens.store.open import open_store

ROUTER = "http://127.0.0.1:30000"
W1 = "grpc://127.0.0.1:50051"
W2 = "grpc://127.0.0.1:50052"
MODEL = "Qwen/Qwen3-VL-2B-Instruct"
TEXT = "Describe this image in detail please."


@dataclass
class Recorded:
    path: str  # a SQLite file or a PostgreSQL URL
    now: float
    hit_id: str
    false_hit_id: str
    drift_id: str
    error_id: str
    two_image_id: str


def _trace(rid: str, ts: float, images: list[bytes], worker: str | None, *, cached: int,
           overlap_blocks: int | None, drift: int = 0, text: str = TEXT,
           error_code: str | None = None) -> RequestTrace:
    t = RequestTrace(request_id=rid, router=ROUTER, router_kind="smg", model=MODEL, ts=ts,
                     stream=False)
    # As the Lab's sender records it when the prompt text is kept (full rebuild).
    TraceSink(layout_model="qwen3-vl", keep_text=True).describe(
        t, SentRequest(text, [ImagePart(data) for data in images]))
    layout = t.expected_layout
    assert layout is not None
    if error_code:
        t.status, t.error, t.error_code = 503, "no worker can process media refs", error_code
        return t
    t.status, t.worker = 200, worker
    assert layout.engine_prompt_tokens is not None
    t.prompt_tokens = layout.engine_prompt_tokens + drift
    t.cached_tokens = cached
    t.completion_tokens, t.latency_s, t.ttft_s = 8, 0.05, 0.02
    if overlap_blocks is not None:
        t.predictions.append(RoutingDecision(rid, "smg", "header:x-smg-cache-trace",
                                             worker=worker, branch="event_hit",
                                             overlap_blocks=overlap_blocks,
                                             request_blocks=t.prompt_tokens // 16,
                                             block_size=16))
    return t


def fill(path: str, now: float) -> Recorded:
    store = open_store(path)
    traces = _traces(now)
    store.add_traces(traces)
    store.add_decisions(_decisions(now))
    _availability(store, traces)
    VerdictJob(store).catch_up()  # the lead collector's verdicts, once the requests settled
    store.add_samples(_samples(now))
    _kv(store, now)
    _health_and_meta(store, now)
    store.close()
    return Recorded(path, now, "req-hit", "req-false-hit", "req-drift", "req-error", "req-two")


def _traces(now: float) -> list[RequestTrace]:
    red, blue = solid_png(64, 64, (200, 30, 30)), solid_png(64, 64, (30, 30, 200))
    green = solid_png(640, 480, (30, 160, 30))
    return [
        _trace("req-seed", now - 100, [red], W1, cached=0, overlap_blocks=0),
        _trace("req-hit", now - 90, [red], W1, cached=80, overlap_blocks=5),
        _trace("req-false-hit", now - 80, [blue], W1, cached=0, overlap_blocks=5),
        _trace("req-drift", now - 70, [green], W2, cached=0, overlap_blocks=0, drift=3),
        _trace("req-two", now - 60, [red, green], W1, cached=0, overlap_blocks=0,
               text="Compare the two images."),
        _trace("req-error", now - 50, [red], None, cached=0, overlap_blocks=None,
               error_code="no_media_ref_capable_worker"),
    ]


def _availability(store: SQLStore, traces: list[RequestTrace]) -> None:
    """Available vs achieved as the collector's job stores it; here each request is judged
    against the requests before it (no KV events to replay)."""
    per_request, _ = history_summary(traces)
    results = list(per_request.values())
    store.add_availability(results)
    store.add_cells(cell_sums(results))


def _decisions(now: float) -> list[RoutingDecision]:
    """What the collector's log follower stores from SMG's cache trace for req-hit."""
    return [RoutingDecision(
        "req-hit", "smg", "log:cache_trace", worker=W1, branch="event_hit", overlap_blocks=5,
        request_blocks=5, block_size=16, ts=now - 90, policy="cache_aware", origin="policy",
        prediction_source="event_index_overlap",
        candidates=[RoutingCandidate(W1, 2.0, True, False), RoutingCandidate(W2, 0.0, True, False)],
        scores=[RoutingScore("policy_affinity", W1, 5.0, "blocks", 5.0, 5),
                RoutingScore("expected_wait", W1, 0.25, "seconds"),
                RoutingScore("expected_wait", W2, 0.0, "seconds")],
        gates=[SpillGate(W1, 2.0, 1.0, 1.5, 64.0, 4.0, False)])]


def _samples(now: float) -> list[MetricSample]:
    samples = []
    for i in range(13):
        ts = now - 120 + 10 * i
        for target, hits, queries in ((W1, 40 * i, 100 * i), (W2, 10 * i, 80 * i)):
            samples += [
                MetricSample(target, "vllm:prefix_cache_hits_total",
                             labels_of({"model_name": MODEL, "engine": "0"}), hits, ts),
                MetricSample(target, "vllm:prefix_cache_queries_total",
                             labels_of({"model_name": MODEL, "engine": "0"}), queries, ts),
            ]
        samples += [
            MetricSample("smg", "smg_mm_processing_total", labels_of(
                {"model": MODEL, "mode": "router", "reason": "auto_mixed"}), 2 * i, ts),
            MetricSample("smg", "smg_cache_aware_policy_branch_total",
                         labels_of({"branch": "event_hit"}), 3 * i, ts),
            MetricSample("smg", "smg_cache_aware_policy_branch_total",
                         labels_of({"branch": "expected_wait_fallback"}), i, ts),
            MetricSample("smg", "smg_worker_requests_total",
                         labels_of({"worker": W1, "model": MODEL}), 2 * i, ts),
        ]
    return samples


def _kv(store: SQLStore, now: float) -> None:
    events = []
    for n, (worker, ident) in enumerate(((W1, "a" * 64), (W1, "b" * 64), (W2, "c" * 64))):
        hashes = [1000 * (n + 1) + k for k in range(5)]
        events.append(BlockStored(worker, 0, n, now - 100 + 10 * n, hashes, None,
                                  list(range(80)), 16,
                                  images=[(ImageRef(ident, 0),)] * 5))
    events.append(BlockStored(W1, 0, 3, now - 55, [9001, 9002], 1004, list(range(32)), 16))
    store.add_kv_events(events)
    store.set_kv_state({
        "w1": {"worker": W1, "rank": 0, "resident_blocks": 12,
               "images": {"a" * 64: 5, "b" * 64: 5}},
        "w2": {"worker": W2, "rank": 0, "resident_blocks": 5,
               "images": {"c" * 64: 5, "a" * 64: 2}},
    }, now - 1)


def _health_and_meta(store: SQLStore, now: float) -> None:
    health = [CollectorHealth("metrics", t, last_success=now - 2) for t in ("smg", W1, W2)]
    health.append(CollectorHealth("kv_events", f"{W1}#0", last_success=now - 55,
                                  counters={"batches": 4}))
    # W2 served req-drift but its KV stream never delivered a batch.
    health.append(CollectorHealth("kv_events", f"{W2}#0"))
    health.append(CollectorHealth("router_state", "smg", last_success=now - 2))
    store.set_health(health, now - 1)
    store.set_meta("targets", {"routers": [{"name": "smg", "kind": "smg", "url": ROUTER,
                                            "metrics_url": None, "log_file": None,
                                            "api_key_env": None}],
                               "workers": [{"name": "w1", "router_url": W1},
                                           {"name": "w2", "router_url": W2}],
                               "prometheus": None})
    store.set_meta("router_state", [{
        "router": "smg", "url": ROUTER, "kind": "smg", "ts": now - 2, "models": [MODEL],
        "workers": [{"url": w, "model": MODEL, "connection_mode": "grpc", "runtime": "vllm",
                     "healthy": True, "status": "ready", "load": 0, "kv_block_size": 16,
                     "mm_processor": None, "labels": {}} for w in (W1, W2)]}])
