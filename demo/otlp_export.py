"""vLLM-shaped request spans from the simulated workers, exported over OTLP/HTTP (protobuf).

vLLM (``--otlp-traces-endpoint``) ends one ``llm_request`` SERVER span per request, in the
trace of the incoming ``traceparent`` header, with ``gen_ai.*`` attributes (vllm/tracing:
``gen_ai.request.id``, ``gen_ai.response.model``, ``gen_ai.usage.prompt_tokens``,
``gen_ai.usage.completion_tokens``, ``gen_ai.usage.cached_tokens``,
``gen_ai.request.max_tokens``, ``gen_ai.latency.time_to_first_token``, ``gen_ai.latency.e2e``,
``gen_ai.latency.time_in_queue``). The demo workers do the same so the router → worker join
is exercised; ``service.instance.id`` names the worker as the router does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

log = logging.getLogger("mmlens.demo.otlp")

SPAN_NAME = "llm_request"


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: bytes
    parent_span_id: bytes | None


def parse_traceparent(value: str | None) -> TraceContext | None:
    """W3C ``00-<32 hex trace>-<16 hex parent>-<flags>``; None when absent or malformed."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace, parent = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        return None
    if not any(trace):
        return None
    return TraceContext(trace, parent if any(parent) else None)


def _kv(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


@dataclass(slots=True)
class RequestStats:
    request_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    max_tokens: int
    arrival: float  # Unix seconds
    first_token: float | None
    end: float


class SpanExporter:
    """Batches spans and POSTs them to ``<endpoint>/v1/traces`` from a daemon thread; a
    full queue or an unreachable endpoint drops spans (counted), never blocks a request."""

    def __init__(self, endpoint: str, service: str = "vllm", instance: str = "",
                 max_queue: int = 10_000, interval_s: float = 0.2) -> None:
        url = endpoint.rstrip("/")
        self.url = url if url.endswith("/v1/traces") else url + "/v1/traces"
        self.resource = [_kv("service.name", service)]
        if instance:
            self.resource.append(_kv("service.instance.id", instance))
        self.queue: queue.Queue[Span] = queue.Queue(max_queue)
        self.interval_s = interval_s
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def record(self, stats: RequestStats, context: TraceContext | None) -> None:
        span = Span(name=SPAN_NAME, kind=Span.SPAN_KIND_SERVER,
                    trace_id=context.trace_id if context else os.urandom(16),
                    span_id=os.urandom(8),
                    parent_span_id=(context.parent_span_id or b"") if context else b"",
                    start_time_unix_nano=int(stats.arrival * 1e9),
                    end_time_unix_nano=int(stats.end * 1e9))
        attrs: dict[str, str | int | float] = {
            "gen_ai.request.id": stats.request_id,
            "gen_ai.response.model": stats.model,
            "gen_ai.request.max_tokens": stats.max_tokens,
            "gen_ai.usage.prompt_tokens": stats.prompt_tokens,
            "gen_ai.usage.completion_tokens": stats.completion_tokens,
            "gen_ai.usage.cached_tokens": stats.cached_tokens,
            "gen_ai.usage.num_sequences": 1,
            "gen_ai.latency.e2e": stats.end - stats.arrival,
            "gen_ai.latency.time_in_queue": 0.0,
        }
        if stats.first_token is not None:
            attrs["gen_ai.latency.time_to_first_token"] = stats.first_token - stats.arrival
        span.attributes.extend(_kv(k, v) for k, v in attrs.items())
        try:
            self.queue.put_nowait(span)
        except queue.Full:
            self.dropped += 1

    def _batch(self) -> list[Span]:
        out: list[Span] = []
        while len(out) < 512:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return out

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.wait(self.interval_s):
                self._send(client)
            self._send(client)

    def _send(self, client: httpx.Client) -> None:
        while spans := self._batch():
            req = ExportTraceServiceRequest()
            rs = req.resource_spans.add()
            rs.resource.attributes.extend(self.resource)
            ss = rs.scope_spans.add()
            ss.scope.name = "vllm.llm_engine"
            ss.spans.extend(spans)
            try:
                client.post(self.url, content=req.SerializeToString(),
                            headers={"content-type": "application/x-protobuf"})
            except httpx.HTTPError as exc:
                self.dropped += len(spans)
                log.debug("OTLP export failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3.0)


async def traced_steps(steps: AsyncIterator[tuple[list[int], Any]],
                       exporter: SpanExporter | None, request_id: str, model: str,
                       max_tokens: int, context: TraceContext | None,
                       ) -> AsyncIterator[tuple[list[int], Any]]:
    """The engine's steps passed through; once they end, the request's span."""
    arrival, first, res = time.time(), None, None
    try:
        async with contextlib.aclosing(steps) as inner:
            async for new, step in inner:
                if new and first is None:
                    first = time.time()
                res = step
                yield new, step
    finally:
        if exporter is not None and res is not None:
            exporter.record(RequestStats(
                request_id, model, int(res.prompt_tokens), len(res.output_ids),
                int(res.cached_tokens), max_tokens, arrival, first, time.time()), context)
