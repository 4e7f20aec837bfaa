"""Requests by origin and source, and each field of a request with the source that told it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mmlens.ingest.observed import known
from mmlens.records import RequestTrace


def as_trace(t: RequestTrace | dict[str, Any]) -> RequestTrace:
    """A record from a stored trace body (dict) or the record itself."""
    if isinstance(t, RequestTrace):
        return t
    return msgspec.convert(t, RequestTrace, strict=False)


def by_origin(traces: Sequence[RequestTrace]) -> dict[str, Any]:
    """Requests by origin and by source (for the snapshot's ``observed``)."""
    origins: dict[str, int] = {}
    sources: dict[str, int] = {}
    for t in traces:
        origins[t.origin] = origins.get(t.origin, 0) + 1
        for s in t.sources or [t.origin]:
            sources[s] = sources.get(s, 0) + 1
    return {"requests": len(traces), "by_origin": origins, "by_source": sources}


FIELDS = ("worker", "model", "status", "prompt_tokens", "cached_tokens", "completion_tokens",
          "latency_s", "ttft_s", "processing_mode", "rendered_tokens", "images")


def field_rows(t: RequestTrace | dict[str, Any]) -> list[dict[str, Any]]:
    """Each field of a request with its value and the source that told it, or "unknown"."""
    rec = as_trace(t)
    rows = []
    for name in FIELDS:
        value: Any = getattr(rec, name)
        if name == "images":
            value = len(value) if value else None
        if known(rec, name) and (name != "images" or value is not None):
            source = rec.provenance.get(name, rec.origin)
            rows.append({"field": name, "value": value, "source": source})
        else:
            rows.append({"field": name, "value": None, "source": "unknown"})
    return rows
