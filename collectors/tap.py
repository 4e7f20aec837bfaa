"""``mmlens tap``: a streaming reverse proxy in front of a router that passes requests and
responses through unchanged and hands what it relayed to a recorder (``tap_record``).

- The request path reads headers only: the body is forwarded as read, each response chunk
  (SSE included) is written to the client as it comes; compressed bodies stay compressed;
  the router's own errors (4xx/5xx, bodies, headers) reach the client as they are. Nothing
  is parsed, decoded or hashed here: the exchange's bytes are kept (bounded) and submitted
  once the response has been relayed; parsing and the store write happen on the
  recorder's thread.
- Bounded memory per request: a request body over ``max_record_body`` is streamed on without
  being kept; of a JSON response at most ``max_parse`` bytes, of a stream its head and a
  bounded tail. Upstream down: 502 with a JSON error; a client gone mid-stream: the upstream
  stream is closed and the exchange submitted as such.
- ``dynamo_worker_id``: the one option that touches bodies. Dynamo 1.6.1 names the worker
  (``nvext.worker_id``) and its timing only when the request asks with
  ``nvext.extra_fields``; the tap adds what is missing and removes it from the answer again
  (``mmlens.ingest.nvext_fields``), so the client gets what it asked for.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from mmlens.ingest.nvext_fields import NvextRewrite, ask_for_fields
from mmlens.ingest.observed import is_request_path
from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                        "proxy-authorization", "te", "trailer", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length"})
MAX_RECORD_BODY = 32 << 20
MAX_PARSE = 8 << 20
SSE_HEAD = 256 << 10  # of a stream: its first bytes (the first content chunk's time) ...
SSE_TAIL = 256 << 10  # ... and its last (usage, the finish chunk's timing)
# Headers aiohttp's client would add when the client did not send them: the router must see
# the client's request, not the tap's (an added Accept-Encoding could get the client a
# compressed answer it never asked for).
NO_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

Submit = Callable[[Exchange], None]


class Tap:
    def __init__(self, upstream: str, submit: Submit | None, sample: float = 1.0,
                 max_record_body: int = MAX_RECORD_BODY, max_parse: int = MAX_PARSE,
                 health: CollectorHealth | None = None, dynamo_worker_id: bool = False,
                 ) -> None:
        self.upstream = upstream.rstrip("/")
        self.submit = submit
        self.sample = sample
        self.max_record_body = max_record_body
        self.max_parse = max_parse
        self.health = health or CollectorHealth("tap", self.upstream)
        self.dynamo_worker_id = dynamo_worker_id
        self.session: aiohttp.ClientSession | None = None

    async def start_session(self) -> None:
        self.session = aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=NO_AUTO_HEADERS,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(lambda _: self.start_session())
        app.on_cleanup.append(lambda _: self.close())
        return app

    def _count(self, key: str) -> None:
        self.health.count(key)

    def _records(self, request: web.Request) -> bool:
        return (self.submit is not None and request.method == "POST"
                and is_request_path(request.path)
                and (self.sample >= 1.0 or random.random() < self.sample))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0, ts = time.perf_counter(), time.time()
        self._count("requests")
        recording = self._records(request)
        body, rest = await _read_body(request, self.max_record_body)
        if rest is not None and recording:
            recording = False
            self._count("oversized_not_recorded")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        rewrite = None
        if self.dynamo_worker_id and rest is None and is_request_path(request.path):
            asked = ask_for_fields(body)
            if asked is not None:
                body, rewrite = asked.body, asked.rewrite
        assert self.session is not None
        try:
            up = await self.session.request(
                request.method, self.upstream + request.path_qs, headers=headers,
                data=body if rest is None else _chain(body, rest), allow_redirects=False)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._count("upstream_errors")
            self.health.error("upstream", f"{type(exc).__name__}: {exc}", time.time())
            return web.json_response({"error": {
                "message": f"mmlens tap: upstream {self.upstream} unreachable: {exc}",
                "type": "upstream_unreachable", "code": "upstream_unreachable"}}, status=502)
        ex = Exchange(ts, t0, body, request.headers.get("x-request-id")) if recording else None
        return await self._relay(request, up, ex, rewrite)

    async def _relay(self, request: web.Request, up: aiohttp.ClientResponse,
                     ex: Exchange | None, rewrite: NvextRewrite | None) -> web.StreamResponse:
        out = web.StreamResponse(status=up.status, reason=up.reason)
        chunked = "chunked" in up.headers.get("transfer-encoding", "")
        for k, v in up.headers.items():
            lk = k.lower()
            if lk not in HOP_BY_HOP or (lk == "content-length" and not chunked
                                        and rewrite is None):
                out.headers.add(k, v)
        sse = "text/event-stream" in up.headers.get("content-type", "")
        if rewrite is not None:
            rewrite.sse = sse
        if ex is not None:
            ex.status, ex.sse = up.status, sse
            ex.headers = {k.lower(): v for k, v in up.headers.items()}
        head, tail = (SSE_HEAD, SSE_TAIL) if sse else (self.max_parse, 0)
        cut = None
        try:
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                if ex is not None:
                    ex.add(time.perf_counter() - ex.t0, chunk, head, tail)
                if rewrite is not None:
                    chunk = rewrite.feed(chunk)
                    if not chunk:
                        continue
                try:
                    await out.write(chunk)
                except ConnectionResetError:
                    cut = "client_disconnected"  # the upstream stream is closed below
                    break
            if cut is None:
                if rewrite is not None and (rest := rewrite.finish()):
                    await out.write(rest)
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
        if ex is not None and self.submit is not None:
            ex.latency_s, ex.cut = time.perf_counter() - ex.t0, cut
            self.submit(ex)
        return out


async def _read_body(request: web.Request, limit: int,
                     ) -> tuple[bytes, aiohttp.StreamReader | None]:
    """The body, or its first ``limit`` bytes plus the stream it continues on."""
    if not request.body_exists:
        return b"", None
    if request.content_length is not None and request.content_length <= limit:
        return await request.read(), None
    buf = bytearray()
    while len(buf) <= limit:
        chunk = await request.content.readany()
        if not chunk:
            return bytes(buf), None
        buf += chunk
    return bytes(buf), request.content


async def _chain(prefix: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in rest.iter_any():
        yield chunk
