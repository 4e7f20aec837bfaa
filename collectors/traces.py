"""Per-request traces: send an OpenAI chat request with image parts, record what came back.

Worker attribution: SMG's ``x-smg-routed-worker-id`` header, Dynamo's ``nvext.worker_id``
(asked for with ``nvext.extra_fields``). Prediction: SMG's ``x-smg-cache-trace`` header,
Dynamo's ``nvext.timing``. ``cached_tokens`` absent (SMG omits ``prompt_tokens_details``
when it is 0) means 0.
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from mmlens.ingest.router_logs import cache_trace_decision
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import ExpectedLayout, ImageInfo, RequestTrace, RoutingDecision

LayoutHook = Callable[[str, Sequence["ImagePart"], str], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image to send: raw bytes (sent as a data: URL) or an http(s) URL passed through."""

    data: bytes | None = None
    url: str | None = None
    mime: str = "image/png"

    def as_url(self) -> str:
        if self.url is not None:
            return self.url
        assert self.data is not None
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"


def solid_png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    return synthetic_png("solid", width, height, rgb=rgb)


def _image_info(part: ImagePart) -> ImageInfo:
    if part.data is None:
        return ImageInfo("http", identities={"dynamo_mm_hash_url": _dynamo_hash(part.as_url())})
    info = ImageInfo("data", byte_size=len(part.data))
    try:
        from PIL import Image

        with Image.open(io.BytesIO(part.data)) as img:
            info.width, info.height = img.size
    except Exception:  # unreadable bytes are still sent; the router will say what it thinks
        pass
    info.identities = _identities(part)
    return info


def _dynamo_hash(url: str) -> str:
    import xxhash

    return f"{xxhash.xxh3_64_intdigest(url.encode()):016x}"


def _identities(part: ImagePart) -> dict[str, str]:
    """Identity under each router's scheme, from the core's hashing module."""
    out = {"dynamo_mm_hash_url": _dynamo_hash(part.as_url())}
    try:
        from mmlens.layout.hashing import smg_identifier

        if part.data is not None:
            out["smg_blake3"] = smg_identifier(part.data)
    except ImportError:
        pass
    return out


def model_layout_hook(model: str, block_size: int = 16) -> LayoutHook:
    """Expected layout from the core (`mmlens.layout.modeldir.resolve_model`), for traces."""

    def hook(text: str, images: Sequence[ImagePart], _model: str) -> dict[str, Any] | None:
        from mmlens.layout.composition import ImageInput
        from mmlens.layout.imageinfo import probe_image
        from mmlens.layout.modeldir import resolve_model
        from mmlens.layout.report import layout_summary

        resolved = resolve_model(model)
        inputs = []
        for part in images:
            if part.data is None:
                return None  # the size of a URL image is unknown without fetching it
            info = probe_image(part.data)
            inputs.append(ImageInput(info.width, info.height, data=part.data,
                                     url=part.as_url(), format=info.format))
        parts: list[Any] = [*inputs, text]
        layout = resolved.layout(parts, block_size=block_size)
        return layout_summary(layout, resolved.family, inputs)

    return hook


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
    def __init__(self, client: httpx.Client, timeout_s: float = 60.0,
                 layout_hook: LayoutHook | None = None) -> None:
        self.client = client
        self.timeout = httpx.Timeout(timeout_s)
        self.layout_hook = layout_hook

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
             request_id: str | None = None, api_key: str | None = None) -> RequestTrace:
        rid = request_id or f"mmlens-{uuid.uuid4().hex[:16]}"
        trace = RequestTrace(request_id=rid, router=router_url, router_kind=router_kind,
                             model=model, ts=time.time(), stream=stream,
                             images=[_image_info(im) for im in images])
        if self.layout_hook is not None:
            try:
                summary = self.layout_hook(text, images, model)
                if summary is not None:
                    trace.expected_layout = ExpectedLayout.from_summary(summary)
            except Exception as exc:  # a layout the core refuses is information, not a crash
                trace.expected_layout = ExpectedLayout.failed(f"{type(exc).__name__}: {exc}")
        headers = {"x-request-id": rid, "content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        body = self.build_body(model, text, images, stream, max_tokens, router_kind)
        url = router_url.rstrip("/") + "/v1/chat/completions"
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
        return trace

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
            try:
                trace.predictions.append(cache_trace_decision(json.loads(raw), trace.request_id))
            except (ValueError, AttributeError):
                trace.predictions.append(RoutingDecision(
                    trace.request_id, "smg", "header:x-smg-cache-trace",
                    warnings=["undecodable x-smg-cache-trace header"]))

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
        usage = obj.get("usage")
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens")
            trace.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            trace.cached_tokens = int(details.get("cached_tokens") or 0)
        nvext = obj.get("nvext")
        if isinstance(nvext, dict):
            if trace.router_kind == "auto":
                trace.router_kind = "dynamo"
            wid = nvext.get("worker_id")
            if isinstance(wid, dict):
                worker = wid.get("decode_worker_id", wid.get("prefill_worker_id"))
                if worker is not None:
                    trace.worker = str(worker)
                    trace.dp_rank = wid.get("decode_dp_rank", wid.get("prefill_dp_rank"))
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
