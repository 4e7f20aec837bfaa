"""The dashboard's page HTML tells Streamlit's frontend where its server is.

Opened at a page's own URL (``/routing``, a link from a chat message, a reload), Streamlit's
frontend cannot tell a page name from a base path, so it asks ``/routing/_stcore/health``
first, gets a 404 and asks the root again after a retry delay: 120–150 ms of every fresh load
of every page but the Overview (``/``), measured in the browser. The frontend reads its host's
settings from ``window.__streamlit`` (how Streamlit's own hosts embed it); naming the server's
base URL there makes it ask the root once. Added to the HTML only, as a script ahead of
Streamlit's bundle."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Streamlit's own routes: none of them is the page HTML
SERVER_PATHS = ("/_stcore/", "/static/", "/media/", "/component/", "/app/static/", "/auth/")


def head_script(base_path: str) -> bytes:
    """The script naming the server's base URL (``base_path``: Streamlit's baseUrlPath)."""
    path = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
    return (b"<script>window.__streamlit=Object.assign(window.__streamlit||{},"
            b"{BACKEND_BASE_URL:location.origin+" + json.dumps(path).encode()
            + b"});</script>")


def with_base(html: bytes, base_path: str) -> bytes:
    """``html`` with the script as the first thing in its head (unchanged without a head)."""
    at = html.find(b"<head>")
    if at < 0:
        return html
    at += len(b"<head>")
    return html[:at] + head_script(base_path) + html[at:]


class RootBase:
    """ASGI middleware adding the script to every HTML response of a page URL."""

    def __init__(self, app: ASGIApp, base_path: str | None = None) -> None:
        self.app = app
        self._base_path = base_path

    @property
    def base_path(self) -> str:
        if self._base_path is None:
            from streamlit import config

            self._base_path = str(config.get_option("server.baseUrlPath") or "")
        return self._base_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        prefix = "/" + self.base_path.strip("/") if self.base_path.strip("/") else ""
        if scope["type"] != "http" or scope.get("method") != "GET" \
                or path.removeprefix(prefix).startswith(SERVER_PATHS):
            await self.app(scope, receive, send)
            return
        # the page HTML uncompressed (7.8 kB), so the script can go in
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers") or []
                                      if k != b"accept-encoding"]}
        start: Message | None = None
        body: list[bytes] = []

        async def held(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if not headers.get(b"content-type", b"").startswith(b"text/html") \
                        or headers.get(b"content-encoding"):
                    start = None
                    await send(message)
                    return
                start = message
                return
            if start is None:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            html = with_base(b"".join(body), self.base_path)
            headers = [(k, v) for k, v in start.get("headers") or []
                       if k not in (b"content-length", b"etag")]
            headers.append((b"content-length", str(len(html)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": html})

        await self.app(scope, receive, held)
