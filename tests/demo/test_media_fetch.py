"""The demo worker's image fetch: host:port allow-list, redirects and HTTP errors refused as
MediaError (the API's 400), a deadline that cuts a slow drip, byte and pixel caps."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mmlens.demo.media import MediaError, decode_image, fetch_bytes
from PIL import Image

from tests.live_support import free_port


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, "PNG")
    return buf.getvalue()


SMALL = _png(32, 32)
HUGE = _png(8192, 8192, "1")  # tiny file, 67 M pixels once decoded


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/secret")
            self.end_headers()
        elif self.path in ("/ok.png", "/huge.png"):
            body = SMALL if self.path == "/ok.png" else HUGE
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/drip":
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_allow_list_is_host_and_port(server) -> None:
    host, port = server.split(":")
    assert decode_image(f"http://{server}/ok.png", "m", frozenset({server})).width == 32
    assert decode_image(f"http://{server}/ok.png", "m", frozenset({f"{host}:*"})).width == 32
    for allowed in ({host}, {f"{host}:{int(port) + 1}"}, {f"localhost:{port}"}):
        with pytest.raises(MediaError, match="not in the allowed hosts"):
            fetch_bytes(f"http://{server}/ok.png", frozenset(allowed), 1 << 20)


@pytest.mark.parametrize(("path", "message"), [
    ("/redirect", "redirects"), ("/missing", "HTTP 404"), ("/big", "larger than"),
    ("/drip", "longer than 1 s"), ("/huge.png", "exceeds"),
])
def test_refusals_are_media_errors(server, path: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(MediaError, match=message):
        decode_image(f"http://{server}{path}", "m", frozenset({server}), deadline_s=1.0)
    assert time.monotonic() - started < 3


def test_a_refused_port_is_a_media_error() -> None:
    port = free_port()  # nothing listens on it
    with pytest.raises(MediaError, match="fetch failed"):
        fetch_bytes(f"http://127.0.0.1:{port}/a.png", frozenset({f"127.0.0.1:{port}"}), 1000)
