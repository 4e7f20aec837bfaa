"""The built-in OTLP receiver on 127.0.0.1: gRPC and HTTP/protobuf exports of real captures
arrive as spans; bad input gets a clear error, is counted, and the receiver keeps serving."""

from __future__ import annotations

import gzip
import os

import grpc
import httpx
import pytest
from mmlens.collectors.otlp_receiver import OtlpReceiver
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mmlens.ingest.otlp import OtlpError, parse_export
from mmlens.records import SpanRecord
from tests.fixtures_path import CAPTURES

EXPORT = (CAPTURES / "dynamo_1.6.1_otlp_export_3.pb").read_bytes()
PB = {"content-type": "application/x-protobuf"}
SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def test_http_and_grpc_exports_become_spans(receiver) -> None:
    rx, got = receiver
    assert rx.host == "127.0.0.1"
    url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
    r = httpx.post(url, content=EXPORT, headers=PB)
    assert r.status_code == 200
    n = len(parse_export(EXPORT))
    assert len(got) == n > 0
    r = httpx.post(url, content=gzip.compress(EXPORT), headers={**PB, "content-encoding": "gzip"})
    assert r.status_code == 200 and len(got) == 2 * n
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(EXPORT)
        stub.Export(req, timeout=5)
    assert len(got) == 3 * n
    assert rx.health.counters["spans"] == 3 * n


def test_bad_input_is_refused_and_counted(receiver) -> None:
    rx, got = receiver
    url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
    assert httpx.post(url, content=b"\xff\x00garbage", headers=PB).status_code == 400
    assert httpx.post(url, content=EXPORT, headers={"content-type": "text/plain"}
                      ).status_code == 415
    assert httpx.post(url, content=os.urandom(2 << 20), headers=PB).status_code == 413
    assert httpx.post(url.replace("traces", "logs"), content=EXPORT, headers=PB
                      ).status_code == 404
    gz = {**PB, "content-encoding": "gzip"}
    bomb = gzip.compress(b"\x00" * (4 << 20))  # inflates past the limit
    assert httpx.post(url, content=bomb, headers=gz).status_code == 413
    assert httpx.post(url, content=gzip.compress(EXPORT)[:-12], headers=gz).status_code == 400
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        export = ch.unary_unary(f"/{SERVICE}/Export")  # raw bytes, not a message
        with pytest.raises(grpc.RpcError) as err:
            export(b"\x0a\xff\xff\xff", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OTLP" in err.value.details()
    assert got == []
    assert rx.health.errors == {"malformed_export": 2, "unsupported_media_type": 1,
                                "too_large": 2, "not_found": 1, "bad_gzip": 1}
    assert httpx.post(url, content=EXPORT, headers=PB).status_code == 200  # still serving
    assert got


def test_a_failing_sink_does_not_stop_the_receiver() -> None:
    calls = []

    def sink(spans: list[SpanRecord]) -> None:
        calls.append(len(spans))
        raise RuntimeError("store is gone")

    with OtlpReceiver(sink, grpc_port=None, http_port=0) as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        assert httpx.post(url, content=EXPORT, headers=PB).status_code == 200
        assert httpx.post(url, content=EXPORT, headers=PB).status_code == 200
        assert len(calls) == 2 and rx.health.errors == {"sink": 2}


def test_malformed_and_unknown_content_parse_totally() -> None:
    with pytest.raises(OtlpError):
        parse_export(b"\x0a\xff\xff\xff")
    req = trace_service_pb2.ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.name = "something_else"  # no ids, unknown name, unknown attributes
    kv = sp.attributes.add()
    kv.key, kv.value.string_value = "x.unknown", "y" * 10_000
    (rec,) = parse_export(req.SerializeToString())
    assert rec.trace_id == "" and rec.parent_span_id is None
    assert len(rec.attributes["x.unknown"]) == 2048  # long strings are cut


def test_wanted_names_decode_only_the_spans_read() -> None:
    """With ``wanted``, spans of other names (and no events) are counted, not handed on."""
    got: list[SpanRecord] = []
    everything = parse_export(EXPORT)
    names = {sp.name for sp in everything}
    keep = sorted(names)[:1]
    with OtlpReceiver(got.extend, grpc_port=None, http_port=0, wanted=keep) as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        assert httpx.post(url, content=EXPORT, headers=PB).status_code == 200
    expected = [sp for sp in everything if sp.name in keep or sp.events]
    assert [(sp.name, sp.span_id) for sp in got] == [(sp.name, sp.span_id) for sp in expected]
    assert len(expected) < len(everything)
    assert rx.health.counters["spans"] == len(everything)
    assert rx.health.counters["spans_read"] == len(expected)
