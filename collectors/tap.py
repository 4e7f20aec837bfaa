"""``mmlens tap``: a streaming reverse proxy in front of a router that records what each
request and response said (``mmlens.ingest.tap_parse``) while passing both through unchanged.

- Bytes pass as they come: request bodies are forwarded as read, response chunks (SSE
  included) are written to the client as soon as the router sends them; compressed bodies
  stay compressed; the router's own errors (4xx/5xx, bodies, headers) reach the client as
  they are.
- Bounded memory per request: a request body over ``max_record_body`` is streamed on without
  being recorded; at most ``max_parse`` bytes of a JSON response are kept for parsing; SSE is
  parsed line by line.
- Records go to a writer thread through a bounded backlog (over it, records are dropped and
  counted; traffic is never held up). Upstream down: 502 with a JSON error; a client gone
  mid-stream: the upstream stream is closed and the request recorded as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web
from mmlens.collectors.tap_images import ImageFetcher

from mmlens.ingest.observed import is_request_path
from mmlens.ingest.tap_parse import (
    RequestFacts,
    ResponseFacts,
    first_content,
    request_facts,
    to_fragment,
)
from mmlens.layout.sent import SentImage
from mmlens.records import CollectorHealth, RequestTrace

log = logging.getLogger("mmlens.tap")

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length"}
MAX_RECORD_BODY = 32 << 20
MAX_PARSE = 8 << 20
MAX_SSE_LINE = 1 << 20

LayoutFn = Callable[[RequestFacts, RequestTrace], None]


class Recorder:
    """Hands records to ``write`` (a batch at a time) on its own thread."""

    def __init__(self, write: Callable[[list[RequestTrace]], object], health: CollectorHealth,
                 max_backlog: int = 10_000, interval_s: float = 0.2) -> None:
        self.write = write
        self.health = health
        self.max_backlog = max_backlog
        self.interval_s = interval_s
        self._q: queue.Queue[RequestTrace] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tap-writer", daemon=True)
        self._thread.start()

    def submit(self, t: RequestTrace) -> None:
        if self._q.qsize() >= self.max_backlog:
            self.health.count("dropped_backlog")
            return
        self._q.put(t)

    def _drain(self) -> None:
        batch: list[RequestTrace] = []
        while len(batch) < 2000:
            try:
                batch.append(self._q.get_nowait())
            except queue.Empty:
                break
        if batch:
            try:
                self.write(batch)
                self.health.count("recorded", len(batch))
                self.health.ok(time.time())
            except Exception as exc:  # the store failing must not stop the proxy
                log.exception("tap: writing records failed")
                self.health.error("store", f"{type(exc).__name__}: {exc}", time.time())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._drain()
        while not self._q.empty():
            self._drain()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)


class _BodyReader:
    """The response body as the tap sees it go by: SSE line by line, JSON up to a cap."""

    def __init__(self, facts: ResponseFacts, sse: bool, t0: float, max_parse: int) -> None:
        self.facts, self.sse, self.t0, self.max_parse = facts, sse, t0, max_parse
        self.buf = bytearray()
        self.overflow = False

    def feed(self, chunk: bytes) -> None:
        if self.overflow:
            return
        self.buf += chunk
        if not self.sse:
            self.overflow = len(self.buf) > self.max_parse
            return
        while (nl := self.buf.find(b"\n")) >= 0:
            line = bytes(self.buf[:nl]).strip()
            del self.buf[:nl + 1]
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        if len(self.buf) > MAX_SSE_LINE:
            self.overflow = True

    def _event(self, data: bytes) -> None:
        if data == b"[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if self.facts.ttft_s is None and first_content(obj):
            self.facts.ttft_s = time.perf_counter() - self.t0
        self.facts.chunk(obj)

    def finish(self) -> None:
        if not self.sse and not self.overflow and self.buf:
            try:
                self.facts.chunk(json.loads(bytes(self.buf)))
            except ValueError:
                pass


class Tap:
    def __init__(self, upstream: str, record: Callable[[RequestTrace], None] | None,
                 sample: float = 1.0, store_text: bool = False,
                 max_record_body: int = MAX_RECORD_BODY, max_parse: int = MAX_PARSE,
                 layout: LayoutFn | None = None, health: CollectorHealth | None = None,
                 fetcher: ImageFetcher | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.record = record
        self.sample = sample
        self.store_text = store_text
        self.max_record_body = max_record_body
        self.max_parse = max_parse
        self.layout = layout
        self.health = health or CollectorHealth("tap", self.upstream)
        self.fetcher = fetcher
        if fetcher is not None:
            fetcher.health = self.health  # its outcomes are the tap's
        self.session: aiohttp.ClientSession | None = None
        self.fetch_session: aiohttp.ClientSession | None = None  # images: decompressed
        self._tasks: set[asyncio.Task[None]] = set()

    async def start_session(self) -> None:
        self.session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
        if self.fetcher is not None:
            self.fetch_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=32, ttl_dns_cache=300))

    async def close(self) -> None:
        if self._tasks:  # records still fetching their images: give them their deadline
            await asyncio.wait(set(self._tasks), timeout=10.0)
        for session in (self.session, self.fetch_session):
            if session is not None:
                await session.close()
        self.session = self.fetch_session = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda _: self.start_session())
        app.on_cleanup.append(lambda _: self.close())
        return app

    def _count(self, key: str) -> None:
        self.health.count(key)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0, ts = time.perf_counter(), time.time()
        self._count("requests")
        recording = (self.record is not None and request.method == "POST"
                     and is_request_path(request.path) and random.random() < self.sample)
        prefix, rest = await self._read_body(request, self.max_record_body)
        if rest is not None and recording:
            recording = False
            self._count("oversized_not_recorded")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        data: Any = prefix if rest is None else _chain(prefix, rest)
        assert self.session is not None
        try:
            up = await self.session.request(request.method, self.upstream + request.path_qs,
                                            headers=headers, data=data, allow_redirects=False)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._count("upstream_errors")
            self.health.error("upstream", f"{type(exc).__name__}: {exc}", time.time())
            return web.json_response({"error": {
                "message": f"mmlens tap: upstream {self.upstream} unreachable: {exc}",
                "type": "upstream_unreachable", "code": "upstream_unreachable"}}, status=502)
        req_facts = request_facts(prefix, self.store_text) if recording else None
        return await self._relay(request, up, t0, ts, req_facts)

    async def _read_body(self, request: web.Request, limit: int,
                         ) -> tuple[bytes, aiohttp.StreamReader | None]:
        """The body, or its first ``limit`` bytes plus the stream it continues on."""
        if not request.body_exists:
            return b"", None
        buf = bytearray()
        while len(buf) <= limit:
            chunk = await request.content.readany()
            if not chunk:
                return bytes(buf), None
            buf += chunk
        return bytes(buf), request.content

    async def _relay(self, request: web.Request, up: aiohttp.ClientResponse, t0: float,
                     ts: float, req_facts: RequestFacts | None) -> web.StreamResponse:
        facts = ResponseFacts()
        out = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in up.headers.items():
            if k.lower() not in HOP_BY_HOP or (k.lower() == "content-length"
                                               and "chunked" not in up.headers.get(
                                                   "transfer-encoding", "")):
                out.headers.add(k, v)
        sse = "text/event-stream" in up.headers.get("content-type", "")
        reader = _BodyReader(facts, sse, t0, self.max_parse) if req_facts else None
        if req_facts is not None:
            facts.headers(up.status, {k.lower(): v for k, v in up.headers.items()})
        cut = None
        try:
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                if reader is not None:
                    reader.feed(chunk)
                try:
                    await out.write(chunk)
                except ConnectionResetError:
                    cut = "client_disconnected"  # the upstream stream is closed below
                    break
            if cut is None:
                await out.write_eof()
        except ConnectionResetError:
            cut = "client_disconnected"
        except (aiohttp.ClientError, TimeoutError):
            cut = "upstream_broken"
        finally:
            if cut:
                up.close()
            else:
                up.release()
        if cut is not None:
            self._count(cut)
            facts.error = facts.error or f"stream cut: {cut}"
            facts.error_code = facts.error_code or cut
        if req_facts is not None and self.fetcher is not None and req_facts.http_images():
            # Off the request's path: a keep-alive client's next request must not wait.
            task = asyncio.create_task(self._fetch_then_finish(
                req_facts, reader, facts, request, t0, ts))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._finish(req_facts, reader, facts, request, t0, ts)
        return out

    async def _fetch_then_finish(self, req: RequestFacts, reader: _BodyReader | None,
                                 facts: ResponseFacts, request: web.Request, t0: float,
                                 ts: float) -> None:
        """The request's http(s) images fetched, then recorded (an image that could not be
        fetched keeps its size unknown)."""
        assert self.fetcher is not None and self.fetch_session is not None
        latency = time.perf_counter() - t0
        todo = req.http_images()
        got = await asyncio.gather(*(self.fetcher.describe(self.fetch_session, url)
                                     for _, url in todo), return_exceptions=True)
        for (i, _), sent in zip(todo, got, strict=True):
            if isinstance(sent, SentImage):
                req.add_fetched(i, sent)
        self._finish(req, reader, facts, request, t0, ts, latency)

    def _finish(self, req_facts: RequestFacts | None, reader: _BodyReader | None,
                facts: ResponseFacts, request: web.Request, t0: float, ts: float,
                latency_s: float | None = None) -> None:
        if req_facts is None or reader is None or self.record is None:
            return
        reader.finish()
        facts.latency_s = time.perf_counter() - t0 if latency_s is None else latency_s
        t = to_fragment(req_facts, facts, client_request_id=request.headers.get("x-request-id"),
                        ts=ts, router=self.upstream)
        if self.layout is not None:
            with contextlib.suppress(Exception):  # a layout the core refuses stays unknown
                self.layout(req_facts, t)
        self.record(t)


async def _chain(prefix: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in rest.iter_any():
        yield chunk
