"""A small loopback image server for Dynamo tests.

Dynamo reads an image's dimensions with an HTTP Range request and requires `206 Partial
Content`. Paths under `/range/` honour `Range: bytes=a-b`; paths under `/plain/` always answer
200 with the whole body (as `python -m http.server` does), which makes Dynamo fall back to
text-prefix routing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mmlens.collectors.media_server import byte_range, send_bytes


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
                ranged = parts[1] == "range"
                status = byte_range(rng if ranged else None, len(body))[0]
                server.requests.append((self.path, rng, status))
                send_bytes(self, body, "image/png", rng if ranged else None,
                           "bytes" if ranged else None, head_only)

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
