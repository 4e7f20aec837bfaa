"""A recorded request explained: what the pure explainers need, gathered from the reader.

``explain_recorded`` (``mmlens.analysis.explain``: the trace, the traces before it, KV
removals, workers the router gets no events from) for requests with an expected layout;
``judge_recorded`` (``mmlens.analysis.verdicts``: the request with its logged decisions, the
serving worker's KV events while it was served, its removals shortly before) for any source.
``mmlens explain`` and the inspector page both use them.
"""

from __future__ import annotations

import time

from mmlens.analysis.explain import Explanation, explain
from mmlens.analysis.verdicts import Judgement, StoredWhileServed, judge
from mmlens.records import RequestTrace
from mmlens.store.reader import StoreReader

HISTORY = 5000

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


def block_size_of(trace: RequestTrace, default: int = 16) -> int:
    lay = trace.expected_layout
    return lay.block_size if lay is not None and lay.block_size else default


def events_unavailable(reader: StoreReader, until: float) -> set[str]:
    """Workers SMG marks `smg_kv_events_unavailable` (the router is blind to them)."""
    rows = reader.samples(until - 600, ["smg_kv_events_unavailable"])
    return {s.label("worker") for s in rows if s.value > 0 and s.ts <= until + 60}


def explain_recorded(reader: StoreReader, request_id: str,
                     history_limit: int = HISTORY) -> Explanation | None:
    trace = reader.trace(request_id)
    if trace is None:
        return None
    ts = trace.ts or time.time()
    history = reader.traces_before(ts, history_limit)
    since = min((t.ts or ts for t in history), default=ts)
    return explain(trace, history, block_size_of(trace),
                   removed_events=reader.removals(since, ts),
                   events_unavailable=events_unavailable(reader, ts))
