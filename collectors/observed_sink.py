"""Observed requests on their way to the store: fragments from router logs, OTLP spans and
the tap, merged per request in memory while more may come, then written (the store merges
again with a row another process or an earlier flush wrote).

Thread-safe ``add`` (the OTLP receiver calls it from its threads); ``flush`` runs on the
collector's own thread, the only one that writes. Memory is bounded: past ``max_pending``
requests the oldest are written at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from mmlens.ingest.observed import keys_of, merge
from mmlens.records import CollectorHealth, RequestTrace, RoutingDecision

TraceWriter = Callable[[list[RequestTrace]], object]
DecisionWriter = Callable[[list[RoutingDecision]], object]


class ObservedSink:
    def __init__(self, write_traces: TraceWriter, write_decisions: DecisionWriter | None = None,
                 hold_s: float = 1.0, max_pending: int = 20_000) -> None:
        self.write_traces = write_traces
        self.write_decisions = write_decisions
        self.hold_s = hold_s
        self.max_pending = max_pending
        self.health = CollectorHealth("observed", "requests")
        self._lock = threading.Lock()
        self._by_key: dict[str, RequestTrace] = {}
        # id(record) → (last added, record, its keys)
        self._pending: dict[int, tuple[float, RequestTrace, set[str]]] = {}
        self._decisions: list[RoutingDecision] = []

    def add(self, fragments: Iterable[RequestTrace],
            decisions: Iterable[RoutingDecision] = ()) -> None:
        now = time.monotonic()
        with self._lock:
            n = 0
            for f in fragments:
                self._add_one(f, now)
                n += 1
            self._decisions.extend(decisions)
            self.health.count("fragments", n)
            overflow = len(self._pending) - self.max_pending
        if overflow > 0:
            self.flush(force_oldest=overflow)

    def _add_one(self, f: RequestTrace, now: float) -> None:
        hits: list[RequestTrace] = []
        keys = keys_of(f)
        for k in keys:
            t = self._by_key.get(k)
            if t is not None and all(t is not h for h in hits):
                hits.append(t)
        target = f
        for h in hits:
            self._pending.pop(id(h), None)
            target = merge(h, target) if target is f else merge(target, h)
        if hits:
            keys = keys_of(target)
        self._pending[id(target)] = (now, target, keys)
        for k in keys:
            self._by_key[k] = target

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self, now: float | None = None, force: bool = False,
              force_oldest: int = 0) -> int:
        """Write the requests nothing was added to for ``hold_s`` (all with ``force``);
        returns how many were written."""
        now = time.monotonic() if now is None else now
        with self._lock:
            items = sorted(self._pending.values(), key=lambda x: x[0])
            ready = [(t, keys) for i, (last, t, keys) in enumerate(items)
                     if force or i < force_oldest or now - last >= self.hold_s]
            for t, keys in ready:
                self._pending.pop(id(t), None)
                for k in keys:
                    if self._by_key.get(k) is t:
                        del self._by_key[k]
            decisions, self._decisions = self._decisions, []
        if decisions and self.write_decisions is not None:
            self.write_decisions(decisions)
        if ready:
            self.write_traces([t for t, _ in ready])
            with self._lock:
                self.health.count("requests_written", len(ready))
                self.health.ok(time.time())
        return len(ready)
