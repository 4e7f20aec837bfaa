"""``mmlens tap``: a streaming HTTP/1.1 reverse proxy in front of a router that passes requests
and responses through unchanged and hands what it relayed to a recorder (``tap_record``).

- Bytes pass as they come, on asyncio protocols (llhttp through httptools finds where each
  message ends): the request's head is rebuilt only to name the upstream host, its body
  goes on as framed; the response — status line, headers, framing, SSE chunks, compressed
  bodies, the router's own errors — is written to the client byte for byte as it arrives.
  Nothing is decoded, hashed or parsed as JSON here: the exchange's bytes are kept (bounded)
  and submitted once the response is relayed; the recorder does the rest on its thread.
- Bounded memory: a request body over ``max_record_body`` is streamed on without being
  kept; of a JSON response at most ``max_parse`` bytes, of a stream its head and a bounded
  tail. Reading pauses on one side while the other cannot take more.
- Upstream down: 502 with a JSON error; a client gone mid-stream: the upstream connection is
  closed and the exchange submitted as such; the router cutting its answer: the client's
  connection is closed the same way.
- ``dynamo_worker_id``: the one option that touches bodies. Dynamo 1.6.1 names the worker
  (``nvext.worker_id``) and its timing only when the request asks with
  ``nvext.extra_fields``; the tap adds what is missing and removes it from the answer again
  (``mmlens.ingest.nvext_fields``), so the client gets what it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httptools

from mmlens.ingest.nvext_fields import NvextRewrite, ask_for_fields
from mmlens.ingest.observed import is_request_path
from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth

MAX_RECORD_BODY = 32 << 20
MAX_PARSE = 8 << 20
SSE_HEAD = 256 << 10  # of a stream: its first bytes (the first content chunk's time) ...
SSE_TAIL = 256 << 10  # ... and its last (usage, the finish chunk's timing)
HIGH_WATER = 1 << 20  # bytes a side may have buffered before the other stops reading
CONNECT_TIMEOUT_S = 10.0
IDLE_UPSTREAMS = 256
IDLE_S = 4.0  # routers close idle keep-alive connections after a while (hyper, aiohttp)

READ_BYTES = 1 << 20  # what one read of a client connection takes at most

Submit = Callable[[Exchange], None]
# The lengths of the request header names the tap reads: host, x-request-id,
# transfer-encoding, connection.
_WATCHED_LENGTHS = frozenset((4, 12, 17, 10))


class Tap:
    def __init__(self, upstream: str, submit: Submit | None, sample: float = 1.0,
                 max_record_body: int = MAX_RECORD_BODY, max_parse: int = MAX_PARSE,
                 health: CollectorHealth | None = None, dynamo_worker_id: bool = False,
                 ) -> None:
        self.upstream = upstream.rstrip("/")
        parts = urlsplit(self.upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the tap's upstream must be an http:// URL, not {upstream!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.host_header = parts.netloc.encode()
        self.base_path = parts.path.rstrip("/").encode()
        self.submit = submit
        self.sample = sample
        self.max_record_body = max_record_body
        self.max_parse = max_parse
        self.health = health or CollectorHealth("tap", self.upstream)
        self.dynamo_worker_id = dynamo_worker_id
        self._idle: deque[_Upstream] = deque()
        self._server: asyncio.Server | None = None
        self._clients: set[_Client] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        # Where every client connection reads (the tap's one loop reads one at a time).
        self.read_view = memoryview(bytearray(READ_BYTES))

    async def serve(self, host: str, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, port,
                                                reuse_address=True)
        return self._server

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._clients):
            c.transport.close()
        while self._idle:
            self._idle.pop().transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def _count(self, key: str) -> None:
        self.health.count(key)

    def records(self, method: bytes, path: str) -> bool:
        return (self.submit is not None and method == b"POST" and is_request_path(path)
                and (self.sample >= 1.0 or random.random() < self.sample))

    def idle_conn(self) -> _Upstream | None:
        now = time.monotonic()
        while self._idle:
            up = self._idle.pop()
            # An old idle connection may be closed by the router as it is reused.
            if not up.transport.is_closing() and now - up.idle_since < IDLE_S:
                return up
            up.transport.close()
        return None

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def new_conn(self) -> _Upstream:
        loop = asyncio.get_running_loop()
        _, up = await asyncio.wait_for(loop.create_connection(_Upstream, self.host, self.port),
                                       CONNECT_TIMEOUT_S)
        return up

    def release(self, up: _Upstream) -> None:
        if up.transport.is_closing() or len(self._idle) >= IDLE_UPSTREAMS:
            up.transport.close()
        else:
            up.ctx = None
            up.idle_since = time.monotonic()
            self._idle.append(up)


class _Request:
    """One request of a client connection: parsed as it arrives, relayed once it is first in
    line (a pipelining client's next request waits for the answer before it)."""

    __slots__ = ("body", "body_bytes", "buffer_body", "chunked", "client", "close", "complete",
                 "done", "ex", "head_ready", "held", "held_bytes", "lines", "method", "out",
                 "out_bytes", "request_id", "rewrite", "started", "t0", "ts", "up", "url")

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.t0 = time.perf_counter()
        self.ts = time.time()
        self.url = b""
        # The head's header lines as they came, the Host line naming the upstream.
        self.lines: list[bytes] = []
        self.method = b""
        self.out: list[bytes] = []  # raw bytes waiting for the upstream connection
        self.out_bytes = 0
        self.complete = False
        self.started = False
        self.up: _Upstream | None = None
        self.body: list[bytes] | None = None  # kept for the record (None: not recording)
        self.body_bytes = 0
        self.request_id: str | None = None
        self.chunked = False  # the client frames the body in chunks (and so does the tap)
        self.close = False  # the client asked to close the connection after this one
        self.rewrite: NvextRewrite | None = None
        self.buffer_body = False  # the rewrite needs the whole body first
        self.held: list[bytes] = []
        self.held_bytes = 0
        self.head_ready = False
        self.ex: Exchange | None = None
        self.done = False

    def client_gone(self) -> None:
        self.done = True
        if self.up is not None:
            self.up.abort("client_disconnected")

    def head(self) -> bytes:
        return b"%s %s%s HTTP/1.1\r\n%s\r\n\r\n" % (
            self.method, self.client.tap.base_path, self.url, b"\r\n".join(self.lines))


class _Client(asyncio.BufferedProtocol):
    """One client connection: requests parsed with llhttp, relayed one at a time. Reads go
    into one buffer that every connection of the tap shares (llhttp's callbacks copy out
    what they yield before the next read), up to ``READ_BYTES`` at once: a 2 MB body in two reads,
    not in the loop's eight of 256 KB, each copied once more into a bytes object."""

    def __init__(self, tap: Tap) -> None:
        self.tap = tap
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Request] = deque()
        self.cur: _Request | None = None  # the one being parsed
        self.transport: asyncio.Transport
        self.closed = False
        self.paused_up: _Upstream | None = None
        # While llhttp parses one read, what it yields for the upstream is collected and
        # written once after it: a request's head and body in one write, not one each.
        self.feeding = False

    # --- transport ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(HIGH_WATER)
        self.tap._clients.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.tap._clients.discard(self)
        for req in self.queue:
            if not req.done:
                req.client_gone()
        self.queue.clear()

    def pause_writing(self) -> None:  # a slow client: stop reading the router
        if self.queue and self.queue[0].up is not None:
            self.paused_up = self.queue[0].up
            self.paused_up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.paused_up is not None:
            with contextlib.suppress(Exception):
                self.paused_up.transport.resume_reading()
            self.paused_up = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.tap.read_view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.tap.read_view[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(501, "mmlens tap: protocol upgrades are not proxied")
        except httptools.HttpParserError:
            self._fail(400, "mmlens tap: malformed HTTP request")
        finally:
            self.feeding = False
        req = self.queue[0] if self.queue else None
        if req is not None and req.started and req.up is not None and req.out:
            req.up.flush_request(req)

    def _fail(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "bad_request"}}).encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n"
                             % (status, b"Bad Request" if status == 400 else b"Error",
                                len(body)) + body)
        self.transport.close()

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        self.cur = _Request(self)
        self.queue.append(self.cur)
        if len(self.queue) > 1:  # pipelined: read on once the earlier ones are answered
            self.transport.pause_reading()

    def on_url(self, url: bytes) -> None:
        assert self.cur is not None
        self.cur.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.cur
        assert req is not None
        if len(name) in _WATCHED_LENGTHS:  # (most headers are none of these)
            low = name.lower()
            if low == b"host":
                value = self.tap.host_header
            elif low == b"x-request-id":
                req.request_id = value.decode("latin-1")
            elif low == b"transfer-encoding":
                req.chunked = req.chunked or b"chunked" in value.lower()
            elif low == b"connection":
                req.close = req.close or b"close" in value.lower()
        req.lines.append(name + b": " + value)

    def on_headers_complete(self) -> None:
        req, tap = self.cur, self.tap
        assert req is not None
        req.method = self.parser.get_method()
        tap._count("requests")
        path = req.url.decode("latin-1").split("?", 1)[0]
        if tap.records(req.method, path):
            req.body = []
        if tap.dynamo_worker_id and req.method == b"POST" and is_request_path(path):
            req.buffer_body = True
        if not req.buffer_body:
            req.out.append(req.head())
        req.head_ready = True
        if req is self.queue[0]:
            self._start(req)

    def on_body(self, body: bytes) -> None:
        req = self.cur
        assert req is not None
        if req.buffer_body:  # the rewrite needs the whole body
            req.held.append(body)
            req.held_bytes += len(body)
            if req.held_bytes > self.tap.max_record_body:
                self._stop_buffering(req)
            return
        if req.body is not None:
            req.body_bytes += len(body)
            if req.body_bytes > self.tap.max_record_body:
                req.body = None
                self.tap._count("oversized_not_recorded")
            else:
                req.body.append(body)
        self._send(req, body, framed=True)

    def on_message_complete(self) -> None:
        req = self.cur
        assert req is not None
        req.complete = True
        if req.buffer_body:
            self._rewrite_request(req)
        elif req.chunked:
            self._send(req, b"0\r\n\r\n")
        if req.started and req.up is not None and not self.feeding:
            req.up.flush_request(req)

    # --- relaying the request ---
    def _send(self, req: _Request, data: bytes, framed: bool = False) -> None:
        if framed and req.chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        if req.started and req.up is not None:
            if self.feeding:  # written with the rest of this read
                req.out.append(data)
            else:
                req.up.transport.write(data)
        else:
            req.out.append(data)
            req.out_bytes += len(data)
            if req.out_bytes > HIGH_WATER:
                self.transport.pause_reading()

    def _stop_buffering(self, req: _Request) -> None:
        """A body too big to rewrite: relayed as it came, not recorded."""
        req.buffer_body = False
        kept, req.held = b"".join(req.held), []
        if req.body is not None:
            req.body = None
            self.tap._count("oversized_not_recorded")
        req.out.append(req.head())
        self._send(req, kept, framed=True)

    def _rewrite_request(self, req: _Request) -> None:
        body, req.held = b"".join(req.held), []
        asked = ask_for_fields(body)
        if asked is not None:
            body, req.rewrite = asked.body, asked.rewrite
        req.lines = [line for line in req.lines if line.split(b":", 1)[0].strip().lower()
                     not in (b"content-length", b"transfer-encoding")]
        req.lines.append(b"Content-Length: %d" % len(body))
        req.chunked = req.buffer_body = False
        req.out.append(req.head())
        req.out.append(body)
        if req.body is not None:
            req.body = [body]

    def _start(self, req: _Request) -> None:
        up = self.tap.idle_conn()
        if up is None:
            self.tap.spawn(self._connect(req))
        else:
            self._go(req, up)

    async def _connect(self, req: _Request) -> None:
        tap = self.tap
        try:
            up = await tap.new_conn()
        except (OSError, TimeoutError) as exc:
            tap._count("upstream_errors")
            tap.health.error("upstream", f"{type(exc).__name__}: {exc}", time.time())
            self._unreachable(req, exc)
            return
        self._go(req, up)

    def _go(self, req: _Request, up: _Upstream) -> None:
        if self.closed:
            self.tap.release(up)
            return
        req.up, up.ctx = up, req
        req.started = True
        if req.body is not None:
            req.ex = Exchange(req.ts, req.t0, b"", req.request_id)
        if not self.feeding:
            up.flush_request(req)
        if len(self.queue) <= 1:
            self.transport.resume_reading()  # paused while the body waited for it

    def _unreachable(self, req: _Request, exc: BaseException) -> None:
        body = json.dumps({"error": {
            "message": f"mmlens tap: upstream {self.tap.upstream} unreachable: {exc}",
            "type": "upstream_unreachable", "code": "upstream_unreachable"}}).encode()
        self.transport.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
        self.finished(req, keep_alive=req.complete)

    def finished(self, req: _Request, keep_alive: bool) -> None:
        """``req``'s answer is relayed: the next pipelined request may go."""
        req.done = True
        if self.queue and self.queue[0] is req:
            self.queue.popleft()
        if not keep_alive:
            self.transport.close()
            return
        if self.queue:
            nxt = self.queue[0]
            if nxt.head_ready:
                self._start(nxt)
        self.transport.resume_reading()


class _Upstream(asyncio.Protocol):
    """One connection to the router, reused for the next request when both sides allow."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport
        self.ctx: _Request | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head_done = False
        self.status = 0
        self.resp_headers: list[tuple[bytes, bytes]] = []
        self.length_known = False
        self.sse = False
        self.broken = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(HIGH_WATER)

    def flush_request(self, req: _Request) -> None:
        if req.out:
            self.transport.writelines(req.out)
            req.out.clear()
            req.out_bytes = 0

    def pause_writing(self) -> None:  # the router reads slower than the client sends
        if self.ctx is not None:
            self.ctx.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.ctx is not None:
            self.ctx.client.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        req = self.ctx
        if req is None:  # an idle connection speaking: it is not reusable
            self.transport.close()
            return
        raw = req.rewrite is None
        if raw:
            req.client.transport.write(data)
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.broken = True  # relayed as it came; the connection ends with it

    def on_message_begin(self) -> None:
        self.head_done = False
        self.resp_headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        req = self.ctx
        assert req is not None
        self.status = self.parser.get_status_code()
        self.head_done = True
        sse = length_known = False
        # Of the headers, the router's own (``x-``) are what a record reads: the rest are
        # neither decoded nor handed over.
        mine: dict[str, str] = {}
        for k, v in self.resp_headers:
            low = k.lower()
            if low.startswith(b"x-"):
                mine[low.decode("latin-1")] = v.decode("latin-1")
            elif low == b"content-type":
                sse = b"text/event-stream" in v
            elif low == b"content-length":
                length_known = True
            elif low == b"transfer-encoding":
                length_known = length_known or b"chunked" in v.lower()
        self.sse, self.length_known = sse, length_known
        if 100 <= self.status < 200:
            return
        if req.ex is not None:
            ex = req.ex
            ex.status, ex.sse, ex.headers = self.status, sse, mine
        if req.rewrite is not None:
            req.rewrite.sse = self.sse
            head = [b"HTTP/1.1 %d %s" % (self.status, _reason(self.status))]
            head += [k + b": " + v for k, v in self.resp_headers
                     if k.lower() not in (b"content-length", b"transfer-encoding")]
            head.append(b"transfer-encoding: chunked")
            req.client.transport.write(b"\r\n".join(head) + b"\r\n\r\n")
        if req.method == b"HEAD" or self.status in (204, 304):
            self._complete()

    def on_body(self, body: bytes) -> None:
        req = self.ctx
        if req is None or 100 <= self.status < 200:
            return
        if req.ex is not None:
            head, tail = (SSE_HEAD, SSE_TAIL) if self.sse else (req.client.tap.max_parse, 0)
            req.ex.add(time.perf_counter() - req.t0, body, head, tail)
        if req.rewrite is not None:
            out = req.rewrite.feed(body)
            if out:
                req.client.transport.write(b"%x\r\n%s\r\n" % (len(out), out))

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200 or self.ctx is None:
            return  # an interim answer: the real one follows
        self._complete()

    def _complete(self, cut: str | None = None) -> None:
        req = self.ctx
        if req is None:
            return
        self.ctx = None
        client, tap = req.client, req.client.tap
        if req.rewrite is not None and cut is None:
            rest = req.rewrite.finish()
            if rest:
                client.transport.write(b"%x\r\n%s\r\n" % (len(rest), rest))
            client.transport.write(b"0\r\n\r\n")
        if cut is not None:
            tap._count(cut)
        if req.ex is not None and req.body is not None and tap.submit is not None:
            req.ex.body_parts = req.body  # joined by the recorder
            req.ex.latency_s, req.ex.cut = time.perf_counter() - req.t0, cut
            tap.submit(req.ex)
            req.ex = None
        reusable = cut is None and not self.broken and self.parser.should_keep_alive() \
            and req.complete
        if reusable:
            self.parser = httptools.HttpResponseParser(self)
            tap.release(self)
        else:
            self.transport.close()
        if not req.done:
            client.finished(req, keep_alive=cut is None and self.length_known and
                            not req.close)

    def abort(self, cut: str) -> None:
        self._complete(cut)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        req = self.ctx
        if req is None:
            return
        if self.head_done and not self.length_known and not self.broken:
            self._complete()  # a body that ends with the connection: complete, as sent
            return
        if not self.head_done and not req.client.closed and req.client.transport and \
                not self.broken and not _answered(req):
            self.ctx = None
            req.client.tap._count("upstream_errors")
            req.client._unreachable(req, exc or ConnectionResetError("connection closed"))
            return
        self._complete("upstream_broken")


def _answered(req: _Request) -> bool:
    return req.ex is not None and req.ex.status != 0


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"
