"""What the tap records of one OpenAI-compatible exchange, from the bytes it passed through.

Request: model, stream, each image (data: URL bytes → size, dimensions, identities under
each router's scheme; http(s) URL → Dynamo's URL hash), and the part layout (text parts as
character counts, image parts by index) — never prompt text or image bytes unless
``store_text``. Response: worker (``x-smg-routed-worker-id`` header, ``nvext.worker_id``),
usage with ``cached_tokens`` (SMG omits ``prompt_tokens_details`` when it is 0), SMG's
``x-smg-cache-trace`` prediction, error code, and — for SSE streams — the time to the first
content chunk. Total over bad input: undecodable bodies (nested past any parser's depth,
lone surrogates, a chunk whose ``choices`` is a number) leave fields unknown.

The tap hands these functions an ``Exchange``: the bytes it relayed, kept as they passed, so
all parsing happens after the response went back to the client and off its event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from mmlens.errors import ImageError
from mmlens.ingest.numbers import as_int
from mmlens.ingest.observed import SOURCE_TAP, fragment, put
from mmlens.ingest.router_logs import cache_trace_from_header
from mmlens.layout.image_header import header_size
from mmlens.layout.imageinfo import decode_data_url
from mmlens.layout.sent import SentImage, describe_image, identities
from mmlens.records import (
    ExpectedLayout,
    ImageInfo,
    LayoutPart,
    RequestTrace,
    RoutingDecision,
)

LABEL = SOURCE_TAP

# What goes wrong when parsing bytes a client or router sent: not JSON, not UTF-8, nested past
# the decoder's depth (RecursionError), or a lone surrogate escape a later encode refuses.
BAD_INPUT = (ValueError, RecursionError, msgspec.DecodeError, UnicodeError)


def loads(data: bytes | memoryview | str) -> Any:
    """JSON as the routers read it: msgspec first (fast, and it refuses lone surrogates);
    what it refuses through the standard parser (which may still raise), made storable."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return _storable(json.loads(bytes(data) if isinstance(data, memoryview) else data))


@dataclass(slots=True)
class Exchange:
    """One request and its response as the tap relayed them: the request's bytes (unless
    oversized) and, of the response, its status, its ``x-`` headers (the router's: all a
    record reads) and the body chunks as they came (with their arrival time since ``t0``).
    A streamed body keeps its head and a bounded tail; a JSON body over the cap is dropped
    (``overflow``). The request's headers are not kept: only the client's ``x-request-id``
    (an API key goes nowhere)."""

    ts: float
    t0: float
    body: bytes | memoryview  # a view of the recorder process's read buffer, while parsed
    client_request_id: str | None = None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    sse: bool = False
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    tail: list[tuple[float, bytes]] = field(default_factory=list)
    kept: int = 0
    tail_bytes: int = 0
    overflow: bool = False
    latency_s: float | None = None
    cut: str | None = None
    # The rest of the request's bytes as they came in pieces, after ``body`` (the proxy
    # hands them on without joining them).
    body_parts: list[bytes] = field(default_factory=list)

    def size(self) -> int:
        """Bytes held (what a backlog of exchanges is bounded by)."""
        return len(self.body) + sum(map(len, self.body_parts)) + self.kept + self.tail_bytes

    def request_body(self) -> bytes | memoryview:
        return b"".join([self.body, *self.body_parts]) if self.body_parts else self.body

    def add(self, t: float, chunk: bytes, head_cap: int, tail_cap: int) -> None:
        if self.overflow:
            return
        if self.kept + len(chunk) <= head_cap:
            self.chunks.append((t, chunk))
            self.kept += len(chunk)
            return
        if not self.sse:
            self.overflow = True
            self.chunks.clear()
            return
        self.tail.append((t, chunk))
        self.tail_bytes += len(chunk)
        while self.tail_bytes > tail_cap and len(self.tail) > 1:
            self.tail_bytes -= len(self.tail.pop(0)[1])


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


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _storable(value: Any) -> Any:
    """A decoded JSON value whose strings the store can hold: a lone surrogate escape
    (``"\\udc80"``, which JSON allows and UTF-8 cannot encode) becomes U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value


def _image(url: str) -> ImageInfo:
    """A data: URL's image described from its header (size) and bytes (identities) without
    decoding pixels; one whose header this cannot read is probed fully."""
    if not url.startswith("data:"):
        return describe_image(url, None).info
    try:
        data = decode_data_url(url)
    except ImageError:
        return describe_image(url, None).info
    size = header_size(data)
    if size is None:
        return describe_image(url, data).info
    return ImageInfo("data", byte_size=len(data), width=size[0], height=size[1],
                     identities=identities(url, data))


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


def request_facts(body: bytes | memoryview, store_text: bool = False) -> RequestFacts:
    facts = RequestFacts()
    try:
        obj = loads(body)
    except BAD_INPUT:
        facts.error = "request body is not JSON"
        return facts
    if not isinstance(obj, dict):
        facts.error = "request body is not a JSON object"
        return facts
    facts.model = _text(obj.get("model"))
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
        for k in headers:
            if k.startswith("x-smg-"):
                self.router_kind = "smg"
                break
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
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            delta = choice.get("delta") or {}
            if (isinstance(delta, dict) and delta.get("content")) or choice.get("finish_reason"):
                return True
    return False


def response_facts(ex: Exchange) -> ResponseFacts:
    """What the response said: its headers, then its JSON body or each SSE event (the time
    to the first content chunk from the arrival time of the chunk that carried it)."""
    facts = ResponseFacts()
    facts.headers(ex.status, ex.headers)
    if ex.sse:
        for part in (ex.chunks, ex.tail):  # a gap between head and tail: its cut lines fail
            _sse_events(facts, part)
    elif not ex.overflow and ex.chunks:
        chunks = ex.chunks
        try:
            facts.chunk(loads(chunks[0][1] if len(chunks) == 1 else
                              b"".join([c for _, c in chunks])))
        except BAD_INPUT:
            pass
    facts.latency_s = ex.latency_s
    if ex.cut is not None:
        facts.error = facts.error or f"stream cut: {ex.cut}"
        facts.error_code = facts.error_code or ex.cut
    return facts


def _sse_events(facts: ResponseFacts, chunks: list[tuple[float, bytes]]) -> None:
    pending = b""
    for t, chunk in chunks:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            _sse_line(facts, line, t)
    _sse_line(facts, pending, chunks[-1][0] if chunks else 0.0)


def _sse_line(facts: ResponseFacts, line: bytes, t: float) -> None:
    line = line.strip()
    if not line.startswith(b"data:"):
        return
    data = line[5:].strip()
    if data == b"[DONE]":
        return
    try:
        obj = loads(data)
    except BAD_INPUT:
        return
    if facts.ttft_s is None and first_content(obj):
        facts.ttft_s = t
    facts.chunk(obj)


def exchange_trace(ex: Exchange, router: str, store_text: bool = False,
                   ) -> tuple[RequestFacts, ResponseFacts, RequestTrace]:
    """The tap's record of one relayed exchange (and the facts it came from, for a layout or
    a fetch of its images)."""
    req = request_facts(ex.request_body(), store_text)
    resp = response_facts(ex)
    return req, resp, to_fragment(req, resp, client_request_id=ex.client_request_id,
                                  ts=ex.ts, router=router)


_RESPONSE_FIELDS = ("status", "worker", "prompt_tokens", "completion_tokens", "cached_tokens",
                    "dp_rank", "error_code", "error", "ttft_s", "latency_s")


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
    for name in _RESPONSE_FIELDS:
        put(t, name, getattr(resp, name), LABEL)
    if req.images:
        t.images = req.images
        t.provenance["images"] = LABEL
    t.predictions = resp.predictions
    for d in t.predictions:
        d.request_id = d.request_id or rid
    t.router_kind = resp.router_kind
    if req.parts:  # the part layout; a full token layout replaces it with --layout-model
        t.expected_layout = ExpectedLayout(parts=[LayoutPart(**p) for p in req.parts],
                                           text=req.text if req.store_text else None)
        t.provenance["expected_layout"] = LABEL
    return t
