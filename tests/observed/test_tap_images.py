"""`mmlens tap --fetch-images`: images sent by http URL are fetched by the tap after the
client got its answer, so their records carry size and content identities like data: URLs
(never the bytes); disallowed hosts, redirects, errors and oversize images are refused and
counted, and a slow image never delays the client."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time

import httpx
from aiohttp import web
from mmlens.collectors.media_server import MediaServer
from mmlens.collectors.tap_frames import FrameReader, exchange_frame
from mmlens.collectors.tap_images import ImageFetcher, public_address
from mmlens.collectors.tap_process import PipeIntake
from mmlens.collectors.tap_record import Recorder

from mmlens.cli.tap import layout_fn
from mmlens.ingest.tap_parse import Exchange
from mmlens.layout.sent import describe_image
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import CollectorHealth
from tests.live_support import free_port, wait_until
from tests.observed.tap_support import Served, dumped, recorded, tap_in_front

PNG = synthetic_png("solid", 320, 200, rgb=(10, 120, 200))


def body(*urls: str) -> dict:
    return {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": [
        *({"type": "image_url", "image_url": {"url": u}} for u in urls),
        {"type": "text", "text": "what is this"}]}]}


def fetcher(**kwargs: object) -> ImageFetcher:
    """A fetcher for the loopback media servers these tests start (allowed explicitly:
    by default the tap fetches from public addresses only)."""
    kwargs.setdefault("allow_private", True)
    return ImageFetcher(**kwargs)  # type: ignore[arg-type]


def test_a_url_image_is_described_like_the_same_bytes_sent_inline() -> None:
    with MediaServer() as media, tap_in_front(fetcher=fetcher()) as (tap, url, records):
        image_url = media.add("red.png", PNG)
        inline = describe_image("data:image/png;base64," + base64.b64encode(PNG).decode(), PNG)
        for _ in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=body(image_url)
                              ).status_code == 200
        wait_until(lambda: len(records) == 3, 10, what="three records")
        for t in records:
            (im,) = t.images
            assert (im.url_kind, im.width, im.height, im.byte_size) == ("http", 320, 200,
                                                                        len(PNG))
            assert im.identities["smg_blake3"] == inline.info.identities["smg_blake3"]
            assert im.identities["dynamo_mm_hash_url"] != inline.info.identities[
                "dynamo_mm_hash_url"]  # Dynamo hashes the URL as sent
            assert base64.b64encode(PNG).decode()[:40] not in dumped(t)
        assert [p for p, _ in media.requests].count("/red.png") == 1  # cached per URL
        assert tap.health.counters["images_fetched"] == 1
        assert tap.health.counters["image_fetch_cache_hits"] == 2


def test_the_layout_of_a_url_image_is_computed_once_fetched() -> None:
    inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
    with MediaServer() as media, tap_in_front(fetcher=fetcher(),
                                              layout=layout_fn("qwen3-vl", False)
                                              ) as (_, url, records):
        httpx.post(url + "/v1/chat/completions", json=body(media.add("a.png", PNG)))
        httpx.post(url + "/v1/chat/completions", json=body(inline))
        wait_until(lambda: len(records) == 2, 10, what="two records")
    layouts = [t.expected_layout for t in records]
    assert all(lay is not None and lay.error is None for lay in layouts)
    # Qwen3-VL scales 320×200 up to its minimum pixels: 352×224 → 77 tokens either way
    assert [[im.tokens for im in lay.images] for lay in layouts] == [[77], [77]]
    assert len({lay.images[0].identity["smg"] for lay in layouts}) == 1
    without = tap_in_front(layout=layout_fn("qwen3-vl", False))
    with MediaServer() as media, without as (_, url, records):
        httpx.post(url + "/v1/chat/completions", json=body(media.add("a.png", PNG)))
        wait_until(lambda: records, 10, what="a record")
        assert records[0].expected_layout.images == []  # the part layout only: size unknown
        assert media.requests == []


def test_refused_images_are_counted_and_leave_the_size_unknown() -> None:
    with MediaServer() as media, MediaServer() as other:
        allowed = frozenset({f"127.0.0.1:{media.httpd.server_address[1]}"})
        big = media.add("big.png", PNG)
        ok = media.add("ok.png", PNG)
        elsewhere = other.add("x.png", PNG)
        with tap_in_front(fetcher=fetcher(allowed_hosts=allowed, max_bytes=len(PNG))
                          ) as (tap, url, records):
            media.files["/big.png"] = (PNG + b"\0" * 10, "image/png")
            r = httpx.post(url + "/v1/chat/completions",
                           json=body(ok, big, media.base_url + "/missing.png", elsewhere))
            assert r.status_code == 200
            wait_until(lambda: records, 10, what="a record")
        sizes = [(im.width, im.byte_size) for im in records[0].images]
        assert sizes == [(320, len(PNG)), (None, None), (None, None), (None, None)]
        assert other.requests == []  # a disallowed host is never contacted
        assert tap.health.errors == {"image_fetch_too_large": 1, "image_fetch_http_404": 1,
                                     "image_fetch_host_not_allowed": 1}


def test_redirects_are_not_followed() -> None:
    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound(target.add("t.png", PNG))

    app = web.Application()
    app.router.add_get("/r.png", redirect)
    with MediaServer() as target:
        origin = Served(app, free_port())
        try:
            with tap_in_front(fetcher=fetcher()) as (tap, url, records):
                httpx.post(url + "/v1/chat/completions", json=body(origin.url + "/r.png"))
                wait_until(lambda: records, 10, what="a record")
        finally:
            origin.stop()
    assert records[0].images[0].width is None and target.requests == []
    assert tap.health.errors == {"image_fetch_http_302": 1}


def test_a_slow_image_delays_neither_the_answer_nor_the_next_request() -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.Response(body=PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/slow.png", slow)
    origin = Served(app, free_port())
    try:
        with tap_in_front(fetcher=fetcher(timeout_s=5.0)) as (_, url, records), \
                httpx.Client() as c:  # one keep-alive connection for both requests
            t0 = time.monotonic()
            for _ in range(2):
                assert c.post(url + "/v1/chat/completions", json=body(origin.url + "/slow.png")
                              ).status_code == 200
            assert time.monotonic() - t0 < 1.0
            assert records == []  # recorded once the images are in
            wait_until(lambda: len(records) == 2, 10, what="two records")
            assert all(t.images[0].width == 320 for t in records)
            assert all((t.latency_s or 9) < 1.0 for t in records)  # the exchange's, not the fetch's
    finally:
        origin.stop()


def test_by_default_only_public_addresses_are_fetched() -> None:
    """No allow-list: loopback addresses are refused, by literal IP or by a name resolving
    to one (checked on the resolved addresses, which are the ones connected to), and so are
    other schemes; the media server is never contacted. (Only loopback is sent to: the
    other non-public ranges are checked without traffic below.)"""
    with MediaServer() as media, tap_in_front(fetcher=ImageFetcher()) as (tap, url, records):
        port = media.httpd.server_address[1]
        image = media.add("p.png", PNG)
        urls = [image, f"http://localhost:{port}/p.png",
                f"http://[::ffff:127.0.0.1]:{port}/p.png", "file:///etc/passwd"]
        r = httpx.post(url + "/v1/chat/completions", json=body(*urls))
        assert r.status_code == 200
        recorded(records)
    assert media.requests == []
    assert [im.width for im in records[0].images] == [None] * len(urls)
    assert tap.health.errors == {"image_fetch_address_not_public": 3, "image_fetch_scheme": 1}


def test_non_public_address_ranges() -> None:
    refused = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
               "100.64.0.1", "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fc00::1",
               "::ffff:10.0.0.1", "not an ip"]
    assert [ip for ip in refused if public_address(ip)] == []
    assert public_address("8.8.8.8") and public_address("2001:4860:4860::8888")


def test_the_recorder_process_loop_records_what_the_pipe_brought_fetched_images_included(
) -> None:
    """The recorder process's one thread (``Recorder.run`` on the pipe): every exchange
    recorded, its request parsed from the read buffer it was borrowed from, the http image
    fetched before the end; the proxy's end closing without a word ends the loop."""
    with MediaServer() as media:
        image_url = media.add("red.png", PNG)
        inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
        sent = [Exchange(1.0 + i, 0.0, b"", f"r{i}", 200, {"x-request-id": f"r{i}"},
                         body_parts=[json.dumps(body(u)).encode()[:9],
                                     json.dumps(body(u)).encode()[9:]])
                for i, u in enumerate([inline, image_url, inline])]
        r, w = os.pipe()
        for ex in sent:
            os.writev(w, exchange_frame(ex))
        os.close(w)  # gone without a stop frame, as a killed proxy
        records: list = []
        health = CollectorHealth("tap", "u")
        rec = Recorder(records.extend, health, fetcher=fetcher(), thread=False)
        rec.run(PipeIntake(FrameReader(r), rec, [CollectorHealth("tap", "u")], health))
        os.close(r)
    assert sorted(t.request_id for t in records) == ["r0", "r1", "r2"]
    for t in records:
        (im,) = t.images
        assert (im.width, im.height, im.byte_size) == (320, 200, len(PNG))
    assert {t.request_id: t.images[0].url_kind for t in records} == {
        "r0": "data", "r1": "http", "r2": "data"}
    assert health.counters["images_fetched"] == 1
