"""A tiny HTTP server on 127.0.0.1 (random port) serving canned routes, for collector tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: bytes | str | Callable[[], bytes | str]
    status: int = 200
    content_type: str = "text/plain; version=0.0.4"
    delay_s: float = 0.0
    headers: dict[str, str] | None = None


class Loopback:
    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body_in = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body_in))
                route = outer.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if route.delay_s:
                    time.sleep(route.delay_s)
                body = route.body() if callable(route.body) else route.body
                data = body.encode() if isinstance(body, str) else body
                try:
                    self.send_response(route.status)
                    self.send_header("content-type", route.content_type)
                    for k, v in (route.headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = _serve
            do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Loopback:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
