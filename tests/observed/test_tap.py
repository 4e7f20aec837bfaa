"""`mmlens tap` in front of a router: requests and responses pass through unchanged (SSE
included), each sampled request is recorded without prompt text or image bytes, and bad
cases (router errors, router down, oversized bodies, clients leaving mid-stream) are passed
on or counted while the tap keeps serving."""

from __future__ import annotations

import base64
import socket

import httpx

from mmlens.layout.synthetic_images import synthetic_png
from tests.live_support import free_port
from tests.observed.tap_support import USAGE, dumped, recorded, tap_in_front

PNG = synthetic_png("solid", 64, 48, rgb=(200, 30, 30))
SECRET = "the secret prompt text"


def body(stream: bool = False, model: str = "m", **extra: object) -> dict:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    return {"model": model, "stream": stream, "max_tokens": 3, **extra, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": SECRET}]}]}


def test_json_passes_through_and_is_recorded_privately() -> None:
    with tap_in_front() as (tap, url, records), httpx.Client() as c:
        direct = c.post(tap.upstream + "/v1/chat/completions", json=body())
        via = c.post(url + "/v1/chat/completions", json=body(),
                     headers={"x-request-id": "client-1"})
        assert via.status_code == 200 and via.content == direct.content
        assert via.headers["x-smg-routed-worker-id"] == "grpc://127.0.0.1:50051"
        (t,) = recorded(records)
        assert t.request_id == "client-1" and t.response_id == "chatcmpl-up-1"
        assert (t.worker, t.prompt_tokens, t.cached_tokens) == ("grpc://127.0.0.1:50051", 81,
                                                                80)
        assert t.provenance["cached_tokens"] == "tap" and t.origin == "observed"
        (im,) = t.images
        assert (im.width, im.height, im.byte_size) == (64, 48, len(PNG))
        assert set(im.identities) == {"smg_blake3", "dynamo_mm_hash_url"}
        assert t.expected_layout is not None
        assert t.expected_layout.to_json() == {"parts": [{"kind": "image", "index": 0},
                                                         {"kind": "text", "chars": len(SECRET)}]}
        text = dumped(t)
        assert SECRET not in text and base64.b64encode(PNG).decode()[:40] not in text


def test_store_text_keeps_the_text() -> None:
    with tap_in_front(store_text=True) as (_, url, records):
        httpx.post(url + "/v1/chat/completions", json=body())
        recorded(records)
        assert records[0].expected_layout is not None
        assert records[0].expected_layout.text == SECRET


def test_sse_chunks_pass_through_with_ttft_and_usage() -> None:
    with tap_in_front() as (tap, url, records), httpx.Client() as c:
        direct = c.post(tap.upstream + "/v1/chat/completions", json=body(True))
        with c.stream("POST", url + "/v1/chat/completions", json=body(True)) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            got = b"".join(r.iter_raw())
        assert got == direct.content
        (t,) = recorded(records)
        assert t.stream and t.ttft_s is not None and t.ttft_s <= (t.latency_s or 0)
        assert t.cached_tokens == USAGE["prompt_tokens_details"]["cached_tokens"]


def test_router_errors_pass_unchanged_and_router_down_is_a_clear_502() -> None:
    with tap_in_front() as (tap, url, records), httpx.Client() as c:
        direct = c.post(tap.upstream + "/v1/chat/completions", json=body(model="broken"))
        via = c.post(url + "/v1/chat/completions", json=body(model="broken"))
        assert (via.status_code, via.content) == (503, direct.content)
        assert via.headers["x-smg-error-code"] == "no_worker"
        recorded(records)
        assert records[0].status == 503 and records[0].error_code == "no_worker"
    with tap_in_front(upstream=f"http://127.0.0.1:{free_port()}") as (tap, url, records):
        for _ in range(2):  # and keeps serving
            r = httpx.post(url + "/v1/chat/completions", json=body())
            assert r.status_code == 502
            assert r.json()["error"]["code"] == "upstream_unreachable"
    assert tap.health.counters["upstream_errors"] == 2 and records == []  # drained: none


def test_oversized_bodies_are_proxied_not_recorded() -> None:
    with tap_in_front(max_record_body=100) as (tap, url, records):
        r = httpx.post(url + "/v1/chat/completions", json=body())
        assert r.status_code == 200 and r.json()["usage"] == USAGE
    assert records == [] and tap.health.counters["oversized_not_recorded"] == 1


def test_sampling_records_a_fraction_and_proxies_all() -> None:
    with tap_in_front(sample=0.0) as (tap, url, records), httpx.Client() as c:
        for _ in range(5):
            assert c.post(url + "/v1/chat/completions", json=body()).status_code == 200
        assert c.get(url + "/health").text == "ok"
    assert records == [] and tap.health.counters["requests"] == 6


def test_a_client_leaving_mid_stream_is_counted_and_the_tap_serves_on() -> None:
    with tap_in_front() as (tap, url, records):
        port = int(url.rsplit(":", 1)[1])
        payload = httpx.Request("POST", url + "/v1/chat/completions",
                                json=body(True, max_tokens=50, delay=0.02))
        raw = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               f"content-type: application/json\r\ncontent-length: "
               f"{len(payload.content)}\r\n\r\n").encode() + payload.content
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(raw)
            assert b"200" in s.recv(200)
        recorded(records)
        assert tap.health.counters.get("client_disconnected") == 1
        assert records[0].error_code == "client_disconnected"
        r = httpx.post(url + "/v1/chat/completions", json=body())
        assert r.status_code == 200
