"""Per-request traces: send an OpenAI chat request with image parts, record what came back.

Worker attribution: SMG's ``x-smg-routed-worker-id`` header, Dynamo's ``nvext.worker_id``
(asked for with ``nvext.extra_fields``). Prediction: SMG's ``x-smg-cache-trace`` header,
Dynamo's ``nvext.timing``. ``cached_tokens`` absent (SMG omits ``prompt_tokens_details``
when it is 0) means 0.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.ingest.router_logs import cache_trace_from_header
from mmlens.ingest.tap_parse import nvext_worker, usage_counts
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace, RoutingDecision

__all__ = ["ImagePart", "TraceClient", "solid_png"]


def solid_png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    return synthetic_png("solid", width, height, rgb=rgb)


def _error_code(resp: httpx.Response, body: Any) -> str | None:
    code = resp.headers.get("x-smg-error-code")
    if code:
        return code
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("code") or err.get("type") or "") or None
        if body.get("code"):
            return str(body["code"])
        if isinstance(err, str):
            return err[:80]
    return None


class TraceClient:
    """Sends traced requests; each trace goes through ``sink`` (by default one that describes
    the images and stores nothing)."""

    def __init__(self, client: httpx.Client, timeout_s: float = 60.0,
                 sink: TraceSink | None = None) -> None:
        self.client = client
        self.timeout = httpx.Timeout(timeout_s)
        self.sink = sink or TraceSink()

    def build_body(self, model: str, text: str, images: Sequence[ImagePart], stream: bool,
                   max_tokens: int, router_kind: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": im.as_url()}} for im in images]
        content.append({"type": "text", "text": text})
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream,
                                "messages": [{"role": "user", "content": content}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if router_kind in ("dynamo", "auto"):
            body["nvext"] = {"extra_fields": ["worker_id", "timing"]}
        return body

    def send(self, router_url: str, model: str, text: str, images: Sequence[ImagePart] = (),
             *, router_kind: str = "auto", stream: bool = False, max_tokens: int = 8,
             request_id: str | None = None, api_key: str | None = None,
             processing_mode: str | None = None) -> RequestTrace:
        """``processing_mode``: the mode the target router is known to run in, when known."""
        rid = request_id or f"mmlens-{uuid.uuid4().hex[:16]}"
        trace = RequestTrace(request_id=rid, router=router_url, router_kind=router_kind,
                             model=model, ts=time.time(), stream=stream,
                             processing_mode=processing_mode)
        headers = {"x-request-id": rid, "content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        body = self.build_body(model, text, images, stream, max_tokens, router_kind)
        url = router_url.rstrip("/") + "/v1/chat/completions"
        trace.ts = time.time()  # sent now: the layout above may have taken seconds
        t0 = time.perf_counter()
        try:
            if stream:
                self._stream(trace, url, body, headers, t0)
            else:
                resp = self.client.post(url, json=body, headers=headers, timeout=self.timeout)
                trace.latency_s = time.perf_counter() - t0
                self._headers(trace, resp)
                self._body(trace, resp, self._json(resp))
        except httpx.TimeoutException as exc:
            trace.error, trace.error_code = f"timeout: {exc}", "timeout"
        except httpx.HTTPError as exc:
            trace.error, trace.error_code = f"{type(exc).__name__}: {exc}", "unreachable"
        if trace.latency_s is None:
            trace.latency_s = time.perf_counter() - t0
        return self.sink.record(trace, SentRequest(text, images))

    @staticmethod
    def _json(resp: httpx.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            return None

    def _headers(self, trace: RequestTrace, resp: httpx.Response) -> None:
        trace.status = resp.status_code
        worker = resp.headers.get("x-smg-routed-worker-id")
        if worker:
            trace.worker = worker
            trace.router_kind = "smg" if trace.router_kind == "auto" else trace.router_kind
        returned = resp.headers.get("x-request-id")
        if returned and returned != trace.request_id:
            trace.response_id = returned
        raw = resp.headers.get("x-smg-cache-trace")
        if raw:
            trace.predictions.append(cache_trace_from_header(raw, trace.request_id))

    def _body(self, trace: RequestTrace, resp: httpx.Response, body: Any) -> None:
        if resp.status_code >= 400:
            trace.error_code = _error_code(resp, body)
            msg = body.get("error") if isinstance(body, dict) else None
            if isinstance(msg, dict):
                msg = msg.get("message")
            trace.error = str(msg or resp.text[:300] or f"HTTP {resp.status_code}")
            return
        if not isinstance(body, dict):
            trace.error, trace.error_code = "response is not JSON", "bad_response"
            return
        trace.response_id = trace.response_id or body.get("id")
        self._chunk_fields(trace, body)

    def _chunk_fields(self, trace: RequestTrace, obj: dict[str, Any]) -> None:
        usage = usage_counts(obj)
        if usage is not None:
            trace.prompt_tokens, trace.completion_tokens, trace.cached_tokens = usage
        nvext = obj.get("nvext")
        if isinstance(nvext, dict):
            if trace.router_kind == "auto":
                trace.router_kind = "dynamo"
            placed = nvext_worker(obj)
            if placed is not None and placed[0] is not None:
                trace.worker, trace.dp_rank = placed
            timing = nvext.get("timing")
            if isinstance(timing, dict):
                d = RoutingDecision(trace.request_id, "dynamo", "nvext.timing",
                                    worker=trace.worker, kv_hit_rate=timing.get("kv_hit_rate"),
                                    overlap_blocks=timing.get("kv_overlap_blocks"),
                                    request_blocks=timing.get("kv_total_blocks"))
                trace.predictions = [p for p in trace.predictions if p.source != "nvext.timing"]
                trace.predictions.append(d)
                if trace.ttft_s is None and timing.get("ttft_ms") is not None:
                    trace.ttft_s = float(timing["ttft_ms"]) / 1000.0

    def _stream(self, trace: RequestTrace, url: str, body: dict[str, Any],
                headers: dict[str, str], t0: float) -> None:
        with self.client.stream("POST", url, json=body, headers=headers,
                                timeout=self.timeout) as resp:
            self._headers(trace, resp)
            if resp.status_code >= 400 or "json" in resp.headers.get("content-type", ""):
                resp.read()  # an error, or a router that answered a stream request in one piece
                trace.latency_s = time.perf_counter() - t0
                self._body(trace, resp, self._json(resp))
                return
            ttft: float | None = None
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    trace.error, trace.error_code = "undecodable SSE chunk", "bad_response"
                    continue
                if not isinstance(chunk, dict):
                    continue
                if isinstance(chunk.get("error"), dict):
                    trace.error = str(chunk["error"].get("message"))
                    trace.error_code = str(chunk["error"].get("code") or "stream_error")
                trace.response_id = trace.response_id or chunk.get("id")
                if ttft is None:
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("content") or choice.get("finish_reason"):
                            ttft = time.perf_counter() - t0
                            break
                timing_ttft = trace.ttft_s
                self._chunk_fields(trace, chunk)
                trace.ttft_s = timing_ttft  # client-side TTFT wins for streams
            trace.latency_s = time.perf_counter() - t0
            trace.ttft_s = ttft
