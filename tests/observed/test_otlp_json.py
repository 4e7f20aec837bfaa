"""OTLP/HTTP with JSON bodies: the OpenTelemetry JS SDK's real export (chunked, hex ids, numbers
as JSON numbers) arrives as the same spans as its protobuf form; bad JSON is answered 400 with a
JSON Status, counted, and the receiver keeps serving.

The protobuf form is made here by protobuf's own JSON parser (ids turned from hex to base64
first), independently of the msgspec decoder under test."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import socket
import subprocess

import grpc
import httpx
import pytest
from google.protobuf import json_format
from mmlens.collectors.otlp_receiver import OtlpReceiver
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mmlens.ingest.observed_spans import read_spans
from mmlens.ingest.otlp import OtlpError, parse_export, spans_of
from mmlens.ingest.otlp_json import decode_export_json
from tests.fixtures_path import CAPTURES

BODY = (CAPTURES / "otel_js_otlp_export.json").read_bytes()
RAW = json.loads(BODY)  # read independently of the decoder under test
JSON_CT = {"content-type": "application/json"}
PB = {"content-type": "application/x-protobuf"}


def _reference(doc: dict) -> trace_service_pb2.ExportTraceServiceRequest:
    doc = json.loads(json.dumps(doc))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for obj in [sp, *sp.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode()
    return json_format.ParseDict(doc, trace_service_pb2.ExportTraceServiceRequest(),
                                 ignore_unknown_fields=True)


PB_BODY = _reference(RAW).SerializeToString()


def _url(rx: OtlpReceiver) -> str:
    return f"http://127.0.0.1:{rx.http_port}/v1/traces"


def _raw_spans() -> list[tuple[dict, dict]]:
    return [(rs["resource"], sp) for rs in RAW["resourceSpans"] for ss in rs["scopeSpans"]
            for sp in ss["spans"]]


def _raw_value(v: dict) -> object:
    (kind, value), = v.items()
    return {"stringValue": str, "intValue": int, "doubleValue": float,
            "boolValue": bool}[kind](value)


def test_the_js_export_reads_field_by_field() -> None:
    """Each span as the JS SDK wrote it: hex ids, int64 times as strings, typed attributes."""
    spans = spans_of(decode_export_json(BODY))
    raw = _raw_spans()
    assert len(spans) == len(raw) == 3
    for rec, (resource, sp) in zip(spans, raw, strict=True):
        assert rec.trace_id == sp["traceId"] and len(rec.trace_id) == 32
        assert rec.span_id == sp["spanId"] and rec.parent_span_id == sp["parentSpanId"]
        assert (rec.name, rec.kind, rec.status_code) == (sp["name"], sp["kind"], 1)
        assert rec.start_ns == int(sp["startTimeUnixNano"]) > 1_700_000_000 * 10**9
        assert rec.end_ns == int(sp["endTimeUnixNano"]) > rec.start_ns
        assert rec.attributes == {a["key"]: _raw_value(a["value"]) for a in sp["attributes"]}
        assert rec.resource == {a["key"]: _raw_value(a["value"])
                                for a in resource["attributes"]}
        assert [(e.name, e.ts_ns, e.attributes) for e in rec.events] == [
            (e["name"], int(e["timeUnixNano"]),
             {a["key"]: _raw_value(a["value"]) for a in e["attributes"]}) for e in sp["events"]]
    assert sum(len(r.events) for r in spans) == 1


def test_json_and_protobuf_exports_give_the_same_spans(receiver) -> None:
    rx, got = receiver
    url = _url(rx)
    r = httpx.post(url, content=BODY, headers=JSON_CT)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {}
    from_json = list(got)
    got.clear()
    assert httpx.post(url, content=PB_BODY, headers=PB).status_code == 200
    assert got == from_json and len(got) == 3
    got.clear()
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        trace_service_pb2_grpc.TraceServiceStub(ch).Export(_reference(RAW), timeout=5)
    assert got == from_json
    assert rx.health.counters["spans"] == 9 and rx.health.errors == {}


def test_the_observed_request_path_reads_the_worker_fields() -> None:
    frags, decisions = read_spans(spans_of(decode_export_json(BODY)))
    assert decisions == []
    by_id = {f.request_id: f for f in frags}
    assert set(by_id) == {"chatcmpl-js-red-1", "chatcmpl-js-red-2", "chatcmpl-js-text"}
    red2 = by_id["chatcmpl-js-red-2"]
    assert (red2.prompt_tokens, red2.completion_tokens, red2.cached_tokens) == (81, 8, 64)
    assert red2.model == "Qwen/Qwen3-VL-2B-Instruct"
    assert red2.worker == "http://127.0.0.1:8001"  # resource service.instance.id
    assert red2.ttft_s == pytest.approx(0.007)
    assert red2.trace_id == "5bf92f3577b34da6a3ce929d0e0e4737"
    assert red2.provenance["cached_tokens"] == "otlp:llm_request"
    assert by_id["chatcmpl-js-red-1"].cached_tokens == 0


def _chunked(body: bytes, size: int = 500):
    for i in range(0, len(body), size):
        yield body[i:i + size]


def test_gzip_and_chunked_json_are_accepted(receiver) -> None:
    rx, got = receiver
    url = _url(rx)
    gz = {**JSON_CT, "content-encoding": "gzip"}
    assert httpx.post(url, content=gzip.compress(BODY), headers=gz).status_code == 200
    assert httpx.post(url, content=_chunked(BODY), headers=JSON_CT).status_code == 200
    assert httpx.post(url, content=_chunked(gzip.compress(BODY), 100), headers=gz
                      ).status_code == 200
    assert len(got) == 9 and rx.health.errors == {}
    assert rx.health.counters["http_requests"] == 3


BAD_JSON = [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "Expected `object`, got `array`"),
    (b'{"resourceSpans": 5}', "not an OTLP/JSON"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "4bf9-2f35"}]}]}]}',
     "traceId '4bf9-2f35' is not a hex id"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
     "not an OTLP/JSON"),
]


def test_bad_json_is_refused_with_a_status_and_counted(receiver) -> None:
    rx, got = receiver
    url = _url(rx)
    for body, why in BAD_JSON:
        r = httpx.post(url, content=body, headers=JSON_CT)
        assert r.status_code == 400, body
        assert r.headers["content-type"] == "application/json"
        assert why in r.json()["message"], (body, r.text)
    assert got == [] and rx.health.errors == {"malformed_export": len(BAD_JSON)}
    r = httpx.post(url, content=b"\xff garbage", headers=PB)  # a protobuf Status, field 2
    assert r.status_code == 400 and r.content[:1] == b"\x12" and b"not an OTLP" in r.content
    assert httpx.post(url, content=BODY, headers=JSON_CT).status_code == 200  # still serving
    assert len(got) == 3


def _raw_post(port: int, head: bytes, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  + head + b"\r\n" + body)
        s.shutdown(socket.SHUT_WR)  # the client stops sending mid-body
        return s.recv(4096)


def test_chunked_bodies_are_bounded_and_checked(receiver) -> None:
    rx, got = receiver
    url = _url(rx)
    big = (b"x" * 100_000 for _ in range(20))  # 2 MB over a 1 MiB limit
    assert httpx.post(url, content=big, headers=JSON_CT).status_code == 413
    te = b"transfer-encoding: chunked\r\n"
    assert _raw_post(rx.http_port, te, b"zz\r\nab\r\n0\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw_post(rx.http_port, te, b"10\r\nab\r\n0\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert rx.health.errors == {"too_large": 1, "bad_chunking": 2}
    assert got == []
    assert httpx.post(url, content=_chunked(BODY), headers=JSON_CT).status_code == 200


def test_grpc_exports_are_dumped_as_received(tmp_path) -> None:
    req = _reference(RAW)
    with OtlpReceiver(lambda spans: None, grpc_port=0, http_port=0, dump_dir=tmp_path) as rx:
        with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
            trace_service_pb2_grpc.TraceServiceStub(ch).Export(req, timeout=5)
        httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=BODY, headers=JSON_CT)
    (pb,) = tmp_path.glob("*-grpc.pb")
    (js,) = tmp_path.glob("*-http.json")
    assert pb.read_bytes() == req.SerializeToString() and js.read_bytes() == BODY


def test_the_json_mapping_variants() -> None:
    """Enum names, int64 as numbers or strings, "NaN", bytes and base64 ids, unknown fields;
    the same spans as protobuf's own JSON parser reads (hex ids aside)."""
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
         "kind": "SPAN_KIND_CLIENT", "startTimeUnixNano": 5, "endTimeUnixNano": "7",
         "status": {"code": "STATUS_CODE_ERROR", "message": "boom"}, "somethingNew": {"x": 1},
         "flags": 769, "traceState": "a=b", "links": [{"traceId": "ff" * 16}],
         "events": [{"name": "e", "timeUnixNano": "6", "attributes": []}],
         "attributes": [{"key": "n", "value": {"intValue": "9007199254740993"}},
                        {"key": "m", "value": {"intValue": -3}},
                        {"key": "d", "value": {"doubleValue": "-Infinity"}},
                        {"key": "f", "value": {"doubleValue": 2}},
                        {"key": "t", "value": {"boolValue": True}},
                        {"key": "b", "value": {"bytesValue": "AQI="}},
                        {"key": "a", "value": {"arrayValue": {"values": [
                            {"stringValue": "x"}, {"kvlistValue": {"values": [
                                {"key": "k", "value": {"intValue": 1}}]}}]}}},
                        {"key": "empty", "value": {}}]}]}]}]}
    (rec,) = spans_of(decode_export_json(json.dumps(doc).encode()))
    assert rec == parse_export(_reference(doc).SerializeToString())[0]
    assert (rec.trace_id, rec.kind, rec.start_ns, rec.end_ns, rec.status_code) == (
        "0af7651916cd43dd8448eb211c80319c", 3, 5, 7, 2)
    assert rec.attributes == {"n": 9007199254740993, "m": -3, "d": float("-inf"), "f": 2.0,
                              "t": True, "b": "0102", "a": ["x", {"k": 1}], "empty": None}
    b64 = {"traceId": base64.b64encode(bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
                                       ).decode(), "spanId": "AAECAwQFBgc="}
    (sp,) = spans_of(decode_export_json(json.dumps(
        {"resourceSpans": [{"scopeSpans": [{"spans": [b64]}]}]}).encode()))
    assert (sp.trace_id, sp.span_id) == ("0af7651916cd43dd8448eb211c80319c", "0001020304050607")
    for bad in ('{"spanId": "xyz"}', '{"traceId": "4bf9 2f35"}', '{"kind": 1.5}',
                '{"startTimeUnixNano": "-1"}', '{"startTimeUnixNano": 18446744073709551616}',
                '{"attributes": [{"key": "k", "value": {"intValue": "9223372036854775808"}}]}',
                '{"attributes": [{"key": "k", "value": {"doubleValue": "many"}}]}',
                '{"attributes": [{"key": "k", "value": {"bytesValue": "%%"}}]}'):
        with pytest.raises(OtlpError, match=r"\$\.resourceSpans\[0\]"):
            decode_export_json(b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + bad.encode()
                               + b"]}]}]}")


def test_one_connection_carries_on_after_refusals(receiver) -> None:
    """Keep-alive, as exporters use it: a refused export does not leave its body in the way."""
    rx, got = receiver
    url = _url(rx)
    with httpx.Client() as client:
        assert client.post(url.replace("traces", "logs"), content=BODY, headers=JSON_CT
                           ).status_code == 404
        assert client.post(url, content=b"{", headers=JSON_CT).status_code == 400
        assert client.post(url, content=BODY, headers={"content-type": "text/csv"}
                           ).status_code == 415
        assert client.post(url, content=_chunked(BODY), headers=JSON_CT).status_code == 200
        assert client.post(url, content=BODY, headers=JSON_CT).status_code == 200
    assert len(got) == 6


JS_DIR = CAPTURES / "otel_js"


@pytest.mark.live
@pytest.mark.skipif(shutil.which("node") is None or not (JS_DIR / "node_modules").is_dir(),
                    reason="node or the OpenTelemetry JS SDK absent (npm ci in otel_js/)")
def test_the_real_js_exporter_is_received(receiver) -> None:
    """The OpenTelemetry JS SDK itself (chunked JSON, then gzip) to the receiver: every span
    arrives and nothing is refused."""
    rx, got = receiver
    for env in ({}, {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}):
        subprocess.run(["node", "export.mjs", _url(rx)], cwd=JS_DIR, check=True, timeout=60,
                       capture_output=True, env={**os.environ, **env})
    assert rx.health.errors == {} and rx.health.counters["http_requests"] == 2
    frags, _ = read_spans(got)
    assert sorted(f.request_id for f in frags) == sorted(
        ["chatcmpl-js-red-1", "chatcmpl-js-red-2", "chatcmpl-js-text"] * 2)
    assert {f.cached_tokens for f in frags} == {0, 64}
