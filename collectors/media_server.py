"""A loopback media origin for image-by-URL requests: serves registered bytes by path and
honours `Range: bytes=a-b` with 206 Partial Content (Dynamo's dimension probe needs 206).

With ``uploads=True`` it also takes images from loopback clients: ``PUT /media/<sha256>``
with the image as the body (size-capped, checked to be an image, content-addressed so a
re-upload is idempotent); ``GET /media/<sha256>`` and ``GET /media/<sha256>/<any name>``
serve it (names let one image have several URLs, as a router that keys images by URL sees
them)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mmlens.errors import ImageError
from mmlens.layout.imageinfo import probe_image

RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)$")
MEDIA_PATH = re.compile(r"^/media/(?P<sha>[0-9a-f]{64})(?:/[^/?#]{1,200})?$")
DEFAULT_MAX_UPLOAD = 16 * 1024 * 1024  # the demo worker's own image cap
DEFAULT_MAX_STORED = 256 * 1024 * 1024  # uploads beyond it push out the oldest
MAX_NOTED = 10_000


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def byte_range(header: str | None, size: int) -> tuple[int, int, int]:
    """(status, first, last byte) of an answer over ``size`` bytes to a GET with this Range
    header: 206 for `bytes=a-b`, `bytes=a-` or the suffix `bytes=-n`; 416 for a range that
    starts past the end; 200 and the whole body for no range or one not of these forms."""
    last = size - 1
    m = RANGE_RE.match(header or "")
    if not m or not size or not (m.group(1) or m.group(2)):
        return 200, 0, last
    if m.group(1):
        first = int(m.group(1))
        last = min(int(m.group(2)), last) if m.group(2) else last
    else:
        first = max(0, size - int(m.group(2)))
    return (416 if first > last else 206), first, last


def send_bytes(handler: BaseHTTPRequestHandler, data: bytes, mime: str,
               range_header: str | None, accept_ranges: str | None, head_only: bool) -> int:
    """Answers a GET (or HEAD) with ``data``, or the part ``range_header`` asks for, and
    ``Accept-Ranges: accept_ranges`` when given; returns the status sent."""
    status, first, last = byte_range(range_header, len(data))
    if status == 416:
        handler.send_response(416)
        handler.send_header("Content-Range", f"bytes */{len(data)}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return status
    body = data[first:last + 1]
    handler.send_response(status)
    handler.send_header("Content-Type", mime)
    handler.send_header("Content-Length", str(len(body)))
    if accept_ranges is not None:
        handler.send_header("Accept-Ranges", accept_ranges)
    if status == 206:
        handler.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
    handler.end_headers()
    if not head_only:
        handler.wfile.write(body)
    return status


class MediaServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, ranges: bool = True, *,
                 uploads: bool = False, max_upload_bytes: int = DEFAULT_MAX_UPLOAD,
                 max_stored_bytes: int = DEFAULT_MAX_STORED) -> None:
        if not is_loopback(host):
            raise ValueError(f"the media server binds loopback only, not {host!r}")
        self.files: dict[str, tuple[bytes, str]] = {}
        self.ranges = ranges
        # The latest GETs (path, Range header), for tests and debugging.
        self.requests: list[tuple[str, str | None]] = []
        self.uploads = uploads
        self.max_upload_bytes = max_upload_bytes
        self.max_stored_bytes = max_stored_bytes
        self.uploaded: OrderedDict[str, tuple[bytes, str]] = OrderedDict()  # sha256 → image
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, name: str, data: bytes, mime: str = "image/png") -> str:
        path = "/" + name.lstrip("/")
        self.files[path] = (data, mime)
        return self.base_url + path

    def note(self, path: str, range_header: str | None) -> None:
        self.requests.append((path, range_header))
        if len(self.requests) > MAX_NOTED:  # a long-running demo keeps only the latest
            del self.requests[:MAX_NOTED // 2]

    def lookup(self, path: str) -> tuple[bytes, str] | None:
        path = path.split("?", 1)[0]
        m = MEDIA_PATH.match(path)
        if m and self.uploads:
            with self._lock:
                found = self.uploaded.get(m.group("sha"))
            if found is not None:
                return found
        return self.files.get(path)

    def store_upload(self, sha: str, body: bytes) -> tuple[int, dict[str, object]]:
        """(HTTP status, JSON answer) for an upload of ``body`` named ``sha``."""
        actual = hashlib.sha256(body).hexdigest()
        if actual != sha:
            return 400, {"error": f"the body's sha256 is {actual}, not the name {sha}"}
        try:
            info = probe_image(body, self.max_upload_bytes)
        except ImageError as exc:
            return 415, {"error": f"not an accepted image: {exc}"}
        with self._lock:
            fresh = sha not in self.uploaded
            self.uploaded[sha] = (body, f"image/{info.format.lower()}")
            self.uploaded.move_to_end(sha)
            total = sum(len(b) for b, _ in self.uploaded.values())
            while total > self.max_stored_bytes and len(self.uploaded) > 1:
                _, (old, _) = self.uploaded.popitem(last=False)
                total -= len(old)
        return (201 if fresh else 200), {"url": f"{self.base_url}/media/{sha}",
                                         "bytes": len(body), "format": info.format}

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: MediaServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._serve(head_only=False)

        def do_HEAD(self) -> None:
            self._serve(head_only=True)

        def _serve(self, head_only: bool) -> None:
            server.note(self.path, self.headers.get("Range"))
            entry = server.lookup(self.path)
            if entry is None:
                self.send_error(404)
                return
            data, mime = entry
            send_bytes(self, data, mime, self.headers.get("Range") if server.ranges else None,
                       "bytes" if server.ranges else "none", head_only)

        def do_PUT(self) -> None:
            status, answer = self._upload()
            body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status >= 400:
                self.send_header("Connection", "close")  # an unread body must not linger
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _upload(self) -> tuple[int, dict[str, object]]:
            if not server.uploads:
                return 405, {"error": "this media server takes no uploads"}
            if not is_loopback(self.client_address[0]):
                return 403, {"error": "uploads are accepted from loopback clients only"}
            m = MEDIA_PATH.match(self.path)
            if not m or self.path.count("/") != 2:
                return 404, {"error": "upload to /media/<sha256 of the body, 64 hex digits>"}
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                return 411, {"error": "an upload needs a Content-Length"}
            if int(length[:20]) > server.max_upload_bytes:
                return 413, {"error": f"image of {length[:20]} bytes is over the "
                                      f"{server.max_upload_bytes} byte limit"}
            return server.store_upload(m.group("sha"), self.rfile.read(int(length)))

    return Handler
