"""What the tap records of one OpenAI-compatible exchange, from the bytes it passed through.

Request: model, stream, each image (data: URL bytes → size, dimensions, identities under
each router's scheme; http(s) URL → Dynamo's URL hash), and the part layout (text parts as
character counts, image parts by index) — never prompt text or image bytes unless
``store_text``. Response: worker (``x-smg-routed-worker-id`` header, ``nvext.worker_id``),
usage with ``cached_tokens`` (SMG omits ``prompt_tokens_details`` when it is 0), SMG's
``x-smg-cache-trace`` prediction, error code, and — for SSE streams — the time to the first
content chunk. Total over bad input: undecodable bodies leave fields unknown.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from mmlens.errors import ImageError
from mmlens.ingest.numbers import as_int
from mmlens.ingest.observed import SOURCE_TAP, fragment, put
from mmlens.ingest.router_logs import cache_trace_from_header
from mmlens.layout.imageinfo import decode_data_url
from mmlens.layout.sent import SentImage, describe_image
from mmlens.records import ExpectedLayout, ImageInfo, RequestTrace, RoutingDecision

LABEL = SOURCE_TAP


@dataclass
class RequestFacts:
    model: str | None = None
    stream: bool = False
    images: list[ImageInfo] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)  # the part layout
    # The prompt's text and image URLs, kept only while the exchange is in flight (for a
    # token layout); a record carries the text only with --store-text.
    text: str = ""
    image_urls: list[str] = field(default_factory=list)
    store_text: bool = False
    error: str | None = None
    # Images behind http(s) URLs the tap fetched itself (by index in ``images``).
    fetched: dict[int, SentImage] = field(default_factory=dict)

    def http_images(self) -> list[tuple[int, str]]:
        return [(i, u) for i, u in enumerate(self.image_urls) if not u.startswith("data:")]

    def add_fetched(self, index: int, sent: SentImage) -> None:
        self.fetched[index] = sent
        self.images[index] = sent.info

    def sent_images(self) -> list[SentImage] | None:
        """Every image as sent with what is known of it, None while one's bytes are unknown
        (an http URL not fetched) — a layout needs them all."""
        out = []
        for i, url in enumerate(self.image_urls):
            if i in self.fetched:
                out.append(self.fetched[i])
                continue
            if not url.startswith("data:"):
                return None
            try:
                out.append(describe_image(url, decode_data_url(url)))
            except ImageError:
                return None
        return out


def _image(url: str) -> ImageInfo:
    data = None
    if url.startswith("data:"):
        with contextlib.suppress(ImageError):
            data = decode_data_url(url)
    return describe_image(url, data).info


def _content_parts(messages: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            out.append(("text", content))
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "text":
                    out.append(("text", str(part.get("text") or "")))
                elif kind in ("image_url", "input_image"):
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    if isinstance(url, str):
                        out.append(("image", url))
    return out


def request_facts(body: bytes, store_text: bool = False) -> RequestFacts:
    facts = RequestFacts()
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        facts.error = "request body is not JSON"
        return facts
    if not isinstance(obj, dict):
        facts.error = "request body is not a JSON object"
        return facts
    facts.model = obj.get("model") if isinstance(obj.get("model"), str) else None
    facts.stream = obj.get("stream") is True
    texts: list[str] = []
    for kind, value in _content_parts(obj.get("messages")):
        if kind == "text":
            facts.parts.append({"kind": "text", "chars": len(value)})
            texts.append(value)
        else:
            facts.parts.append({"kind": "image", "index": len(facts.images)})
            facts.images.append(_image(value))
            facts.image_urls.append(value)
    facts.text = "\n".join(texts)
    facts.store_text = store_text
    return facts


@dataclass
class ResponseFacts:
    status: int | None = None
    worker: str | None = None
    response_id: str | None = None
    request_id: str | None = None  # the router's x-request-id answer
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    dp_rank: int | None = None
    error_code: str | None = None
    error: str | None = None
    predictions: list[RoutingDecision] = field(default_factory=list)
    ttft_s: float | None = None
    latency_s: float | None = None
    router_kind: str = "auto"

    def headers(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        if any(k.startswith("x-smg-") for k in headers):
            self.router_kind = "smg"
        self.worker = headers.get("x-smg-routed-worker-id") or self.worker
        self.request_id = headers.get("x-request-id") or self.request_id
        self.error_code = headers.get("x-smg-error-code") or self.error_code
        raw = headers.get("x-smg-cache-trace")
        if raw:
            self.predictions.append(cache_trace_from_header(raw))

    def chunk(self, obj: Any) -> None:
        """One JSON body or SSE chunk."""
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("id"), str):
            self.response_id = self.response_id or obj["id"]
        usage = usage_counts(obj)
        if usage is not None:
            self.prompt_tokens, self.completion_tokens, self.cached_tokens = usage
        if isinstance(obj.get("nvext"), dict):
            self.router_kind = "dynamo"
        placed = nvext_worker(obj)
        if placed is not None:
            self.worker = placed[0] or self.worker
            self.dp_rank = placed[1]
        err = obj.get("error")
        if isinstance(err, dict):
            self.error = str(err.get("message") or "")[:300]
            self.error_code = self.error_code or str(err.get("code") or err.get("type") or "")


def usage_counts(obj: dict[str, Any]) -> tuple[int | None, int | None, int] | None:
    """(prompt, completion, cached tokens) of a response's or chunk's ``usage``, None without
    one; cached is 0 when absent (SMG omits ``prompt_tokens_details`` when it is 0)."""
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens")),
            as_int(cached) or 0)


def nvext_worker(obj: dict[str, Any]) -> tuple[str | None, int | None] | None:
    """(worker, dp rank) from Dynamo's ``nvext.worker_id`` (the decode worker's, else the
    prefill worker's); None when the response has no ``worker_id``."""
    nvext = obj.get("nvext")
    wid = nvext.get("worker_id") if isinstance(nvext, dict) else None
    if not isinstance(wid, dict):
        return None
    worker = wid.get("decode_worker_id", wid.get("prefill_worker_id"))
    return (None if worker is None else str(worker),
            as_int(wid.get("decode_dp_rank", wid.get("prefill_dp_rank"))))


def first_content(obj: Any) -> bool:
    """Whether an SSE chunk carries the first generated content (or a finish)."""
    if not isinstance(obj, dict):
        return False
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict):
            delta = choice.get("delta") or {}
            if (isinstance(delta, dict) and delta.get("content")) or choice.get("finish_reason"):
                return True
    return False


def to_fragment(req: RequestFacts, resp: ResponseFacts, *, client_request_id: str | None,
                ts: float, router: str) -> RequestTrace:
    """The tap's record of one exchange, keyed by the client's ``x-request-id``, else the
    router's answer, else the response id."""
    rid = client_request_id or resp.request_id or resp.response_id or f"tap-{ts:.6f}"
    t = fragment(rid, SOURCE_TAP, ts, "auto", router)
    t.response_id = resp.response_id
    if resp.request_id and resp.request_id != rid:
        t.aliases.append(resp.request_id)
    put(t, "model", req.model, LABEL)
    put(t, "stream", req.stream, LABEL)
    for name in ("status", "worker", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "dp_rank", "error_code", "error", "ttft_s", "latency_s"):
        put(t, name, getattr(resp, name), LABEL)
    if req.images:
        t.images = req.images
        t.provenance["images"] = LABEL
    t.predictions = resp.predictions
    for d in t.predictions:
        d.request_id = d.request_id or rid
    t.router_kind = resp.router_kind
    if req.parts:  # the part layout; a full token layout replaces it with --layout-model
        t.expected_layout = ExpectedLayout.from_summary(
            {"parts": req.parts, "text": req.text if req.store_text else None})
        t.provenance["expected_layout"] = LABEL
    return t
