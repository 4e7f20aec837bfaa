"""Evaluates available vs achieved for every stored request once its service is over.

Each run reads the KV events stored since the last run (every shard's, with their content
keys), then the content keys that came late for events stored before (``kv_content``), into
one ``AvailabilityTracker``, then the requests that ended at least ``settle_s`` ago and are not
evaluated yet (with their logged decisions), and writes one availability row per request.

A request evaluated before its worker's KV events named its images (``identities_resolved``
false: the events came late, or a flush evaluated it at once) is evaluated again on each run
that brings KV events, for ``lookback_s`` after it ended: its row is replaced and its cell
gets the difference, so no sum counts it twice. So is one evaluated before a later request
of the run named its own image (its blocks stored inside the earlier one's window).
"""

from __future__ import annotations

import time

from mmlens.analysis.availability.aggregate import cell_sums, revised_sums
from mmlens.analysis.availability.facts import RequestFacts, facts_of
from mmlens.analysis.availability.tracker import AvailabilityTracker
from mmlens.records import Availability
from mmlens.store.base import SQLStore
from mmlens.store.decisions import attach, trace_keys
from mmlens.store.tail import IdTail


class AvailabilityJob:
    def __init__(self, store: SQLStore, settle_s: float = 12.0, lookback_s: float = 120.0,
                 horizon_s: float = 900.0) -> None:
        self.store = store
        self.settle_s = settle_s
        self.lookback_s = lookback_s
        self.tracker = AvailabilityTracker(horizon_s)
        self.kv_tail = IdTail()  # every shard's rows, also those committed out of id order
        self.late_tail = IdTail()  # content keys stored after their events
        self.since: float | None = None  # requests decided before this are done
        self.evaluated = 0
        self.revised = 0  # rows replaced after later KV events named their images
        # Evaluated with images unnamed: facts and the row stored, by request id.
        self.unresolved: dict[str, tuple[RequestFacts, Availability]] = {}

    def apply_kv(self) -> int:
        """Apply the events stored since, then the late keys (those of an event come after
        it, as when they were stored); returns the rows applied."""
        n = 0
        for read, tail in ((self.store.kv_keyed_tail, self.kv_tail),
                           (self.store.kv_content_tail, self.late_tail)):
            while rows := read(tail):
                for r in rows:
                    self.tracker.apply_keyed(r.ts, r.unit, r.kind, r.keys, r.images)
                n += len(rows)
        return n

    def run(self, now: float | None = None, settle_s: float | None = None,
            ) -> list[Availability]:
        """Evaluate the requests that ended ``settle_s`` (default: the job's) before ``now``."""
        now = time.time() if now is None else now
        self._forget(now - self.lookback_s)
        if self.apply_kv() and self.unresolved:
            self._revisit()
        until = now - (self.settle_s if settle_s is None else settle_s)
        since = self.since if self.since is not None else until - self.tracker.index.horizon_s
        traces = self.store.traces_between(since - self.lookback_s, until, 20_000)
        done = self.store.evaluated([t.request_id for t in traces])
        traces = [t for t in traces if t.request_id not in done]
        keys = sorted({k for t in traces for k in trace_keys(t)})
        if keys:
            attach(traces, self.store.decisions(keys))
        facts = []
        for trace in traces:
            f = facts_of(trace)
            if f is not None and not f.failed and f.done_ts <= until:
                facts.append(f)
        results = []
        learned = self.tracker.identities.learned
        for f in sorted(facts, key=lambda f: f.ts):
            a = self.tracker.evaluate(f)
            results.append(a)
            if not a.identities_resolved:
                self.unresolved[a.request_id] = (f, a)
        if results:
            self.store.add_availability(results)
            self.store.add_cells(cell_sums(results))
            self.evaluated += len(results)
        # A request that started while an earlier one ran stores its image blocks inside
        # the earlier one's window (vLLM: at allocation); once the later one's name is
        # learned, the earlier one's own block is the only one left.
        while self.unresolved and self.tracker.identities.learned != learned:
            learned = self.tracker.identities.learned
            self._revisit()
        self.since = until
        return results

    def _forget(self, ended_before: float) -> None:
        """Unresolved requests that ended before ``ended_before`` are given up, also where no
        KV events come at all (kept in about the order they ended: the oldest go first)."""
        while self.unresolved:
            rid, (f, _) = next(iter(self.unresolved.items()))
            if f.done_ts >= ended_before:
                return
            del self.unresolved[rid]

    def _revisit(self) -> None:
        """The unresolved requests evaluated again against the KV events now applied."""
        old, new = [], []
        for rid, (f, before) in sorted(self.unresolved.items(), key=lambda kv: kv[1][0].ts):
            after = self.tracker.evaluate(f)
            if after.identities_resolved:
                del self.unresolved[rid]
            else:
                self.unresolved[rid] = (f, after)
            if after.to_json() != before.to_json():
                old.append(before)
                new.append(after)
        if new:
            self.store.add_availability(new)
            self.store.add_cells(revised_sums(old, new))
            self.revised += len(new)
