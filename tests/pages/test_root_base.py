"""The page-HTML middleware (mmlens.ui.root_base): the base-URL script goes into Streamlit's
page HTML only, ahead of its bundle, with the length right; everything else passes as it was."""

from __future__ import annotations

import asyncio
from typing import Any

from mmlens.ui.root_base import RootBase, head_script

PAGE = (b"<!doctype html><html><head><script>window.prerenderReady = false</script>"
        b'<script type="module" src="./static/js/index.abc.js"></script></head>'
        b"<body></body></html>")


def served(path: str, body: bytes = PAGE, content_type: bytes = b"text/html; charset=utf-8",
           method: str = "GET", base_path: str = "",
           chunks: int = 1) -> tuple[list[dict[str, Any]], list[tuple[bytes, bytes]]]:
    """(messages sent, request headers the app saw) for one request through the middleware."""
    seen: list[tuple[bytes, bytes]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.extend(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            (b"etag", b'"x"'), (b"cache-control", b"no-cache")]})
        step = max(1, len(body) // chunks)
        parts = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part,
                        "more_body": i < len(parts) - 1})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"host", b"127.0.0.1"), (b"accept-encoding", b"gzip, br")]}
    asyncio.run(RootBase(app, base_path)(scope, receive, send))
    return sent, seen


def body_of(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def headers_of(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return dict(sent[0]["headers"])


def test_a_page_url_gets_the_script_first_in_its_head_with_its_length() -> None:
    for path in ("/routing", "/", "/inspector"):
        sent, seen = served(path, chunks=3)
        body = body_of(sent)
        assert body.startswith(b"<!doctype html><html><head><script>window.__streamlit=")
        assert b'BACKEND_BASE_URL:location.origin+"/"' in body
        assert body.index(b"__streamlit") < body.index(b"index.abc.js")
        assert body.replace(head_script(""), b"") == PAGE
        headers = headers_of(sent)
        assert headers[b"content-length"] == str(len(body)).encode()
        assert b"etag" not in headers and headers[b"cache-control"] == b"no-cache"
        # asked uncompressed, or the script could not go in
        assert b"accept-encoding" not in dict(seen)


def test_the_base_path_is_named_when_served_under_one() -> None:
    body = body_of(served("/mmlens/routing", base_path="/mmlens/")[0])
    assert b'location.origin+"/mmlens/"' in body


def test_streamlit_routes_other_kinds_and_methods_pass_unchanged() -> None:
    for path in ("/_stcore/health", "/static/js/index.abc.js", "/media/x.png",
                 "/component/c/index.html"):
        sent, seen = served(path)
        assert body_of(sent) == PAGE and headers_of(sent)[b"etag"] == b'"x"'
        assert (b"accept-encoding", b"gzip, br") in seen
    sent, _ = served("/routing", body=b'{"a": 1}', content_type=b"application/json")
    assert body_of(sent) == b'{"a": 1}'
    assert body_of(served("/routing", method="HEAD")[0]) == PAGE
    # a page without a head is left as it is
    assert body_of(served("/routing", body=b"<html>no head</html>")[0]) == b"<html>no head</html>"
