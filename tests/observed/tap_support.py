"""A fake OpenAI-compatible router and the tap in front of it, each on its own event loop
thread on 127.0.0.1 (for tap tests and the tap benchmark)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from aiohttp import web
from mmlens.collectors.tap import Tap
from mmlens.collectors.tap_record import Recorder

from mmlens.records import CollectorHealth, RequestTrace
from tests.live_support import free_port, wait_until

HOST = "127.0.0.1"
USAGE = {"prompt_tokens": 81, "completion_tokens": 3, "total_tokens": 84,
         "prompt_tokens_details": {"cached_tokens": 80}}


def chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("model") == "broken":
        return web.json_response({"error": {"message": "no worker", "code": "no_worker"}},
                                 status=503, headers={"x-smg-error-code": "no_worker"})
    headers = {"x-smg-routed-worker-id": "grpc://127.0.0.1:50051",
               "x-request-id": request.headers.get("x-request-id", "chatcmpl-up")}
    if not body.get("stream"):
        return web.json_response({"id": "chatcmpl-up-1", "object": "chat.completion",
                                  "choices": [{"index": 0, "message": {"content": "hi"}}],
                                  "usage": USAGE}, headers=headers)
    resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body.get("max_tokens") or 3)
    for i in range(n):
        await resp.write(chunk({"id": "chatcmpl-up-2", "choices": [
            {"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}))
        await asyncio.sleep(float(body.get("delay", 0.0)))
    await resp.write(chunk({"id": "chatcmpl-up-2", "choices": [
        {"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": USAGE}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def fake_router() -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


DEEP = b"[" * 3000 + b"]" * 3000
ODD_SSE = [b'data: {"choices": 5}\n\n', b"data: " + DEEP + b"\n\n",
           b'data: {"id":"c-1","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
           b'data: {"id":"c-1","choices":[],"usage":' + json.dumps(USAGE).encode() + b"}\n\n",
           b"data: [DONE]\n\n"]


async def odd_router(request: web.Request) -> web.StreamResponse:
    """Answers whatever it is sent (it parses nothing); ``x-reply`` picks the answer."""
    body = await request.read()
    headers = {"x-request-id": request.headers.get("x-request-id", "r"),
               "x-smg-routed-worker-id": "w1"}
    reply = request.headers.get("x-reply", "json")
    if reply == "trace-int-worker":
        headers["x-smg-cache-trace"] = json.dumps({"selections": [{"worker": 5}]})
    if reply == "sse":
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in ODD_SSE:
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    if reply == "deep-json":
        return web.Response(body=b'{"id":"c-2","x":' + DEEP + b"}", headers=headers,
                            content_type="application/json")
    rid = headers["x-request-id"]
    return web.json_response({"id": f"c-{rid}-{len(body)}", "usage": USAGE}, headers=headers)


def odd_app() -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", odd_router)
    return app


class Served:
    """An aiohttp app served from a daemon thread's own event loop."""

    def __init__(self, app: web.Application, port: int) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("server did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._runner.setup())
        self.loop.run_until_complete(web.TCPSite(self._runner, HOST, self.port).start())
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


RECORDER_OPTIONS = ("store_text", "layout", "fetcher", "flush_health", "max_backlog",
                    "max_backlog_bytes", "buffer", "linger_s")


class ServedTap:
    """The tap served from a daemon thread's own event loop."""

    def __init__(self, tap: Tap, port: int) -> None:
        self.tap = tap
        self.url = f"http://{HOST}:{port}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(tap.serve(HOST, port), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.tap.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def tap_in_front(upstream: str | None = None, write: Callable[[list[RequestTrace]], object]
                 | None = None, **kwargs: Any,
                 ) -> Iterator[tuple[Tap, str, list[RequestTrace]]]:
    """The fake router (unless ``upstream`` is given) and a tap before it, recording through
    its real recorder thread into a list (or ``write``); yields the tap, its URL and the
    records written so far (the tap's ``recorder`` is on it for tests that need it)."""
    router = None if upstream else Served(fake_router(), free_port())
    records: list[RequestTrace] = []
    url = upstream if router is None else router.url
    health = CollectorHealth("tap", url)
    rec_kwargs = {k: kwargs.pop(k) for k in RECORDER_OPTIONS if k in kwargs}
    recorder = Recorder(write or records.extend, health, router=url, **rec_kwargs)
    tap = Tap(url, recorder.submit, health=health, **kwargs)
    tap.recorder = recorder  # type: ignore[attr-defined]
    served = ServedTap(tap, free_port())
    try:
        yield tap, served.url, records
    finally:
        served.stop()
        recorder.close()
        if router is not None:
            router.stop()


def recorded(records: list[RequestTrace], n: int = 1, timeout_s: float = 10.0,
             ) -> list[RequestTrace]:
    """The records once ``n`` are written (the recorder works after the response)."""
    wait_until(lambda: len(records) >= n, timeout_s, 0.01, what=f"{n} records")
    return records


def dumped(t: RequestTrace) -> str:
    return json.dumps(asdict(t), default=str)
