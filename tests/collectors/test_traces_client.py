"""Per-request traces against recorded SMG and Dynamo responses (MockTransport)."""

from __future__ import annotations

import json

import httpx
import pytest
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

from tests.fixtures_path import capture


def _dyn_chat_body() -> dict:
    text = capture("dyn_chat_text_1.txt")
    return json.loads(text[text.index("}\n{") + 2:])


def _client(handler) -> TraceClient:
    return TraceClient(httpx.Client(transport=httpx.MockTransport(handler)))


def test_smg_grpc_response_with_cache_trace_header() -> None:
    header = json.dumps(json.loads(capture("smg_cache_trace_header_sample.json")))
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, headers={
            "x-smg-routed-worker-id": "grpc://127.0.0.1:50051",
            "x-request-id": "chatcmpl-CSyyXlD3bnmOG59SYUfh2NcO", "x-smg-cache-trace": header,
        }, json={"id": "chatcmpl-CSyyXlD3bnmOG59SYUfh2NcO-01a2", "choices": [],
                 "usage": {"prompt_tokens": 81, "completion_tokens": 8, "total_tokens": 89,
                           "prompt_tokens_details": {"cached_tokens": 80}}})

    png = solid_png(64, 64)
    t = _client(handler).send("http://smg", "Qwen/Qwen3-VL-2B-Instruct", "Describe",
                              [ImagePart(png)], router_kind="smg", request_id="demo-img-1")
    body = seen[0]
    part = body["messages"][0]["content"][0]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith(
        "data:image/png;base64,")
    assert "nvext" not in body
    assert (t.status, t.worker, t.prompt_tokens, t.cached_tokens) == (
        200, "grpc://127.0.0.1:50051", 81, 80)
    assert t.response_id == "chatcmpl-CSyyXlD3bnmOG59SYUfh2NcO"
    (pred,) = t.predictions
    assert (pred.branch, pred.overlap_blocks, pred.request_blocks) == ("event_hit", 5, 5)
    (img,) = t.images
    assert (img.url_kind, img.width, img.height, img.byte_size) == ("data", 64, 64, len(png))
    assert len(img.identities["smg_blake3"]) == 64
    assert len(img.identities["dynamo_mm_hash_url"]) == 16
    assert t.latency_s is not None and t.error is None


def test_cached_tokens_absent_means_zero() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"x-smg-routed-worker-id": "http://w1"},
                              json={"id": "x", "usage": {"prompt_tokens": 81}})

    t = _client(handler).send("http://smg", "m", "hi")
    assert (t.cached_tokens, t.router_kind) == (0, "smg")


def test_dynamo_non_streaming_capture() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, headers={"x-request-id": "dyn-txt-1"}, json=_dyn_chat_body())

    t = _client(handler).send("http://dyn", "Qwen/Qwen3-0.6B", "hello", router_kind="dynamo",
                              request_id="dyn-txt-1")
    assert seen[0]["nvext"] == {"extra_fields": ["worker_id", "timing"]}
    assert (t.worker, t.dp_rank, t.prompt_tokens, t.cached_tokens) == (
        "12300356780531823171", 0, 27, 0)
    (pred,) = t.predictions
    assert (pred.source, pred.kv_hit_rate, pred.overlap_blocks) == ("nvext.timing", 0.0, None)
    assert t.ttft_s == pytest.approx(0.013159747)


def test_dynamo_mm_responses_capture_router_predicted_miss_engine_hit() -> None:
    bodies = json.loads(capture("dyn_mm_responses.json"))
    it = iter(bodies)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(it))

    client = _client(handler)
    traces = [client.send("http://dyn", "Qwen/Qwen3-VL-2B-Instruct", "x",
                          [ImagePart(url="http://127.0.0.1:9/red.png")]) for _ in bodies]
    assert {t.router_kind for t in traces} == {"dynamo"}
    assert [t.cached_tokens for t in traces] == [16] * 7
    assert [t.predictions[0].kv_hit_rate for t in traces] == [1.0] * 5 + [0.0, 1.0]
    assert traces[0].images[0].url_kind == "http"


def test_dynamo_streaming_capture() -> None:
    raw = capture("dyn_stream_sample.txt")
    sse = raw[raw.index("data:"):]

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream_options"] == {"include_usage": True}
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=sse.encode())

    t = _client(handler).send("http://dyn", "Qwen/Qwen3-VL-2B-Instruct", "x", stream=True,
                              router_kind="dynamo")
    assert (t.worker, t.prompt_tokens, t.cached_tokens, t.completion_tokens) == (
        "14071441768237774370", 13, 0, 3)
    assert t.response_id == "chatcmpl-3a4a400c-c79b-432f-a000-79f9d02f5959"
    assert t.ttft_s is not None and t.ttft_s <= t.latency_s
    assert t.predictions[0].kv_hit_rate == 0.0 and t.error is None


@pytest.mark.parametrize(("status", "headers", "body", "code"), [
    (503, {"x-smg-error-code": "no_media_ref_capable_worker"},
     {"error": {"message": "no worker", "code": "no_media_ref_capable_worker"}},
     "no_media_ref_capable_worker"),
    (400, {}, {"error": {"message": "this model's image placeholder is not expandable",
                         "code": "multimodal_worker_processing_unsupported_model"}},
     "multimodal_worker_processing_unsupported_model"),
    (400, {}, {"error": "bad", "code": "multimodal_processing_failed"},
     "multimodal_processing_failed"),
])
def test_router_errors_keep_the_error_code(status, headers, body, code) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, json=body)

    for stream in (False, True):
        t = _client(handler).send("http://smg", "m", "x", [ImagePart(b"not an image")],
                                  stream=stream)
        assert (t.status, t.error_code) == (status, code)
        assert t.error


def test_unreachable_router() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    t = _client(handler).send("http://smg", "m", "x")
    assert (t.error_code, t.status) == ("unreachable", None)


def test_a_layout_the_core_refuses_is_recorded_not_raised() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "x"})

    client = TraceClient(httpx.Client(transport=httpx.MockTransport(handler)),
                         sink=TraceSink(layout_model="no-such-family"))
    t = client.send("http://r", "m", "x", [ImagePart(solid_png(64, 64))])
    assert t.status == 200 and t.images[0].width == 64
    assert t.expected_layout is not None and not t.expected_layout.ok
    assert t.expected_layout.to_json()["error"].startswith("UnknownFamilyError: ")
    client.sink = TraceSink(layout_model="qwen3-vl")
    broken = client.send("http://r", "m", "x", [ImagePart(b"\x89PNG not really")])
    assert broken.images[0].byte_size == 15 and broken.images[0].width is None
    assert broken.expected_layout is not None
    assert broken.expected_layout.to_json()["error"].startswith("ImageError: ")
