"""OTLP trace export requests (protobuf bytes) → flat ``SpanRecord`` values.

Total over bad input: a body that does not decode raises ``OtlpError`` (the receiver answers
400 and counts it); spans missing ids, with undecodable attribute values or unknown
attributes are kept with what could be read. Nothing here opens a socket.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from mmlens.records import SpanEvent, SpanRecord

if TYPE_CHECKING:
    from mmlens.ingest.otlp_json import JsonExport

MAX_ATTRIBUTE_CHARS = 2048  # a longer string attribute is cut (prompt text must not pile up)


class OtlpError(ValueError):
    """The body is not an OTLP ExportTraceServiceRequest."""


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        s = v.string_value
        return s if len(s) <= MAX_ATTRIBUTE_CHARS else s[:MAX_ATTRIBUTE_CHARS]
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values[:256]]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()[:MAX_ATTRIBUTE_CHARS]
    return None


# tracing-subscriber bookkeeping on every Rust span and event (SMG, Dynamo): source location,
# thread, busy/idle time. Nothing here reads them; leaving them out halves the decode cost.
_SKIPPED_PREFIXES = ("code.", "thread.")
_SKIPPED = frozenset({"busy_ns", "idle_ns", "target"})


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        key = kv.key  # each field access builds a new Python object: read it once
        if key in _SKIPPED or key.startswith(_SKIPPED_PREFIXES):
            continue
        v = kv.value
        if v.WhichOneof("value") == "string_value":  # most are
            text = v.string_value
            out[key] = text if len(text) <= MAX_ATTRIBUTE_CHARS else text[:MAX_ATTRIBUTE_CHARS]
        else:
            out[key] = _value(v)
    return out


def decode_export(body: bytes) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise OtlpError(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return req


def span_count(req: ExportTraceServiceRequest | JsonExport) -> int:
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def spans_of(req: ExportTraceServiceRequest | JsonExport,
             wanted: Container[str] | None = None) -> list[SpanRecord]:
    """The spans of an export request (protobuf, or OTLP/JSON read into structs of the same
    shape), with their resource's ``service.name``: every span, or those named in ``wanted``
    and those carrying events (decoding the attributes of spans nobody reads is most of the
    cost)."""
    out: list[SpanRecord] = []
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes)
        service = str(resource.get("service.name") or "")
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for sp in ss.spans:
                if wanted is not None and sp.name not in wanted and not sp.events:
                    continue
                out.append(SpanRecord(
                    trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    parent_span_id=sp.parent_span_id.hex() or None, name=sp.name,
                    kind=int(sp.kind), start_ns=int(sp.start_time_unix_nano),
                    end_ns=int(sp.end_time_unix_nano), service=service, scope=scope,
                    attributes=attributes(sp.attributes),
                    status_code=int(sp.status.code), status_message=sp.status.message[:300],
                    resource=resource,
                    events=[SpanEvent(e.name[:MAX_ATTRIBUTE_CHARS], int(e.time_unix_nano),
                                      attributes(e.attributes)) for e in sp.events[:64]]))
    return out


def parse_export(body: bytes, wanted: Container[str] | None = None) -> list[SpanRecord]:
    return spans_of(decode_export(body), wanted)
