"""Replays KV events and answers, per request, what each worker held when the router chose.

Feed it KV events in arrival order (``apply``: keys and image refs computed by the resident
index at ingest), then evaluate each request once its service is over (``evaluate``): the
index rewinds to the decision time, the chosen worker's blocks are followed to prefill, and
the request's images are named as the engine names them (learned from what it stored).

Without KV events (``mmlens check`` against a router alone), ``served`` makes each earlier
request's blocks resident on its worker: what the request history says could be cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from mmlens.analysis.availability.attribution import attribute
from mmlens.analysis.availability.facts import RequestFacts, facts_of, unit_label
from mmlens.analysis.availability.identity import EngineIdentities, ImageBlock, image_blocks
from mmlens.analysis.availability.index import ResidentKeys
from mmlens.records import Availability, BlockRemoved, BlockStored, KVEvent, RequestTrace

# An engine announces a request's prompt blocks before the request completes; the slack is
# for the offset between the engine's and mmlens' clocks.
CLOCK_SLACK_S = 0.25
SETTLE_S = 2.0  # events may still arrive this long after a request ends


class AvailabilityTracker:
    def __init__(self, horizon_s: float = 900.0) -> None:
        self.index = ResidentKeys(horizon_s)
        self.identities = EngineIdentities(horizon_s)
        self.from_history = False

    def apply(self, events: Iterable[KVEvent]) -> None:
        for ev in events:
            unit = unit_label(ev.worker, ev.rank)
            if isinstance(ev, BlockStored):
                self.apply_keyed(ev.ts, unit, "stored", ev.keys, image_blocks(ev))
            elif isinstance(ev, BlockRemoved):
                self.apply_keyed(ev.ts, unit, "removed", ev.keys)
            else:
                self.apply_keyed(ev.ts, unit, "cleared")

    def apply_keyed(self, ts: float, unit: str, kind: str, keys: Sequence[int] | None = None,
                    images: Sequence[ImageBlock] = ()) -> None:
        """One event as the store keeps it: its blocks' content keys and, for stored image
        blocks, (shape key, content key, image refs)."""
        if kind == "stored":
            if keys:
                self.index.add(ts, unit, keys)
            if images:
                self.identities.stored(ts, unit, images)
        elif kind == "removed":
            if keys:
                self.index.remove(ts, unit, keys)
        else:
            self.index.clear(ts, unit)

    def served(self, facts: RequestFacts) -> None:
        """The history model: a served request leaves its full blocks on its worker."""
        self.from_history = True
        if facts.unit and not facts.failed:
            self.index.add(facts.prefill_ts, facts.unit, facts.history_keys())

    def key_lists(self, facts: RequestFacts) -> list[tuple[tuple[str, ...], Sequence[int]]]:
        """The request's content keys under each naming of its images worth trying."""
        if self.from_history:
            return [(facts.router_ids or facts.content_ids, facts.history_keys())]
        if facts.shapes is None or not facts.content_ids:
            return [(facts.content_ids, facts.content_keys)]
        return [(naming, facts.content_keys if naming == facts.content_ids
                 else facts.shapes.keys(naming))
                for naming in self.identities.namings(facts.content_ids)]

    def evaluate(self, facts: RequestFacts) -> Availability:
        unit = facts.unit
        if facts.shapes is not None and unit and facts.content_ids:
            # A request stores only blocks its worker did not hold when it was routed.
            def held_before(key: int) -> bool:
                return bool(self.index.overlaps([key], facts.ts, units=(unit,)))

            self.identities.learn(unit, facts.ts, facts.done_ts, facts.shapes,
                                  facts.content_ids, held_before, CLOCK_SLACK_S)
        overlaps: dict[str, int] = {}
        prefill = 0
        for naming, keys in self.key_lists(facts):
            found = self.index.overlaps(keys, facts.ts)
            for u, n in found.items():
                overlaps[u] = max(n, overlaps.get(u, 0))
            if facts.unit:
                prefill = max(prefill, self.index.held_through(
                    keys, facts.unit, facts.ts, facts.prefill_ts, found.get(facts.unit, 0)))
            if found and facts.shapes is not None:
                self.identities.confirm(facts.content_ids, naming, facts.shapes,
                                        max(found.values()))
        resolved = self.from_history or self.identities.resolved(facts.content_ids)
        result = attribute(facts, overlaps, prefill, resolved)
        if facts.ts < self.index.rewind_floor:
            result.evidence["rewind_incomplete"] = True
        return result


def replay(events: Iterable[KVEvent], requests: Sequence[RequestFacts],
           tracker: AvailabilityTracker | None = None) -> Iterator[Availability]:
    """Availability of ``requests`` (failed ones skipped) from events sorted by time: each
    request is evaluated once the events up to the end of its service are applied."""
    tracker = tracker or AvailabilityTracker()
    pending = sorted((f for f in requests if not f.failed),
                     key=lambda f: f.done_ts + SETTLE_S)
    i = 0
    batch: list[KVEvent] = []
    for ev in events:
        while i < len(pending) and pending[i].done_ts + SETTLE_S < ev.ts:
            tracker.apply(batch)
            batch = []
            yield tracker.evaluate(pending[i])
            i += 1
        batch.append(ev)
    tracker.apply(batch)
    for facts in pending[i:]:
        yield tracker.evaluate(facts)


def replay_history(requests: Sequence[RequestFacts]) -> list[Availability]:
    """Availability from the requests alone: each one against those served before it."""
    tracker = AvailabilityTracker()
    tracker.from_history = True
    out = []
    for facts in sorted((f for f in requests if not f.failed), key=lambda f: f.ts):
        out.append(tracker.evaluate(facts))
        tracker.served(facts)
    return out


def history_summary(traces: Sequence[RequestTrace]) -> tuple[dict[str, Availability],
                                                             dict[str, Any]]:
    """Each request of a sequence (a scenario) against those before it, and the totals:
    available, realized and avoidable tokens by cause, and false-hit tokens."""
    facts = [f for f in (facts_of(t) for t in traces) if f is not None]
    results = {a.request_id: a for a in replay_history(facts)}
    causes: dict[str, int] = {}
    for a in results.values():
        for c, n in a.causes.items():
            causes[c] = causes.get(c, 0) + n
    total = {"requests": len(results),
             "available_tokens": sum(a.best_tokens for a in results.values()),
             "realized_tokens": sum(a.realized_tokens for a in results.values()),
             "avoidable_tokens": sum(a.avoidable_tokens for a in results.values()),
             "causes": causes,
             "false_hit_tokens": sum(a.false_hit_tokens for a in results.values()),
             "model": "request history (what earlier requests left on each worker)"}
    return results, total
