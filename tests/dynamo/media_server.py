"""A small loopback image server for Dynamo tests.

Dynamo reads an image's dimensions with an HTTP Range request and requires `206 Partial
Content`. Paths under `/range/` honour `Range: bytes=a-b`; paths under `/plain/` always answer
200 with the whole body (as `python -m http.server` does), which makes Dynamo fall back to
text-prefix routing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class MediaServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None, int]] = []  # (path, range, status)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, name: str, range_capable: bool = True) -> str:
        return f"http://127.0.0.1:{self.port}/{'range' if range_capable else 'plain'}/{name}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, head_only: bool) -> None:
                parts = self.path.split("/", 2)
                body = server.files.get(parts[2]) if len(parts) == 3 else None
                rng = self.headers.get("Range")
                if body is None or parts[1] not in ("range", "plain"):
                    server.requests.append((self.path, rng, 404))
                    self.send_error(404)
                    return
                status, start, end = 200, 0, len(body) - 1
                m = _RANGE.match(rng or "")
                if parts[1] == "range" and m and body:
                    if m.group(1):
                        start = int(m.group(1))
                        end = min(int(m.group(2)), end) if m.group(2) else end
                    else:  # suffix range: the last N bytes
                        start = max(0, len(body) - int(m.group(2) or 0))
                    if start > end:
                        server.requests.append((self.path, rng, 416))
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    status = 206
                chunk = body[start:end + 1]
                server.requests.append((self.path, rng, status))
                self.send_response(status)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(chunk)))
                if parts[1] == "range":
                    self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
                self.end_headers()
                if not head_only:
                    self.wfile.write(chunk)

            def do_GET(self) -> None:
                self._send(False)

            def do_HEAD(self) -> None:
                self._send(True)

        return Handler

    def start(self) -> MediaServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def media_server() -> Iterator[MediaServer]:
    srv = MediaServer().start()
    try:
        yield srv
    finally:
        srv.stop()
