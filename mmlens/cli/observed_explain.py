"""Verdicts for stored requests of any source: gathers from a store what
``mmlens.analysis.verdicts.judge`` needs (the request with its logged decisions, the serving
worker's KV events while it was served, its removals shortly before)."""

from __future__ import annotations

from mmlens.analysis.verdicts import Judgement, StoredWhileServed, judge
from mmlens.records import RequestTrace
from mmlens.store.reader import StoreReader

EVICTION_WINDOW_S = 300.0
KV_SLACK_S = 0.3  # events reach the store stamped up to this long after the engine's work


def dispatch_ts(t: RequestTrace) -> float:
    """When the router dispatched it: SMG's cache trace has nanoseconds, log lines seconds."""
    exact = [p.ts for p in t.predictions if p.ts is not None and p.source.endswith("cache_trace")]
    return min(exact) if exact else t.ts


def stored_while_served(reader: StoreReader, t: RequestTrace) -> StoredWhileServed | None:
    """What the serving worker newly stored while serving ``t`` — None when unknown: no KV
    events from it, no latency, or another request on it at the same time."""
    if not t.worker or t.latency_s is None or not reader.has_kv_events(t.worker):
        return None
    start = dispatch_ts(t)
    end = start + float(t.latency_s) + KV_SLACK_S
    for o in reader.with_decisions(reader.traces_between(start - 600.0, end)):
        if o.request_id == t.request_id or o.worker != t.worker:
            continue
        o_start = dispatch_ts(o)
        o_end = o_start + float(o.latency_s or 0.0) + KV_SLACK_S
        if o_start < end and start < o_end:
            return None  # two requests on one worker: its events cannot be told apart
    blocks = reader.kv_blocks(t.worker, "stored", start, end)
    return StoredWhileServed(blocks, blocks > 0 and reader.first_stored_parent(
        t.worker, start, end) is None)


def judge_recorded(reader: StoreReader, request_id: str) -> Judgement | None:
    t = reader.trace(request_id)
    if t is None:
        return None
    removed = 0
    if t.worker:
        start = dispatch_ts(t)
        removed = reader.kv_blocks(t.worker, "removed", start - EVICTION_WINDOW_S, start)
    return judge(t, stored=stored_while_served(reader, t), removed_blocks=removed)
