"""A built-in OTLP trace receiver: gRPC (``TraceService/Export``) and HTTP (``POST /v1/traces``,
protobuf or JSON, gzip, deflate or uncompressed, content-length or chunked), on 127.0.0.1 by
default.

Routers export to it directly (SMG ``--enable-trace --otlp-traces-endpoint``, Dynamo's
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or an OpenTelemetry Collector adds it as an ``otlp``
exporter. Each decoded batch goes to ``on_spans``; bodies that do not decode, oversized
bodies and wrong media types are answered with an error and counted, never raised.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Container
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import msgspec
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mmlens.ingest.otlp import OtlpError, decode_export, span_count, spans_of
from mmlens.ingest.otlp_json import JsonExport, decode_export_json
from mmlens.records import CollectorHealth, SpanRecord

log = logging.getLogger("mmlens.otlp")

HOST = "127.0.0.1"
DISCARD_MAX, DISCARD_S = 256 << 20, 5.0  # what of a refused body is read to let the 413 through
MAX_BODY = 16 << 20  # the OpenTelemetry Collector's default max request size is 4 MiB…16 MiB
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_MEDIA_TYPES = {PROTOBUF: "pb", JSON: "json"}

SpanSink = Callable[[list[SpanRecord]], None]


class OtlpReceiver:
    """``grpc_port``/``http_port`` 0 picks a free port, None leaves that listener off.
    ``dump_dir`` keeps every raw body received (for captures). With ``wanted`` (span names),
    only those spans and spans carrying events are decoded and handed on; all are counted."""

    def __init__(self, on_spans: SpanSink, host: str = HOST, grpc_port: int | None = 4317,
                 http_port: int | None = 4318, max_body: int = MAX_BODY,
                 dump_dir: Path | None = None, wanted: Container[str] | None = None) -> None:
        self.on_spans = on_spans
        self.wanted = wanted
        self.host = host
        self.max_body = max_body
        self.dump_dir = dump_dir
        self.health = CollectorHealth("otlp", f"{host}")
        self._lock = threading.Lock()
        self._dumped = 0
        self._grpc_port, self._http_port = grpc_port, http_port
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None

    # --- one export, whatever the transport ----------------------------------------------

    def accept(self, body: bytes, transport: str, fmt: str = "pb") -> str | None:
        """Decode and hand on one export body (``fmt`` "pb" or "json"); the error text when
        it was refused."""
        self._received(transport)
        if len(body) > self.max_body:  # gRPC's (HTTP refuses it before: 413)
            message = f"export of {len(body)} bytes over {self.max_body}"
            self.refuse("too_large", message)
            return message
        if self.dump_dir is not None:
            self._dump(body, transport, fmt)
        try:
            req = decode_export_json(body) if fmt == "json" else decode_export(body)
        except OtlpError as exc:
            with self._lock:
                self.health.error("malformed_export", str(exc), time.time())
            return str(exc)
        self.accept_message(req)
        return None

    def accept_message(self, req: ExportTraceServiceRequest | JsonExport) -> None:
        now = time.time()
        received = span_count(req)
        spans = spans_of(req, self.wanted)
        try:
            self.on_spans(spans)
        except Exception as exc:  # a failing sink must not take the receiver down
            log.exception("span sink failed")
            with self._lock:
                self.health.error("sink", f"{type(exc).__name__}: {exc}", now)
            return
        with self._lock:
            self.health.count("spans", received)
            self.health.count("spans_read", len(spans))
            self.health.ok(now)

    def _received(self, transport: str) -> None:
        with self._lock:
            self.health.count(f"{transport}_requests")

    def refuse(self, kind: str, message: str) -> None:
        with self._lock:
            self.health.error(kind, message, time.time())

    def _dump(self, body: bytes, transport: str, fmt: str) -> None:
        assert self.dump_dir is not None
        with self._lock:
            self._dumped += 1
            n = self._dumped
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        (self.dump_dir / f"export-{n:04d}-{transport}.{fmt}").write_bytes(body)

    # --- listeners -------------------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        try:
            if self._grpc_port is not None:
                self._start_grpc(self._grpc_port)
            if self._http_port is not None:
                self._start_http(self._http_port)
        except BaseException:
            self.stop()
            raise
        self.health.target = self.endpoints()
        return self

    def endpoints(self) -> str:
        parts = []
        if self.grpc_port is not None:
            parts.append(f"grpc {self.host}:{self.grpc_port}")
        if self.http_port is not None:
            parts.append(f"http {self.host}:{self.http_port}")
        return ", ".join(parts)

    def _start_grpc(self, port: int) -> None:
        # grpc's own limit answers RESOURCE_EXHAUSTED, uncounted, which the Python exporter
        # retries for its whole timeout: bodies up to 4× the limit reach ``accept`` instead.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[
            ("grpc.max_receive_message_length", 4 * self.max_body)])
        server.add_generic_rpc_handlers((_grpc_handler(self),))
        bound = server.add_insecure_port(f"{self.host}:{port}")
        if bound == 0:
            raise OSError(f"OTLP gRPC: cannot bind {self.host}:{port}")
        server.start()
        self._grpc, self.grpc_port = server, bound

    def _start_http(self, port: int) -> None:
        receiver = self

        class Handler(_HttpHandler):
            owner = receiver

        server = ThreadingHTTPServer((self.host, port), Handler)
        server.daemon_threads = True
        self._http, self.http_port = server, server.server_address[1]
        self._http_thread = threading.Thread(target=server.serve_forever, name="otlp-http",
                                             daemon=True)
        self._http_thread.start()

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(2.0)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join(timeout=2.0)
            self._http_thread = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _grpc_handler(owner: OtlpReceiver) -> grpc.GenericRpcHandler:
    """``TraceService/Export`` on the raw request bytes: parsed once, by ``accept``, so a body
    that does not parse, or is over the size limit, is answered INVALID_ARGUMENT and counted
    (grpc's own deserializer answers INTERNAL and counts nothing)."""
    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    def export(body: bytes, context: grpc.ServicerContext) -> bytes:
        error = owner.accept(body, "grpc")
        if error is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
        return empty

    service = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
    return grpc.method_handlers_generic_handler(
        service, {"Export": grpc.unary_unary_rpc_method_handler(export)})


class _BadBody(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,8}")


def _read_chunked(rfile: Any, limit: int) -> bytes:
    """A ``transfer-encoding: chunked`` body (the OpenTelemetry JS exporter sends its JSON so,
    without a content-length), refused once it passes ``limit``."""
    parts: list[bytes] = []
    total = 0
    while True:
        line = rfile.readline(1024)
        size = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size):
            raise _BadBody(400, "bad_chunking", "malformed chunked body (chunk size line)")
        n = int(size, 16)
        if n == 0:
            break
        total += n
        if total > limit:
            raise _BadBody(413, "too_large", f"chunked body over {limit} bytes")
        data = rfile.read(n)
        if len(data) < n or rfile.readline(3).rstrip(b"\r\n") != b"":
            raise _BadBody(400, "bad_chunking", "chunked body cut short or malformed")
        parts.append(data)
    for _ in range(64):  # trailer fields, up to the empty line
        if rfile.readline(8192) in (b"\r\n", b"\n", b""):
            break
    return b"".join(parts)


# zlib window bits per content-encoding: gzip's header, or deflate's zlib wrapper (RFC 9110
# §8.4.1.2; the OpenTelemetry Python exporter's `deflate` compression sends it).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    d = zlib.decompressobj(_WBITS[encoding])
    try:
        out = d.decompress(body, limit)
    except zlib.error as exc:
        raise _BadBody(400, f"bad_{encoding}", f"{encoding} body undecodable: {exc}") from None
    if d.unconsumed_tail:
        raise _BadBody(413, "too_large", f"{encoding} body inflates past {limit} bytes")
    if not d.eof:
        raise _BadBody(400, f"bad_{encoding}", f"{encoding} body cut short")
    return out


def _status_body(fmt: str | None, message: str) -> tuple[bytes, str]:
    """An error body as OTLP/HTTP asks: a ``google.rpc.Status`` (only its message) in the
    request's encoding; plain text when that is unknown."""
    if fmt == "json":
        return msgspec.json.encode({"message": message}), JSON
    if fmt == "pb":
        text = message.encode()
        return b"\x12" + _varint(len(text)) + text, PROTOBUF
    return message.encode(), "text/plain; charset=utf-8"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


class _HttpHandler(BaseHTTPRequestHandler):
    owner: OtlpReceiver
    protocol_version = "HTTP/1.1"
    timeout = 60  # a client silent this long mid-body (or idle between exports) is let go

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("otlp http: " + format, *args)

    def _answer(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        if self.close_connection:  # said, so that the client does not send on it again
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _format(self) -> str | None:
        ctype = (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        return _MEDIA_TYPES.get(ctype)

    def _error(self, status: int, kind: str, message: str, count: bool = True) -> None:
        if count:
            self.owner.refuse(kind, message)
        self._answer(status, *_status_body(self._format(), message))

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            self.close_connection = True  # whatever goes wrong, the stream's state is unknown
            body = _read_chunked(self.rfile, self.owner.max_body)
            self.close_connection = False
            return body
        try:
            length = int(self.headers.get("content-length") or -1)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise _BadBody(411, "no_length", "content-length or chunked transfer required")
        if length > self.owner.max_body:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._unread = length
            raise _BadBody(413, "too_large", f"body of {length} bytes over {self.owner.max_body}")
        return self.rfile.read(length)

    def _discard_unread(self) -> None:
        """After answering a body too large: read what the client still sends (bounded in
        bytes and time) before closing, so that it gets to read the answer instead of a
        reset (a socket closed with unread data resets the connection: a broken pipe)."""
        left = min(self._unread, DISCARD_MAX)
        try:
            self.wfile.flush()
            self.connection.settimeout(DISCARD_S)
            while left > 0:
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/traces":
            self.close_connection = True  # its body is not read
            self._error(404, "not_found", f"no OTLP endpoint at {self.path} (use /v1/traces)")
            return
        self._unread = 0
        try:
            body = self._body()
        except _BadBody as exc:
            self._error(exc.status, exc.kind, str(exc))
            self._discard_unread()
            return
        fmt = self._format()
        if fmt is None:
            self._error(415, "unsupported_media_type",
                        f"content-type {self.headers.get('content-type') or 'none'!r}: "
                        f"only {PROTOBUF} and {JSON} are accepted")
            return
        encoding = (self.headers.get("content-encoding") or "identity").strip().lower()
        if encoding in _WBITS:
            try:
                body = _inflate(body, encoding, self.owner.max_body)
            except _BadBody as exc:
                self._error(exc.status, exc.kind, str(exc))
                return
        elif encoding != "identity":  # 415 also names an unsupported coding (RFC 9110 §15.5.16)
            self._error(415, "unsupported_encoding",
                        f"content-encoding {encoding!r}: only gzip and deflate are accepted")
            return
        error = self.owner.accept(body, "http", fmt)
        if error is not None:  # counted by accept
            self._error(400, "malformed_export", error, count=False)
        elif fmt == "json":
            self._answer(200, b"{}", JSON)
        else:
            self._answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                         PROTOBUF)
