"""The media server's uploads (the demo's media origin) and mmlens' upload client: loopback
only, content-addressed and idempotent, size-capped, images only, every refusal a clear
message; what is uploaded is served by URL, with Range."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import pytest
from mmlens.collectors.media_server import MediaServer, byte_range, is_loopback
from mmlens.collectors.media_upload import MediaOriginError, upload
from mmlens.collectors.traces import solid_png

PNG = solid_png(40, 30, (10, 200, 30))


@pytest.fixture
def origin() -> Iterator[MediaServer]:
    with MediaServer(uploads=True, max_upload_bytes=64 * 1024) as srv:
        yield srv


def put(srv: MediaServer, body: bytes, name: str | None = None) -> httpx.Response:
    sha = name or hashlib.sha256(body).hexdigest()
    return httpx.put(f"{srv.base_url}/media/{sha}", content=body, timeout=5)


def test_upload_then_fetch_by_every_name_with_ranges(origin: MediaServer) -> None:
    first = put(origin, PNG)
    assert first.status_code == 201
    sha = hashlib.sha256(PNG).hexdigest()
    assert first.json() == {"url": f"{origin.base_url}/media/{sha}", "bytes": len(PNG),
                            "format": "PNG"}
    again = put(origin, PNG)  # the same bytes: the same name, nothing new stored
    assert again.status_code == 200 and len(origin.uploaded) == 1
    for path in (f"/media/{sha}", f"/media/{sha}/one.png", f"/media/{sha}/two.png"):
        r = httpx.get(origin.base_url + path, timeout=5)
        assert (r.status_code, r.content, r.headers["content-type"]) == (200, PNG, "image/png")
    part = httpx.get(f"{origin.base_url}/media/{sha}/x.png", headers={"Range": "bytes=0-7"},
                     timeout=5)
    assert part.status_code == 206 and part.content == PNG[:8]
    assert part.headers["content-range"] == f"bytes 0-7/{len(PNG)}"


@pytest.mark.parametrize(("header", "answer"), [
    (None, (200, 0, 99)),
    ("bytes=10-19", (206, 10, 19)),
    ("bytes=90-", (206, 90, 99)),
    ("bytes=90-500", (206, 90, 99)),
    ("bytes=-8", (206, 92, 99)),
    ("bytes=-500", (206, 0, 99)),
    ("bytes=100-", (416, 100, 99)),
    ("bytes=-", (200, 0, 99)),
    ("items=0-5", (200, 0, 99)),
])
def test_byte_range(header: str | None, answer: tuple[int, int, int]) -> None:
    assert byte_range(header, 100) == answer


def test_a_range_past_the_end_is_refused(origin: MediaServer) -> None:
    url = origin.add("x.png", PNG)
    r = httpx.get(url, headers={"Range": f"bytes={len(PNG)}-"}, timeout=5)
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(PNG)}"


def test_upload_through_the_client_gives_a_named_url(origin: MediaServer) -> None:
    with httpx.Client() as client:
        url = upload(client, origin.base_url + "/", PNG, "one.png")
        assert url == f"{origin.base_url}/media/{hashlib.sha256(PNG).hexdigest()}/one.png"
        assert client.get(url).content == PNG


@pytest.mark.parametrize(("body", "name", "status", "message"), [
    (b"%PDF-1.4 not an image", None, 415, "not an accepted image"),
    (b"", None, 415, "empty image data"),
    (PNG[:-20], None, 415, "not an accepted image"),  # truncated PNG
    (PNG, "0" * 64, 400, "not the name"),
    (PNG, "abc", 404, "sha256"),
])
def test_bad_uploads_are_refused_and_store_nothing(origin: MediaServer, body: bytes,
                                                   name: str | None, status: int,
                                                   message: str) -> None:
    r = put(origin, body, name)
    assert r.status_code == status and message in r.json()["error"]
    assert not origin.uploaded


def test_oversize_upload_is_refused_before_the_body_is_read(origin: MediaServer) -> None:
    big = solid_png(16, 16, (1, 1, 1)) + b"\0" * (64 * 1024)
    r = put(origin, big)
    assert r.status_code == 413 and "over the 65536 byte limit" in r.json()["error"]
    assert not origin.uploaded
    with httpx.Client() as client, pytest.raises(MediaOriginError, match=r"HTTP 413.*65536"):
        upload(client, origin.base_url, big, "big.png")


def test_uploads_off_unless_asked_and_loopback_only() -> None:
    with MediaServer() as plain:
        assert put(plain, PNG).status_code == 405
    with pytest.raises(ValueError, match="loopback only"):
        MediaServer("0.0.0.0")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("10.0.0.1")


def test_the_oldest_uploads_go_beyond_the_store_cap() -> None:
    images = [solid_png(64, 64, (i, 0, 0)) for i in range(3)]
    with MediaServer(uploads=True, max_stored_bytes=2 * max(map(len, images))) as srv:
        for img in images:
            assert put(srv, img).status_code == 201
        assert list(srv.uploaded) == [hashlib.sha256(i).hexdigest() for i in images[1:]]


def test_an_unreachable_origin_is_a_clear_error() -> None:
    with MediaServer() as srv:
        url = srv.base_url
    with httpx.Client() as client, pytest.raises(MediaOriginError, match="unreachable"):
        upload(client, url, PNG, "a.png")
