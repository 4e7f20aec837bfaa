"""OTLP/JSON trace export bodies, read into typed structs that ``otlp.spans_of`` reads as it reads
the protobuf message (same field names, ids as bytes, ``WhichOneof`` on values).

The OTLP JSON mapping is proto3's JSON mapping with lowerCamelCase field names (the proto's own
names are not valid keys), trace and span ids as hex strings (not base64; a padded base64 id is
read too) and enums as integers (their names are accepted too); 64-bit integers come as strings
or numbers, doubles may be "NaN"/"Infinity", bytes values are base64. Unknown fields are
ignored. msgspec decodes in C; protobuf's own JSON parser (reflection in
Python) read 11× fewer spans a second. Total over bad input: anything else raises ``OtlpError``.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Annotated

import msgspec
from msgspec import Meta, Struct, field

from mmlens.ingest.otlp import OtlpError

Int64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Uint64 = Annotated[int, Meta(ge=0)]  # < 2**64: checked after decoding
_INT = re.compile(r"-?[0-9]{1,20}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_SPAN_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
               "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_ONEOF = ("string_value", "int_value", "double_value", "bool_value", "array_value",
          "kvlist_value", "bytes_value")


def _int(value: int | str, lo: int, hi: int, what: str) -> int:
    n = int(value) if isinstance(value, str) and _INT.fullmatch(value) else value
    if not isinstance(n, int) or not lo <= n < hi:
        raise ValueError(f"{what} {value!r:.40} is not an integer in [{lo}, {hi})")
    return n


def _uint64(value: int | str, what: str) -> int:
    return _int(value, 0, 1 << 64, what)


def _id(value: str | None, what: str) -> bytes:
    """A hex id as bytes. Some exporters send protobuf's default JSON form (base64) instead:
    a padded base64 id of 16 or 8 bytes has a '=' and so is never hex, and is read as well."""
    if not value:
        return b""
    if _HEX.fullmatch(value):
        return bytes.fromhex(value)
    if value.endswith("=") and len(value) in (12, 24):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise ValueError(f"{what} {value[:40]!r} is not a hex id")


def _enum(value: int | str, names: dict[str, int]) -> int:
    return names.get(value, 0) if isinstance(value, str) else value


class _ArrayValue(Struct, rename="camel"):
    values: list[_AnyValue] = []


class _KeyValueList(Struct, rename="camel"):
    values: list[_KeyValue] = []


class _AnyValue(Struct, rename="camel"):
    string_value: str | None = None
    bool_value: bool | None = None
    int_value: Int64 | str | None = None
    double_value: float | str | None = None
    array_value: _ArrayValue | None = None
    kvlist_value: _KeyValueList | None = None
    bytes_value: str | None = None  # base64; bytes once read

    def __post_init__(self) -> None:
        if isinstance(self.int_value, str):
            self.int_value = _int(self.int_value, -(1 << 63), 1 << 63, "intValue")
        if isinstance(self.double_value, str):
            if self.double_value not in _FLOATS:
                raise ValueError(f"doubleValue {self.double_value[:40]!r} is not a number")
            self.double_value = _FLOATS[self.double_value]
        if isinstance(self.bytes_value, str):
            text = self.bytes_value.replace("-", "+").replace("_", "/")  # URL-safe too
            try:
                self.bytes_value = base64.b64decode(  # type: ignore[assignment]
                    text + "=" * (-len(text) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"bytesValue {text[:40]!r} is not base64") from None

    def WhichOneof(self, _: str) -> str | None:  # as the protobuf message answers it
        for name in _ONEOF:
            if getattr(self, name) is not None:
                return name
        return None


class _KeyValue(Struct, rename="camel"):
    key: str = ""
    value: _AnyValue = field(default_factory=_AnyValue)


class _Event(Struct, rename="camel"):
    time_unix_nano: Uint64 | str = 0
    name: str = ""
    attributes: list[_KeyValue] = []

    def __post_init__(self) -> None:
        self.time_unix_nano = _uint64(self.time_unix_nano, "timeUnixNano")


class _Status(Struct, rename="camel"):
    message: str = ""
    code: int | str = 0

    def __post_init__(self) -> None:
        self.code = _enum(self.code, _STATUS_CODES)


class _Span(Struct, rename="camel"):
    trace_id: str | None = None  # hex; bytes once read
    span_id: str | None = None
    parent_span_id: str | None = None
    name: str = ""
    kind: int | str = 0
    start_time_unix_nano: Uint64 | str = 0
    end_time_unix_nano: Uint64 | str = 0
    attributes: list[_KeyValue] = []
    events: list[_Event] = []
    status: _Status = field(default_factory=_Status)

    def __post_init__(self) -> None:
        self.trace_id = _id(self.trace_id, "traceId")  # type: ignore[assignment]
        self.span_id = _id(self.span_id, "spanId")  # type: ignore[assignment]
        self.parent_span_id = _id(self.parent_span_id, "parentSpanId")  # type: ignore[assignment]
        self.kind = _enum(self.kind, _SPAN_KINDS)
        self.start_time_unix_nano = _uint64(self.start_time_unix_nano, "startTimeUnixNano")
        self.end_time_unix_nano = _uint64(self.end_time_unix_nano, "endTimeUnixNano")


class _Scope(Struct, rename="camel"):
    name: str = ""


class _ScopeSpans(Struct, rename="camel"):
    scope: _Scope = field(default_factory=_Scope)
    spans: list[_Span] = []


class _Resource(Struct, rename="camel"):
    attributes: list[_KeyValue] = []


class _ResourceSpans(Struct, rename="camel"):
    resource: _Resource = field(default_factory=_Resource)
    scope_spans: list[_ScopeSpans] = []


class JsonExport(Struct, rename="camel"):
    """An ``ExportTraceServiceRequest`` read from OTLP/JSON (only the fields mmlens reads)."""

    resource_spans: list[_ResourceSpans] = []


_DECODER = msgspec.json.Decoder(JsonExport)


def decode_export_json(body: bytes) -> JsonExport:
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise OtlpError(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise OtlpError(f"not JSON: {exc}") from None
