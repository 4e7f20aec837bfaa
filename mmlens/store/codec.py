"""Typed records ↔ stored rows.

Trace and decision bodies are the JSON of their dataclass (``RequestTrace.to_json``,
``asdict(RoutingDecision)``), written without the fields at their defaults since the
compact bodies (``compact_bodies``); a field left out, or added since a body was written,
decodes to its default and unknown fields are ignored. A body that does not decode is skipped and
logged, never fatal: one bad row must not hide the rest of a page (the row stays stored).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from mmlens.records import KVEventRow, RequestTrace, ResidentSummary, RoutingDecision, Verdict
from mmlens.store.compact_bodies import compact
from mmlens.store.mirror import struct_mirror

log = logging.getLogger("mmlens.store")

T = TypeVar("T")

_json = msgspec.json.Encoder(enc_hook=str)


_TRACE_FIELDS = tuple(f.name for f in dataclasses.fields(RequestTrace))


def trace_body(t: RequestTrace) -> str:
    """``RequestTrace.to_json`` as JSON text, without its deep copy (msgspec encodes the
    nested records as they are), less the fields at their defaults (``compact_bodies``)."""
    if t.expected_layout is None:
        return _json.encode(compact([t])[0]).decode()
    out = {name: getattr(t, name) for name in _TRACE_FIELDS}  # the layout as its own JSON
    out["expected_layout"] = t.expected_layout.to_json()
    return _json.encode(out).decode()


_VERDICT_FIELDS = tuple(f.name for f in dataclasses.fields(Verdict))


def verdict_body(v: Verdict) -> str:
    """``Verdict.as_json`` as JSON text, without its deep copy (the verdict job writes one
    per request)."""
    out = {name: getattr(v, name) for name in _VERDICT_FIELDS}
    out.update(realized_tokens=v.realized_tokens, best_tokens=v.best_tokens)
    return _json.encode(out).decode()


def decision_body(d: RoutingDecision) -> str:
    """A decision as JSON text (what ``json.dumps(asdict(d))`` wrote, faster)."""
    return _json.encode(d).decode()


def decisions_body(ds: list[RoutingDecision]) -> str:
    """A ``decisions`` row's body: a JSON array of the decisions, each less the fields at
    their defaults (``compact_bodies``)."""
    return _json.encode(compact(ds)).decode()


class TraceLabels(msgspec.Struct):
    """What the exporter labels a request by: read from a stored trace without decoding its
    layout, images and predictions (a tenth of the time on image requests)."""

    request_id: str
    ts: float
    router: str
    model: str
    worker: str | None = None


_trace_dec = msgspec.json.Decoder(RequestTrace)
_labels_dec = msgspec.json.Decoder(TraceLabels)
_decision_dec = msgspec.json.Decoder(RoutingDecision)
_decisions_dec = msgspec.json.Decoder(list[RoutingDecision])
_hashes_dec = msgspec.msgpack.Decoder()
_resident_dec = msgspec.json.Decoder(ResidentSummary)


def _decode(body: str | bytes, decoder: msgspec.json.Decoder[T], kind: type[T]) -> T | None:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        pass
    # Python's json writes NaN/Infinity and older rows may hold 3.0 where an int is due:
    # a lax second pass before giving up.
    try:
        return msgspec.convert(json.loads(body), kind, strict=False)
    except (ValueError, TypeError, msgspec.ValidationError) as exc:
        log.warning("skipping an undecodable stored %s: %s", getattr(kind, "__name__", kind),
                    exc)
        return None


def trace(body: str | bytes) -> RequestTrace | None:
    return _decode(body, _trace_dec, RequestTrace)


def trace_labels(bodies: Iterable[str | bytes]) -> list[TraceLabels]:
    return [t for t in (_decode(b, _labels_dec, TraceLabels) for b in bodies) if t is not None]


def traces(bodies: Iterable[str | bytes]) -> list[RequestTrace]:
    return [t for t in map(trace, bodies) if t is not None]


# The write path's read-back: the records' Struct mirrors accept exactly what their
# decoders above accept, ~1.5x faster (no dataclass built).
folded_dec = msgspec.json.Decoder(list[list[struct_mirror(RoutingDecision)]])  # decisions rows
traces_dec = msgspec.json.Decoder(list[struct_mirror(RequestTrace)])


def all_read_back(bodies: list[str], decoder: msgspec.json.Decoder[list[Any]]) -> bool:
    """Every body decodes strictly as its reader decodes it, in one decode of them all
    (``folded_dec`` or ``traces_dec``); a False says only that one might not: check each
    then."""
    try:
        return len(decoder.decode("[" + ",".join(bodies) + "]")) == len(bodies)
    except (msgspec.DecodeError, UnicodeError):
        return False


def decision(body: str | bytes) -> RoutingDecision | None:
    """One ``decision_body``."""
    return _decode(body, _decision_dec, RoutingDecision)


def decisions(bodies: Iterable[str | bytes]) -> list[RoutingDecision]:
    """The decisions of ``decisions`` rows (each body an array of them), in row order."""
    out: list[RoutingDecision] = []
    for body in bodies:
        found = _decode(body, _decisions_dec, list[RoutingDecision])
        if found is not None:
            out += found
    return out


def json_dict(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def resident(summary: str, updated: float) -> ResidentSummary | None:
    row = _decode(summary, _resident_dec, ResidentSummary)
    if row is not None:
        row.updated = updated
    return row


def block_hash(value: str | None) -> int | str | None:
    """A parent hash as stored (text): the engine's int, or its hex string."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def kv_row(row: tuple[Any, ...]) -> KVEventRow:
    ts, worker, rank, seq, kind, n, parent, hashes, images = row
    return KVEventRow(ts, worker, rank, seq, kind, n, block_hash(parent),
                      _hashes_dec.decode(hashes) if hashes else [],
                      json.loads(images) if images else [])
