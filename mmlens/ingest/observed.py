"""Observed requests: what router logs, OTLP spans and the tap each say about one request,
as ``RequestTrace`` fragments merged into one record per request.

A fragment sets only the fields its source knows and records ``provenance[field] = source``;
``merge`` folds fragments sharing a key (request id, response id, engine id, trace id)
field by field, the better-placed source winning (the response the tap saw over a worker's
span over a router log). A field of an observed request without provenance is unknown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import msgspec

from mmlens.ingest.router_logs import request_keys
from mmlens.records import ImageInfo, RequestTrace, RoutingDecision

SOURCE_LOG = "router_log"
SOURCE_OTLP = "otlp"
SOURCE_TAP = "tap"
SOURCE_KV = "kv_events"
SOURCE_MMLENS = "mmlens"
OBSERVED = "observed"

# Who is believed for a field several sources set: the response itself beats a worker's
# span, which beats the router's log; mmlens' own senders saw the response too.
_RANK = {SOURCE_MMLENS: 5, SOURCE_TAP: 4, SOURCE_OTLP: 3, SOURCE_LOG: 2, SOURCE_KV: 1}

MERGED_FIELDS = ("model", "worker", "dp_rank", "status", "prompt_tokens", "cached_tokens",
                 "completion_tokens", "latency_s", "ttft_s", "processing_mode", "error",
                 "error_code", "stream", "rendered_tokens", "ended_by", "sent_seq", "ended_seq")

REQUEST_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses",
                 "/v1/messages")


def source_of(label: str) -> str:
    return label.split(":", 1)[0]


def rank(label: str | None, name: str = "") -> float:
    if not label:
        return 0
    if name == "worker" and label == "otlp:resource":
        # A worker naming itself (service.instance.id) is the deployment's word; the router's
        # name for it is the one its logs, metrics and KV events use.
        return 1.5
    return _RANK.get(source_of(label), 0)


def fragment(request_id: str, source: str, ts: float, router_kind: str = "auto",
             router: str = "") -> RequestTrace:
    """An empty observed record for one request, as one source saw it: every field it has
    not been told is None (or empty), never a default that reads as a value."""
    return RequestTrace(request_id=request_id, router=router, router_kind=router_kind,
                        model="", ts=ts, stream=None, cached_tokens=None, origin=OBSERVED,
                        sources=[source])


_TEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestTrace)
                         if f.type in ("str", "str | None"))


def put(t: RequestTrace, name: str, value: Any, label: str) -> None:
    """Set a field with its provenance (None leaves it unknown, and so does a value that is
    not text for a text field: a log line's ``"model": [1]`` would be stored unreadable)."""
    if value is None or value == "" or (name in _TEXT_FIELDS and not isinstance(value, str)):
        return
    setattr(t, name, value)
    t.provenance[name] = label


def name_router(frags: Iterable[RequestTrace], router: str, label: str) -> None:
    """The configured router's name on fragments that came from it (its log file; spans of
    the one router of their kind) and did not name one themselves."""
    for t in frags:
        if not t.router and router:
            t.router = router
            t.provenance["router"] = label


def alias(t: RequestTrace, rid: Any) -> None:
    if rid and str(rid) != t.request_id and str(rid) not in t.aliases:
        t.aliases.append(str(rid))


_REQUEST_PATH_SET = frozenset(REQUEST_PATHS)


def is_request_path(path: Any) -> bool:
    if type(path) is str and path in _REQUEST_PATH_SET:  # most lines: no query, no slash
        return True
    return isinstance(path, str) and path.split("?", 1)[0].rstrip("/") in REQUEST_PATHS


def keys_of(t: RequestTrace) -> set[str]:
    """Every key another source may know this request by (SMG's requests: none of Dynamo's
    internal ids, two keys fewer to store for each)."""
    dynamo = t.router_kind != "smg"
    keys = request_keys(t.request_id, t.request_id, dynamo)
    if t.response_id and t.response_id != t.request_id:
        keys |= request_keys(t.request_id, t.response_id, dynamo)
    for a in t.aliases:
        keys |= request_keys(a, a, dynamo)
    if t.trace_id:
        keys.add("trace:" + t.trace_id)
    keys.discard("")
    return keys


def known(t: RequestTrace, name: str) -> bool:
    """Whether a field's value was told by some source (always, for mmlens' own traces)."""
    return t.origin != OBSERVED or name in t.provenance


def same_request(a: RequestTrace, b: RequestTrace) -> bool:
    """Whether two records sharing a key may be one request: two that mmlens sent itself
    are one only under the same request id (a router answering every request with one
    response id must not fold them together)."""
    return a.origin == OBSERVED or b.origin == OBSERVED or a.request_id == b.request_id


_fp = msgspec.json.Encoder(enc_hook=str, order="sorted")


def _fingerprint(d: RoutingDecision) -> bytes:
    return _fp.encode(d)


def _merge_images(base: RequestTrace, new: RequestTrace) -> None:
    if not new.images:
        return
    old_label = base.provenance.get("images")
    new_label = new.provenance.get("images", "")
    if base.images and base.origin != OBSERVED:  # mmlens' own images stand
        base.images = _with_identities(base.images, new.images)
        return
    if not base.images or old_label is None:
        base.images = list(new.images)
    elif source_of(old_label) == source_of(new_label) and new_label.endswith(":append"):
        base.images = base.images + list(new.images)  # one log line per image (Dynamo)
    elif rank(new_label) > rank(old_label):
        base.images = _with_identities(list(new.images), base.images)
    else:
        base.images = _with_identities(base.images, new.images)
        return
    base.provenance["images"] = new_label


def _with_identities(keep: list[ImageInfo], other: list[ImageInfo]) -> list[ImageInfo]:
    """``keep``, with what ``other`` knows about the same images (by position) added."""
    if len(keep) != len(other):
        return keep
    for a, b in zip(keep, other, strict=True):
        a.identities = {**b.identities, **a.identities}
        a.width, a.height = a.width or b.width, a.height or b.height
        a.tokens = a.tokens if a.tokens is not None else b.tokens
    return keep


def merge(base: RequestTrace, new: RequestTrace) -> RequestTrace:
    """Fold ``new`` into ``base`` (modified and returned)."""
    if new.origin != OBSERVED and base.origin == OBSERVED:
        return merge(new, base)  # mmlens' own record is the base: its fields stand
    mine = base.origin != OBSERVED
    for name in MERGED_FIELDS:
        label = new.provenance.get(name)
        if label is None:
            continue
        old = base.provenance.get(name)
        # The same source again (a later line of the same log: a retry's worker) is newer.
        if (mine and old is None) or (old is not None and old != label
                                      and rank(old, name) >= rank(label, name)):
            continue
        setattr(base, name, getattr(new, name))
        base.provenance[name] = label
    _merge_images(base, new)
    if new.request_id != base.request_id:
        alias(base, new.request_id)
    for a in new.aliases:
        alias(base, a)
    for unit, at in new.engine_received.items():
        had = base.engine_received.get(unit)
        base.engine_received[unit] = at if had is None else min(had, at)
    base.response_id = base.response_id or new.response_id
    base.trace_id = base.trace_id or new.trace_id
    if not mine or not base.ts:  # mmlens' own send time stands (a log line's is to the second)
        base.ts = min(base.ts, new.ts) if base.ts and new.ts else (base.ts or new.ts)
    if not base.router and new.router:
        base.router = new.router
        if "router" in new.provenance:
            base.provenance["router"] = new.provenance["router"]
    if base.router_kind in ("auto", "") and new.router_kind not in ("auto", ""):
        base.router_kind = new.router_kind
    base.sources = sorted(set(base.sources) | set(new.sources))
    if base.expected_layout is None and new.expected_layout is not None:
        base.expected_layout = new.expected_layout
        base.provenance.setdefault("expected_layout", new.provenance.get("expected_layout",
                                                                         new.sources[0]))
    seen = {_fingerprint(p) for p in base.predictions}
    for p in new.predictions:
        if _fingerprint(p) not in seen:
            base.predictions.append(p)
            seen.add(_fingerprint(p))
    return base


def absorb(base: RequestTrace, f: RequestTrace) -> None:
    """Fold a fragment of the same request from the same source into ``base`` (a later line
    of one log says more): its fields win; images from per-image lines add up."""
    for name, label in f.provenance.items():
        if name == "images":
            if label.endswith(":append") and base.provenance.get("images") == label:
                base.images = base.images + f.images
            else:  # a later line of the same log: what the earlier one said stays
                base.images = _with_identities(f.images, base.images)
        elif name != "expected_layout":
            setattr(base, name, getattr(f, name))
        base.provenance[name] = label
    for a in f.aliases:
        alias(base, a)
    base.trace_id = base.trace_id or f.trace_id
    if f.ts and (not base.ts or f.ts < base.ts):
        base.ts = f.ts
    if base.router_kind == "auto":
        base.router_kind = f.router_kind


def coalesce(fragments: Iterable[RequestTrace]) -> list[RequestTrace]:
    """Fragments of one source with equal request ids folded together (cheap; a full
    ``merge`` by every key happens downstream)."""
    by_id: dict[str, RequestTrace] = {}
    for f in fragments:
        base = by_id.get(f.request_id)
        if base is None:
            by_id[f.request_id] = f
        else:
            absorb(base, f)
    return list(by_id.values())


def merge_all(fragments: Iterable[RequestTrace]) -> list[RequestTrace]:
    """Fragments merged per request (fragments sharing any key are one request)."""
    by_key: dict[str, RequestTrace] = {}
    out: list[RequestTrace] = []
    for f in fragments:
        hits = []
        for k in keys_of(f):
            t = by_key.get(k)
            if t is not None and all(t is not h for h in hits):
                hits.append(t)
        if not hits:
            out.append(f)
            target = f
        else:
            target = hits[0]
            for other in hits[1:]:  # `f` joins two records that were apart so far
                target = merge(target, other)
            target = merge(target, f)
            out = [t for t in out if all(t is not h for h in hits)] + [target]
        for k in keys_of(target):
            by_key[k] = target
    return out
