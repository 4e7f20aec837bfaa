"""Judges every stored request once its service is over, and once more when late evidence
arrives (``mmlens.analysis.judgement``); run by the lead collector beside the availability job.

Each run reads the KV events stored since the last run (every shard's, ``IdTail``) into the
job's chain index, then the requests around the settled ones (with their logged decisions),
judges those not judged yet and writes one verdict row each. The requests of the lookback
window stay decoded between runs (``_Window``): a run reads only the trace rows added since,
the bodies of the requests it has not judged yet (a merge rewrites a row in place) and the
decisions logged since; a restarted job reads its window whole once. KV rows that arrive for a time
a judged request on that worker covered, and decisions logged after a request was judged,
re-judge those requests once (``version`` 1): the index of judged requests by worker and
time finds them without a rescan.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from math import inf

from mmlens.analysis.judgement.attribution import SLACK_S
from mmlens.analysis.judgement.batch import Context, JudgeState, span_of, unit_of
from mmlens.analysis.judgement.engines import announcing_units
from mmlens.ingest.observed import SOURCE_KV, known
from mmlens.records import RequestTrace, Verdict
from mmlens.store import codec
from mmlens.store.base import SQLStore
from mmlens.store.decisions import attach, trace_keys
from mmlens.store.tail import IdTail

BLIND_METRIC = "smg_kv_events_unavailable"
TRACES_PER_RUN = 20_000  # a backlog is judged over several runs
WINDOW_ROWS = 100_000  # a window read whole larger than this is a backlog
# How long a verdict read from KV chains waits for the engine's own count (a worker's span
# comes in batches, seconds after the request's log lines)
USAGE_WAIT_S = 60.0
USAGE_SOURCES = frozenset({"otlp"})  # collectors that tell the engine's count after the fact
USAGE_ASK_S = 10.0


@dataclass
class _Judged:
    """Requests judged once, per unit, by start: what late KV rows may re-judge."""

    spans: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)

    def add(self, unit: str, start: float, end: float, rid: str) -> None:
        bisect.insort(self.spans.setdefault(unit, []), (start, end, rid))

    def touched(self, unit: str, lo: float, hi: float, longest: float) -> list[str]:
        spans = self.spans.get(unit, [])
        i = bisect.bisect_left(spans, (lo - longest - SLACK_S,))
        j = bisect.bisect_right(spans, (hi + SLACK_S, float("inf"), ""))
        return [rid for s, e, rid in spans[i:j] if s - SLACK_S <= hi and lo <= e + SLACK_S]

    def forget(self, rids: set[str]) -> None:
        for unit, spans in self.spans.items():
            self.spans[unit] = [s for s in spans if s[2] not in rids]

    def prune(self, before: float) -> None:
        for spans in self.spans.values():
            del spans[:bisect.bisect_left(spans, (before,))]


@dataclass(slots=True)
class _Kept:
    """A decoded request of the window: its store row, the body it was decoded from, the
    keys its decisions may be logged under."""

    row: int
    body: str
    trace: RequestTrace
    keys: frozenset[str]


@dataclass
class _Window:
    """The decoded requests of the job's lookback window, by start (then row, as the store
    orders them), with their keys: what a run judges against, kept between runs, and as
    judging reads it (``ctx``, changed request by request)."""

    rows: dict[int, _Kept] = field(default_factory=dict)
    order: list[tuple[float, int]] = field(default_factory=list)
    by_key: dict[str, set[int]] = field(default_factory=dict)
    ctx: Context = field(default_factory=Context)

    def put(self, row: int, body: str, t: RequestTrace) -> _Kept:
        if row in self.rows:
            self.drop(row)
        kept = self.rows[row] = _Kept(row, body, t, frozenset(trace_keys(t)))
        bisect.insort(self.order, (t.ts, row))
        self.ctx.put(row, t)
        for k in kept.keys:
            self.by_key.setdefault(k, set()).add(row)
        return kept

    def drop(self, row: int) -> None:
        kept = self.rows.pop(row)
        del self.order[bisect.bisect_left(self.order, (kept.trace.ts, row))]
        self._unkey(kept)
        self.ctx.drop(row)

    def _unkey(self, kept: _Kept) -> None:
        for k in kept.keys:
            rows = self.by_key[k]
            rows.discard(kept.row)
            if not rows:
                del self.by_key[k]

    def between(self, since: float, until: float) -> list[RequestTrace]:
        lo = bisect.bisect_left(self.order, (since, -1))
        hi = bisect.bisect_right(self.order, (until, float("inf")))
        return [self.rows[row].trace for _, row in self.order[lo:hi]]

    def named(self, keys: set[str]) -> set[int]:
        """The rows of the requests known by any of ``keys``."""
        return {row for k in keys for row in self.by_key.get(k, ())}

    def prune(self, before: float) -> list[str]:
        """Drop the requests that started before ``before``; their ids."""
        cut = bisect.bisect_left(self.order, (before, -1))
        gone = []
        for _, row in self.order[:cut]:
            kept = self.rows.pop(row)
            self._unkey(kept)
            self.ctx.drop(row)
            gone.append(kept.trace.request_id)
        del self.order[:cut]
        return gone


class VerdictJob:
    def __init__(self, store: SQLStore, settle_s: float = 12.0, lookback_s: float = 120.0,
                 horizon_s: float = 900.0) -> None:
        self.store = store
        self.settle_s = settle_s
        self.lookback_s = lookback_s
        self.state = JudgeState(horizon_s)
        self.kv_tail = IdTail()
        self.decision_tail = IdTail()
        self.trace_tail = IdTail()
        self.window: _Window | None = None  # None: read it whole at the next run
        self.versions: dict[str, int] = {}  # of the window's requests judged already
        self.judged_once = _Judged()
        self.longest = 0.0  # the longest request judged: how far back a late row may reach
        self.since: float | None = None  # requests before this are judged
        self.judged = 0
        self.rejudged = 0
        # two-reading verdicts → (image sizes known when judged, request time): judged again
        # once more sizes are known (a later request of one image may tell one)
        self.two_readings: dict[str, tuple[int, float]] = {}
        # verdicts whose realized hit was read from KV chains → when judged: judged again
        # when the engine's own count reaches their row (whatever the KV events did since)
        self.inferred: dict[str, float] = {}
        self.usage_told = False  # a source tells engine counts after the fact
        self.usage_asked = -inf  # when the store's health was last read for one
        self.pending = 0

    def _late_kv(self) -> set[str]:
        """Apply new KV rows; the requests judged once whose time they fall in."""
        out: set[str] = set()
        while True:
            rows = self.store.kv_chain_tail(self.kv_tail)
            if not rows:
                return out
            for unit, ranges in self.state.apply_kv(rows).items():
                for lo, hi in ranges:
                    out.update(self.judged_once.touched(unit, lo, hi, self.longest))

    def _new_decisions(self) -> tuple[set[str], set[str]]:
        """The keys of the decisions logged since the last run, and the requests judged
        already that one of them names (its line's time is before the judged frontier: it
        came late)."""
        frontier = self.since if self.since is not None else float("-inf")
        news = self.store.decision_tail(self.decision_tail)
        late = {rid for rid, ts in news if ts < frontier}
        return {rid for rid, _ in news}, (self.store.trace_ids_for_keys(sorted(late))
                                          if late else set())

    def _drained(self) -> None:
        """How far the KV side had read each worker's stream (``kv_state``, written after
        each drain): times before it are covered even when the worker sent nothing since."""
        for worker, rank, ts in self.store.kv_state_times():
            self.state.covered(worker if not rank else f"{worker}#{rank}", ts)

    def _blind(self, now: float) -> frozenset[str]:
        rows = self.store.samples_since(now - 600.0, [BLIND_METRIC])
        return frozenset(s.label("worker") for s in rows if s.value > 0)

    def _read(self, lo: float, since: float, now: float, logged: set[str], late: set[str],
              ) -> tuple[bool, set[str]]:
        """Bring the window up to the store: drop what is older than ``lo``, decode the rows
        added since the last run and the rows of requests not judged yet that a merge
        rewrote, join their logged decisions (again, from a fresh decode, for requests a
        decision logged since names: as one join of them all would). Requests not judged
        yet start at the judged frontier ``since`` or later unless added since; those that
        started after ``now`` are not judged against yet and are looked at then; ``late``
        ones are re-judged from their row as stored now. Returns False when the window had
        to be read whole and held more than a run judges (a backlog), and the ids of the
        requests decoded."""
        fresh: dict[int, str] = {}
        whole = self.window is None
        if self.window is None:
            self.window = _Window()
            self.trace_tail.after, found = self.store.trace_rows_from(lo, WINDOW_ROWS)
            fresh.update(found)
        else:
            for rid in self.window.prune(lo):
                self.versions.pop(rid, None)
            while found := self.store.trace_rows_tail(self.trace_tail):
                fresh.update(found)
        win = self.window
        judged = self.versions
        first = bisect.bisect_left(win.order, (since, -1))
        waiting = [row for _, row in win.order[first:bisect.bisect_right(win.order, (now, inf))]
                   if row not in fresh and win.rows[row].trace.request_id not in judged]
        waiting += [row for row in win.named(late) if row not in fresh]
        if waiting:
            now_stored = self.store.trace_bodies(waiting)
            for row in waiting:
                body = now_stored.get(row)
                if body is None:
                    win.drop(row)  # merged into another row
                elif body != win.rows[row].body:
                    fresh[row] = body
        again = win.named(logged) - set(fresh)
        fresh.update((row, win.rows[row].body) for row in again)
        decoded: list[_Kept] = []
        for row, body in fresh.items():
            t = codec.trace(body)
            if t is None:
                if row in win.rows:
                    win.drop(row)
                continue
            if t.ts < lo:
                continue
            decoded.append(win.put(row, body, t))
        keys = sorted({k for kept in decoded for k in kept.keys})
        if keys:
            attach([kept.trace for kept in decoded], self.store.decisions(keys))
        unseen = [kept.trace.request_id for kept in decoded
                  if kept.trace.request_id not in judged]
        if unseen:
            judged.update(self.store.verdict_versions(unseen))
        return not (whole and len(fresh) >= WINDOW_ROWS), {
            kept.trace.request_id for kept in decoded}

    def run(self, now: float | None = None, settle_s: float | None = None) -> list[Verdict]:
        """Judge the requests that ended ``settle_s`` (default: the job's) before ``now``."""
        now = time.time() if now is None else now
        self.state.announcing = announcing_units(self.store.meta("targets"),
                                                 self.store.meta("router_state"))
        late = self._late_kv()
        logged, late_logged = self._new_decisions()
        late |= late_logged
        known = len(self.state.sizes)
        sized = {r for r, (n, _) in self.two_readings.items() if n < known}
        late |= sized
        reported = self._usage_reported(now)
        late |= reported
        self._drained()
        until = now - (self.settle_s if settle_s is None else settle_s)
        since = self.since if self.since is not None else until - self.state.horizon_s
        lo = since - self.lookback_s - self.longest
        caught_up, fresh = self._read(lo, since, now, logged, late)
        assert self.window is not None
        win = self.window
        versions = self.versions
        late = {r for r in late if versions.get(r) == 0} | sized | reported
        if caught_up and (not win.order or win.order[-1][0] <= now) and \
                all(r in win.ctx.ids for r in late):
            # Every request of the window is judged against (kept as judging reads it).
            first = bisect.bisect_left(win.order, (since, -1))
            ahead = sorted({(e.key, e.trace.request_id) for r in fresh | late
                            if (e := win.ctx.entry(r)) is not None and e.key < (since, -1)})
            candidates = [win.rows[row].trace for (_, row), _ in ahead]
            candidates += [win.rows[row].trace for _, row in win.order[first:]]
            todo, pending = self._todo(candidates, late, until)
            verdicts = self.state.judge_context(win.ctx, todo, self._blind(now), now)
            cut = until
            lookup = win.ctx.entry
            self._remember(lambda rid: e.trace if (e := lookup(rid)) else None, verdicts)
        else:
            context = win.between(lo, now)
            cut = until
            if not caught_up and len(context) >= TRACES_PER_RUN:
                del context[TRACES_PER_RUN:]
                cut = context[-1].ts
            # Before the frontier every request is judged, but for those just read and the
            # late.
            start = min(len(context), bisect.bisect_left(win.order, (since, -1)) -
                        bisect.bisect_left(win.order, (lo, -1)))
            if not caught_up:
                self.window = None  # a backlog: judged a run's worth at a time, read each run
            missing = late - {t.request_id for t in context}
            if missing:  # late evidence for requests older than the window: read those too
                older = [t for r in sorted(missing) if (t := self.store.trace(r)) is not None]
                keys = sorted({k for t in older for k in trace_keys(t)})
                if keys:
                    attach(older, self.store.decisions(keys))
                context += older
            ahead = [t for t in context[:start] if t.request_id in fresh or t.request_id in late]
            candidates = ahead + context[start:] if ahead or start else context
            todo, pending = self._todo(candidates, late, until)
            verdicts = self.state.judge(context, todo, self._blind(now), now)
            by_id = {t.request_id: t for t in context}
            self._remember(by_id.get, verdicts)
        for v in verdicts:
            if v.request_id in late:
                v.version = versions[v.request_id] + 1
        if verdicts:
            self.store.add_verdicts(verdicts)
        self.rejudged += sum(1 for v in verdicts if v.version)
        self.judged += sum(1 for v in verdicts if not v.version)
        self.pending = pending
        done = set(todo)
        oldest_open = min((t.ts for t in candidates if t.request_id not in versions and
                           t.request_id not in done), default=until)
        for v in verdicts:
            versions[v.request_id] = v.version
            if v.category.startswith("hit_or_"):
                self.two_readings[v.request_id] = (len(self.state.sizes), v.ts)
            else:
                self.two_readings.pop(v.request_id, None)
            if v.sources.get("realized", SOURCE_KV) == SOURCE_KV:
                self.inferred[v.request_id] = now
            else:
                self.inferred.pop(v.request_id, None)
        old = until - self.state.horizon_s
        self.two_readings = {r: x for r, x in self.two_readings.items() if x[1] >= old}
        self.since = min(until, oldest_open, cut)
        self.state.prune(until - self.state.horizon_s)
        self.judged_once.prune(until - self.state.horizon_s)
        return verdicts

    def _usage_reported(self, now: float) -> set[str]:
        """The requests judged from KV chains whose stored row now carries the engine's own
        count (a worker's span merged into it since): the engine's count is believed over
        the inference, so they are judged again (however many times KV rows re-judged them)."""
        self.inferred = {r: at for r, at in self.inferred.items() if at >= now - USAGE_WAIT_S}
        win = self.window
        if not self.inferred or win is None:
            return set()
        if not self.usage_told:
            if now - self.usage_asked < USAGE_ASK_S:
                return set()
            self.usage_asked = now
            self.usage_told = any(h.collector in USAGE_SOURCES for h in self.store.health())
            if not self.usage_told:
                return set()
        rows = {row: rid for rid in self.inferred for row in win.named({rid})}
        out: set[str] = set()
        for row, body in self.store.trace_bodies(list(rows)).items():
            kept = win.rows.get(row)
            if kept is not None and body != kept.body and (t := codec.trace(body)) is not None \
                    and known(t, "cached_tokens"):
                out.add(rows[row])
        for rid in out:
            del self.inferred[rid]
        return out

    def catch_up(self, now: float | None = None) -> int:
        """Judge every stored request that has ended (a store filled offline: ``mmlens
        check``'s own, a recorded capture), from the oldest on; returns how many."""
        oldest = self.store.oldest_trace_ts()
        if oldest is None:
            return 0
        if self.since is None:
            self.since = oldest
        n = 0
        while found := self.run(now, settle_s=0.0):
            n += len(found)
        return n

    def _todo(self, candidates: list[RequestTrace], late: set[str], until: float,
              ) -> tuple[list[str], int]:
        """The candidates to judge now (not judged yet, or late, and ended by ``until``),
        and how many are still running."""
        todo, pending = [], 0
        for t in candidates:
            if t.request_id in self.versions and t.request_id not in late:
                continue
            if span_of(t)[1] <= until:
                todo.append(t.request_id)
            else:
                pending += 1
        return todo, pending

    def _remember(self, trace_of: Callable[[str], RequestTrace | None],
                  verdicts: list[Verdict]) -> None:
        again = {v.request_id for v in verdicts if v.version}
        if again:
            self.judged_once.forget(again)  # re-judged once: late evidence changes it no more
        for v in verdicts:
            t = trace_of(v.request_id)
            assert t is not None
            unit = unit_of(t)
            if v.version or unit is None:
                continue
            start, end = span_of(t)
            self.longest = max(self.longest, end - start)
            self.judged_once.add(unit, start, end, v.request_id)
