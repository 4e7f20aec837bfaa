"""A loopback media origin for image-by-URL requests: serves registered bytes by path and
honours `Range: bytes=a-b` with 206 Partial Content (Dynamo's dimension probe needs 206)."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)$")


class MediaServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, ranges: bool = True) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.ranges = ranges
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Range")))
                entry = server.files.get(self.path.split("?", 1)[0])
                if entry is None:
                    self.send_error(404)
                    return
                data, mime = entry
                start, end, status = 0, len(data) - 1, 200
                m = RANGE_RE.match(self.headers.get("Range") or "")
                if m and server.ranges and (m.group(1) or m.group(2)):
                    if m.group(1):
                        start = int(m.group(1))
                        end = min(int(m.group(2)), end) if m.group(2) else end
                    else:
                        start = max(0, len(data) - int(m.group(2)))
                    status = 206
                body = data[start:end + 1]
                self.send_response(status)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes" if server.ranges else "none")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
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

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
