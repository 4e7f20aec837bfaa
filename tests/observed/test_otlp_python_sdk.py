"""The official OpenTelemetry Python SDK (``opentelemetry-sdk`` with its OTLP gRPC and
HTTP/protobuf exporters, pinned in requirements-dev.txt) exporting to the receiver `mmlens
collect` runs, compressed or not: router- and worker-shaped spans (names, attributes and their
types as in the SMG 1.13 and Dynamo 1.6.1 captures) are counted, join into one observed request
each in the store, and refused bodies are counted while the exporter's next export succeeds.

What the SDK sends (measured here): ``content-type: application/x-protobuf``, with
``content-encoding: gzip`` or ``deflate`` when compressed, one export per batch (up to 512
spans), over one keep-alive connection."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config
from mmlens.records import RequestTrace
from mmlens.store.sqlite import Store
from tests.live_support import free_port

pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk (requirements-dev.txt)")
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind, Tracer, format_trace_id
from opentelemetry.trace.propagation.tracecontext import (
    TraceContextTextMapPropagator,
)

pytestmark = pytest.mark.live

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
SMG_WORKER = "grpc://127.0.0.1:24820"
DYN_WORKER = "5981752561898456010"
PROPAGATOR = TraceContextTextMapPropagator()  # the traceparent routers pass to workers
COMPRESSION = {"grpc": {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                        "deflate": grpc.Compression.Deflate},
               "http": {"none": Compression.NoCompression, "gzip": Compression.Gzip,
                        "deflate": Compression.Deflate}}


@dataclass
class Sent:
    """What the HTTP exporter's session saw of each export: request headers, response."""

    headers: list[dict[str, str]] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    def hook(self, r: Any, *args: Any, **kw: Any) -> None:
        self.headers.append({k.lower(): v for k, v in r.request.headers.items()})
        self.status.append(r.status_code)
        self.bodies.append(r.content)


@pytest.fixture
def collect(tmp_path: Path) -> Iterator[CollectorRunner]:
    """A collector as `mmlens collect` runs it with an ``[otlp]`` table, on a fresh store."""
    store = Store(tmp_path / "otlp.db")
    runner = CollectorRunner(Config(otlp_grpc_port=free_port(), otlp_http_port=free_port()),
                             store)
    try:
        runner.setup()
        assert runner.otlp is not None and runner.otlp.host == "127.0.0.1"
        yield runner
    finally:
        runner.close()
        store.close()


def _exporter(runner: CollectorRunner, transport: str, compression: str,
              sent: Sent | None = None) -> SpanExporter:
    rx = runner.otlp
    assert rx is not None
    if transport == "grpc":
        return GrpcExporter(endpoint=f"127.0.0.1:{rx.grpc_port}", insecure=True, timeout=5,
                            compression=COMPRESSION["grpc"][compression])
    import requests  # the HTTP exporter's own transport

    session = requests.Session()
    if sent is not None:
        session.hooks["response"].append(sent.hook)
    return HttpExporter(endpoint=f"http://127.0.0.1:{rx.http_port}/v1/traces", timeout=5,
                        compression=COMPRESSION["http"][compression], session=session)


def _provider(resource: dict[str, str], exporter: SpanExporter) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create(resource))
    tp.add_span_processor(BatchSpanProcessor(exporter))
    return tp


def _smg_request(router: Tracer, worker: Tracer, rid: str, cached: int) -> str:
    """One chat request as SMG 1.13 (``--enable-trace``) and a vLLM worker export it:
    ``http_request`` → ``grpc_execute`` (the engine id ``<rid>-<uuid>``) → ``llm_request``
    in the worker, under the traceparent SMG passes it. Returns the trace id."""
    engine_id = f"{rid}-{uuid.uuid4()}"
    with router.start_as_current_span("http_request", attributes={
            "method": "POST", "path": "/v1/chat/completions", "version": "HTTP/1.1",
            "module": "smg", "request_id": rid, "status_code": "200",
            "latency": "34259"}) as http:
        with router.start_as_current_span("grpc_execute", attributes={
                "request_type": "generate", "request_id": engine_id, "model": MODEL,
                "mode": "single"}):
            carrier: dict[str, str] = {}
            PROPAGATOR.inject(carrier)
        with worker.start_as_current_span(
                "llm_request", context=PROPAGATOR.extract(carrier), kind=SpanKind.SERVER,
                attributes={"gen_ai.request.id": engine_id, "gen_ai.response.model": MODEL,
                            "gen_ai.usage.prompt_tokens": 81,
                            "gen_ai.usage.completion_tokens": 8,
                            "gen_ai.usage.cached_tokens": cached,
                            "gen_ai.latency.time_to_first_token": 0.006}):
            pass
    return format_trace_id(http.get_span_context().trace_id)


def _dynamo_request(frontend: Tracer, worker: Tracer, rid: str) -> str:
    """One image request as the Dynamo 1.6.1 frontend (``OTEL_EXPORT_ENABLED=1``) and its
    worker export it: ``http-request`` with the request's log lines as events, the routing
    decision as an event of ``kv_router.select_worker``, a span nothing reads, and the
    worker's ``llm_request``."""
    with frontend.start_as_current_span("http-request", attributes={
            "method": "POST", "uri": "/v1/chat/completions", "version": "HTTP/1.1",
            "request_id": rid, "model": MODEL, "input_tokens": "18", "output_tokens": "8",
            "image_count": "1", "ttft_ms": "23.84", "prefill_worker_id": DYN_WORKER,
            "decode_worker_id": DYN_WORKER, "request.outcome": "success"}) as http:
        http.add_event("request received", {"level": "INFO", "request_id": rid,
                                            "model": MODEL, "request_type": "unary"})
        http.add_event("image-token count", {
            "level": "DEBUG", "model": "/models/Qwen3-VL-2B-Instruct", "width": "64",
            "height": "64", "tokens": "64", "mm_hash": "6680051703611963297"})
        with frontend.start_as_current_span("kv_router.select_worker") as select:
            select.add_event(
                f"[ROUTING] Best: worker_{DYN_WORKER} dp_rank=0 with 4/6 blocks overlap",
                {"level": "DEBUG", "request_id": rid, "worker_id": DYN_WORKER,
                 "dp_rank": "0", "overlap_blocks": "4", "total_blocks": "6"})
            with frontend.start_as_current_span("kv_router.find_matches"):
                pass
        with worker.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes={
                "gen_ai.request.id": rid, "gen_ai.response.model": MODEL,
                "gen_ai.usage.prompt_tokens": 81, "gen_ai.usage.completion_tokens": 8,
                "gen_ai.usage.cached_tokens": 64}):
            pass
    return format_trace_id(http.get_span_context().trace_id)


SMG_IDS = ("chatcmpl-sdk-red-1", "chatcmpl-sdk-red-2")
DYN_ID = "83c21066-ca29-4996-8513-28e4fb4a3953"
SPANS = 2 * 3 + 4  # SMG: three per request; Dynamo: four, of which one is not read


def _export_workload(runner: CollectorRunner, transport: str, compression: str,
                     sent: Sent | None = None) -> dict[str, str]:
    """Both routers' requests through the SDK, one provider (and exporter) per service as
    in a deployment; the trace id of each request."""
    def provider(resource: dict[str, str]) -> TracerProvider:
        return _provider(resource, _exporter(runner, transport, compression, sent))

    providers = [provider({"service.name": "smg"}),
                 provider({"service.name": "vllm", "service.instance.id": SMG_WORKER}),
                 provider({"service.name": "dynamo-frontend"}),
                 provider({"service.name": "vllm", "service.instance.id": DYN_WORKER})]
    smg, smg_worker, dynamo, dyn_worker = (p.get_tracer("router") for p in providers)
    traces = {rid: _smg_request(smg, smg_worker, rid, cached)
              for rid, cached in zip(SMG_IDS, (0, 64), strict=True)}
    traces[DYN_ID] = _dynamo_request(dynamo, dyn_worker, DYN_ID)
    for p in providers:
        assert p.force_flush(10_000)
        p.shutdown()
    return traces


def _stored(runner: CollectorRunner) -> tuple[int, dict[str, RequestTrace]]:
    """How many requests the store holds, and each by every id it is known by (the first
    span to arrive names it, the others' ids are its aliases)."""
    runner.flush()  # what `mmlens collect` does on its tick (here: at once, not after 1 s)
    traces = runner.store.traces(20)
    return len(traces), {i: t for t in traces for i in (t.request_id, *t.aliases)}


@pytest.mark.parametrize("transport,compression", [
    ("grpc", "none"), ("grpc", "gzip"), ("grpc", "deflate"), ("http", "none"),
    ("http", "gzip"), ("http", "deflate")])
def test_sdk_exports_join_into_observed_requests(collect: CollectorRunner, transport: str,
                                                 compression: str) -> None:
    sent = Sent()
    traces = _export_workload(collect, transport, compression, sent)
    rx = collect.otlp
    assert rx is not None
    assert rx.health.errors == {}
    assert rx.health.counters == {f"{transport}_requests": 4, "spans": SPANS,
                                  "spans_read": SPANS - 1}
    if transport == "http":  # what the SDK really sent, and what it got back
        assert sent.status == [200] * 4
        assert {h.get("content-encoding", "none") for h in sent.headers} == {compression}
        assert {h["content-type"] for h in sent.headers} == {"application/x-protobuf"}
        for body in sent.bodies:  # a full success: no partial_success to report
            assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")

    n, stored = _stored(collect)
    assert n == 3 and {*SMG_IDS, DYN_ID} <= set(stored)
    for rid, cached in zip(SMG_IDS, (0, 64), strict=True):
        t = stored[rid]  # router span, engine span and worker span: one request
        assert any(i.startswith(rid + "-") for i in (t.request_id, *t.aliases))  # engine id
        assert t.origin == "observed" and t.trace_id == traces[rid]
        assert (t.status, t.model, t.latency_s) == (200, MODEL, pytest.approx(0.034259))
        assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (81, 8, cached)
        assert t.worker == SMG_WORKER and t.ttft_s == pytest.approx(0.006)
        assert t.provenance["cached_tokens"] == "otlp:llm_request"
        assert t.provenance["status"] == "otlp:smg.http_request"
    d = stored[DYN_ID]
    assert d.trace_id == traces[DYN_ID] and d.worker == DYN_WORKER
    assert (d.status, d.ttft_s, d.rendered_tokens, d.cached_tokens) == (
        200, pytest.approx(0.02384), 18, 64)
    assert [(i.width, i.height, i.tokens) for i in d.images] == [(64, 64, 64)]
    decisions = {d.source: d for d in collect.store.decisions([DYN_ID])}
    assert set(decisions) == {"otlp:routing_best", "otlp:mm_image_tokens"}  # span events
    best = decisions["otlp:routing_best"]
    assert (best.worker, best.overlap_blocks, best.request_blocks) == (DYN_WORKER, 4, 6)
    assert decisions["otlp:mm_image_tokens"].image_tokens == [64]
    health = {h.collector: h for h in collect.store.health()}
    assert health["otlp"].counters["spans"] == SPANS


def _one_span(tp: TracerProvider, size: int = 10) -> Any:
    span = tp.get_tracer("router").start_span("http_request", attributes={
        "request_id": f"chatcmpl-{uuid.uuid4()}", "path": "/v1/chat/completions",
        "status_code": "200", "padding": "x" * size})
    span.end()
    return span


def test_refused_http_bodies_are_counted_and_the_exporter_carries_on(
        collect: CollectorRunner) -> None:
    rx = collect.otlp
    assert rx is not None
    rx.max_body = 1 << 20  # the limit lowered, so that "oversized" need not be 16 MiB
    sent = Sent()
    exporter = _exporter(collect, "http", "gzip", sent)
    tp = TracerProvider()
    assert exporter.export([_one_span(tp)]) == SpanExportResult.SUCCESS
    url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
    pb = {"content-type": "application/x-protobuf"}
    with httpx.Client() as raw:
        bad = raw.post(url, content=b"\x0a\xff\xff\xff", headers=pb)
        big = raw.post(url, content=b"\x0a" * (2 << 20), headers=pb)
        gz = {**pb, "content-encoding": "gzip"}
        bomb = raw.post(url, content=gzip.compress(b"\x00" * (4 << 20)), headers=gz)
        cut = raw.post(url, content=gzip.compress(b"\x0a\x00" * 1000)[:-12], headers=gz)
        brotli = raw.post(url, content=b"...", headers={**pb, "content-encoding": "br"})
    # OTLP/HTTP: undecodable → 400 with a google.rpc.Status in the request's encoding
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/x-protobuf"
    assert "not an OTLP" in status_pb2.Status.FromString(bad.content).message
    assert [r.status_code for r in (big, bomb, cut, brotli)] == [413, 413, 400, 415]
    assert rx.health.errors == {"malformed_export": 1, "too_large": 2, "bad_gzip": 1,
                                "unsupported_encoding": 1}
    # The SDK's own oversized batch: refused once (413 is not retried), then it carries on.
    assert exporter.export([_one_span(tp, 2 << 20)]) == SpanExportResult.FAILURE
    assert exporter.export([_one_span(tp)]) == SpanExportResult.SUCCESS
    assert sent.status == [200, 413, 200]
    assert rx.health.errors["too_large"] == 3
    # requests that reached the decoder: the SDK's two good exports and the malformed body
    assert rx.health.counters["spans"] == 2 and rx.health.counters["http_requests"] == 3
    exporter.shutdown()


def test_an_oversized_grpc_export_is_refused_once_and_counted(tmp_path: Path) -> None:
    """grpc's own size limit answers RESOURCE_EXHAUSTED, which the SDK retries until its
    timeout; the receiver answers INVALID_ARGUMENT (not retried) and counts it."""
    from mmlens.collectors.otlp_receiver import OtlpReceiver

    got: list[Any] = []
    with OtlpReceiver(got.extend, grpc_port=free_port(), http_port=None,
                      max_body=1 << 16) as rx:
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{rx.grpc_port}", insecure=True,
                                timeout=5)
        tp = TracerProvider()
        assert exporter.export([_one_span(tp, 100_000)]) == SpanExportResult.FAILURE
        assert rx.health.counters["grpc_requests"] == 1  # one attempt, no retries
        assert rx.health.errors == {"too_large": 1}
        assert exporter.export([_one_span(tp)]) == SpanExportResult.SUCCESS
        exporter.shutdown()
    assert len(got) == 1
