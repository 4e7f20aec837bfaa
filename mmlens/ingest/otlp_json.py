"""OTLP/JSON trace export bodies → ``ExportTraceServiceRequest``, so the rest is as for protobuf.

The OTLP JSON mapping is proto3's JSON mapping with three differences: trace and span ids are
hex strings (not base64), enums are integers (names are accepted too), and field names are
lowerCamelCase (the proto names are accepted too). Unknown fields are ignored. The ids are
turned into base64 here and the document is then read by protobuf's own JSON parser.
Total over bad input: anything that is not such a document raises ``OtlpError``.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mmlens.ingest.otlp import OtlpError

_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
_DECODER = msgspec.json.Decoder()


def _hex_to_b64(key: str, value: Any) -> Any:
    """A hex id as base64 (protobuf's JSON form of bytes). Lengths are not checked: a
    wrong-length id is kept as sent, as the protobuf path does."""
    if not isinstance(value, str):
        return value  # the protobuf parser names the wrong type
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise OtlpError(f"{key} {value[:40]!r} is not hex (OTLP/JSON ids are hex strings, "
                        "not base64)") from None
    return base64.b64encode(raw).decode("ascii")


def _fix_ids(obj: dict[str, Any]) -> None:
    for key in _ID_FIELDS:
        if key in obj:
            obj[key] = _hex_to_b64(key, obj[key])


def _each(parent: Any, *keys: str) -> list[Any]:
    """The dict items of the first of ``keys`` present in ``parent`` (a list); [] otherwise."""
    if not isinstance(parent, dict):
        return []
    for key in keys:
        if key in parent:
            items = parent[key]
            return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []
    return []


def _ids_to_base64(doc: dict[str, Any]) -> None:
    for rs in _each(doc, "resourceSpans", "resource_spans"):
        for ss in _each(rs, "scopeSpans", "scope_spans"):
            for sp in _each(ss, "spans"):
                _fix_ids(sp)
                for link in _each(sp, "links"):
                    _fix_ids(link)


def decode_export_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        doc = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise OtlpError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpError(f"an OTLP/JSON export is an object, not {type(doc).__name__}")
    _ids_to_base64(doc)
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError,
            RecursionError) as exc:
        raise OtlpError(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return req
