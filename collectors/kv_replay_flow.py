"""Stream order for ``KVEventCollector``: each live batch classified (``kv_stream``), a gap,
restart or reconnect made good by a replay while the stream's live batches wait beside it,
then applied to the index in order and handed to the sink.

A replay that does not answer by its deadline is given up on for the live stream (the
batches held behind it go on), and what it did not return is owed (``kv_late``): asked
again later, not lost. A replay whose answer starts after the missing batches shows they
are gone (the buffer rolled over).
"""

from __future__ import annotations

import time

from mmlens.collectors.kv_endpoint import Endpoint
from mmlens.collectors.kv_late import LateFill
from mmlens.collectors.kv_replay import Purpose, Replay

from mmlens.ingest.kv_events import MAX_SEQ, batch_ts
from mmlens.ingest.kv_owed import OwedRange
from mmlens.ingest.kv_stream import same_incarnation

MAX_HELD = 200_000  # live batches held behind one replay before it is cut short
IDLE_PROBE_S = 2.0  # a quiet stream asks its buffer for batches lost after its last one
OWABLE: frozenset[Purpose] = frozenset({"join", "gap", "hole", "restart", "resync"})


class ReplayFlow(LateFill):
    def _on_live(self, ep: Endpoint, seq: int, payload: bytes, now: float,
                 live: bool = True) -> None:
        """A batch in stream order: live, or replayed past a hole in a replay's answer."""
        if ep.pending is not None:
            ep.held.append((seq, payload, now, live))
            if len(ep.held) >= MAX_HELD:
                self._finish(ep, timed_out=True)
            return
        st, h = ep.stream, ep.health
        verdict = st.classify(seq)
        missing: tuple[Purpose, int, int] | None = None
        if verdict == "first" and seq > 0:
            h.count("late_join_missed", seq)
            missing = ("join", 0, seq - 1)
        elif verdict == "gap":
            assert st.last_seq is not None
            h.count("gaps")
            h.count("missed_batches", seq - st.last_seq - 1)
            missing = ("gap", st.last_seq + 1, seq - 1)
        elif verdict == "restart":
            if seq == st.last_seq and batch_ts(payload) == st.last_ts:
                h.count("duplicate_batches")  # the same batch again, not a new incarnation
                return
            self._restart(ep)
            missing = ("restart", 0, seq - 1) if seq > 0 else None
        elif verdict == "resync":
            missing = ("resync", 0, seq - 1)
        if missing is not None:
            if missing[0] == "gap" and ep.hole_retry:
                missing = ("hole", missing[1], missing[2])
            ep.hole_retry = False
            if self._can_replay(ep):
                self._start_replay(ep, *missing)
                ep.held.append((seq, payload, now, live))
                return
            if ep.replay is not None:  # backed off: owed, asked for when it may be asked
                first = missing[1] if st.last_seq is None else max(missing[1], st.last_seq + 1)
                times = {} if st.last_seq is None else {st.last_seq: st.last_ts}
                self._owe(ep, first, missing[2], missing[0], times)
            elif missing[0] != "join":
                h.error("unrecovered_gap", f"seq {missing[1]}..{missing[2]}, no replay", now)
        self._apply(ep, seq, payload, now, live)

    def _restart(self, ep: Endpoint) -> None:
        ep.health.count("restarts")
        ep.stream.restart()
        self.give_up_owed(ep, "restart")  # the old incarnation's buffer is gone
        with self.lock:
            self.ingest.index.restart(ep.worker, ep.rank)

    def _apply(self, ep: Endpoint, seq: int, payload: bytes, now: float,
               live: bool = True) -> float | None:
        """Apply one batch in stream order; returns its batch time (None: unreadable)."""
        h = ep.health
        before = sum(h.errors.values())
        try:
            with self.lock:
                ts, events = self.ingest.ingest_batch(ep.worker, seq, payload, ep.rank,
                                                      h.errors)
        except Exception as exc:  # never replayed again and again: the stream moves past it
            h.error("internal_error", f"{type(exc).__name__}: {exc}", now)
            ts, events = None, []
        ep.stream.applied(seq, ts)  # a bad batch still arrived: its errors are counted
        if ep.owed:
            ep.owed.note(seq, ts)
            self._check_marks(ep)
        if sum(h.errors.values()) != before:
            h.last_error, h.last_error_ts = "bad batch or event (see errors)", now
        self._count_stream(ep)
        h.count("events", len(events))
        h.counters["last_seq"] = seq
        if not events:
            return ts
        h.ok(now)
        lag = now - events[0].ts
        if live and 0 <= lag < 3600:  # replayed batches are old by design
            ep.lag_sum += lag
            ep.lag_n += 1
            h.counters["mean_lag_s"] = ep.lag_sum / ep.lag_n
            h.counters["last_lag_s"] = lag
        if self.sink is not None:
            self.sink(events)
        return ts

    def _count_stream(self, ep: Endpoint) -> None:
        st, c = ep.stream, ep.health.counters
        c["batches"] = st.received
        c["published_batches"] = st.published
        self._count_owed(ep)

    # --- replay ----------------------------------------------------------------------------

    def _start_replay(self, ep: Endpoint, purpose: Purpose, first: int, last: int) -> None:
        assert ep.replay is not None and ep.pending is None
        if purpose in OWABLE:  # what it does not return may come late: watch from now
            self._watch(ep, True)
        ep.pending = Replay.start(self.ctx, ep.replay, purpose, first, last,
                                  self.replay_timeout_s)
        self._register(ep.pending.socket, "replay", ep)
        ep.health.count("tail_probes" if purpose == "tail" else "replays")

    def _expire_replays(self) -> None:
        now = time.monotonic()
        for ep in self.endpoints:
            if ep.late is not None and now >= ep.late.deadline:
                self._finish_late(ep, timed_out=True)
            if ep.pending is not None and now >= ep.pending.deadline:
                self._finish(ep, timed_out=True)
            elif ep.pending is None and self._late_due(ep, now):
                self._start_late(ep)
            elif (ep.pending is None and ep.stream.last_seq is not None and ep.connected
                  and now - ep.last_activity >= IDLE_PROBE_S and self._can_replay(ep)):
                # The last batches before a pause have no successor to reveal their loss.
                ep.last_activity = now
                self._start_replay(ep, "tail", ep.stream.last_seq + 1, MAX_SEQ)

    def _finish(self, ep: Endpoint, timed_out: bool) -> None:
        """Apply a replay's batches in order, then the live batches held behind it."""
        rep = ep.pending
        assert rep is not None
        ep.pending = None
        self._close(ep, rep)
        h, now = ep.health, time.time()
        if timed_out:
            h.error("replay_timeout", f"{rep.purpose} from seq {rep.first}", now)
        if timed_out and not rep.got:
            self._silent(ep)
        else:
            self._answered(ep)
            if not timed_out:
                ep.backoff_s = self.backoff[0]
        got = sorted(rep.got.items())
        if rep.purpose in ("resync", "reconnect"):
            got = self._resync(ep, got, rep.purpose)
        elif rep.purpose == "initial":
            h.count("initial_sync_batches", len(got))
            if got and got[0][0] != 0:
                h.count("initial_sync_partial")  # the buffer no longer starts at 0
        start, start_ts = ep.stream.last_seq, ep.stream.last_ts
        got = [(seq, p) for seq, p in got if start is None or seq > start]
        h.count("replayed_batches", len(got))
        times: dict[int, float | None] = {} if start is None else {start: start_ts}
        rest = len(got)
        for i, (seq, payload) in enumerate(got):
            if ep.stream.last_seq is not None and seq > ep.stream.last_seq + 1 and (
                    rep.purpose != "initial" or i) and rep.purpose != "hole":
                rest = i  # a hole in the answer: the batches after it queue as a new gap
                break
            times[seq] = self._apply(ep, seq, payload, now, live=False)
        queued = [(seq, p, now, False) for seq, p in got[rest:]]
        ep.hole_retry = bool(queued)
        if not queued and rep.purpose in OWABLE:
            self._owe_missing(ep, rep, start, times)
            ep.stream.skip_to(rep.last)  # the live stream goes on past what is owed
        self._release_held(ep, rep, queued)

    def _release_held(self, ep: Endpoint, rep: Replay,
                      queued: list[tuple[int, bytes, float, bool]]) -> None:
        held, ep.held = queued + ep.held, []
        waited = [at for _, _, at, live in held if live]
        if waited:  # how long live batches waited for a replay: never past its deadline
            ep.health.counters["max_held_s"] = max(ep.health.counters.get("max_held_s", 0.0),
                                                   time.time() - min(waited))
        ep.replayed.update(rep.got)
        for seq, payload, at, live in held:
            if live and ep.replayed.get(seq) == payload:  # a replay handed it over already
                ep.health.count("duplicate_batches")
                continue
            self._on_live(ep, seq, payload, at, live)
        if ep.pending is None:
            ep.replayed.clear()
        self._settle_watch(ep)

    def _owe_missing(self, ep: Endpoint, rep: Replay, start: int | None,
                     times: dict[int, float | None]) -> None:
        """What the replay did not return: gone if its answer started after it, else owed."""
        lo = rep.first if start is None else max(rep.first, start + 1)
        floor = min(rep.got) if rep.got else (rep.last + 1 if rep.done else lo)
        gaps: list[tuple[int, int]] = []
        first: int | None = None
        for seq in range(lo, rep.last + 2):
            if seq <= rep.last and seq not in times:
                first = seq if first is None else first
            elif first is not None:
                gaps.append((first, seq - 1))
                first = None
        for first, last in gaps:
            if first < floor:  # the buffer begins after it: no replay will return it
                cut = min(last, floor - 1)
                self._given_up(ep, [(OwedRange(first, cut, rep.purpose), "rolled_over")])
                first = cut + 1
            self._owe(ep, first, last, rep.purpose, times)

    def _resync(self, ep: Endpoint, got: list[tuple[int, bytes]], purpose: Purpose,
                ) -> list[tuple[int, bytes]]:
        """After a reconnect: keep our stream if the buffer continues it, else restart."""
        last = ep.stream.last_seq
        if not got:
            # Nothing to compare with: after a reconnect the next live batch asks again;
            # for a live batch, what is missing is a plain gap.
            ep.stream.reconnected = purpose == "reconnect"
            return got
        ep.stream.reconnected = False
        times = {seq: batch_ts(p) for seq, p in got if seq == last}
        if last is not None and last not in times:
            times[got[0][0]] = None  # only the lowest number matters then
        if same_incarnation(ep.stream, times):
            return got
        self._restart(ep)
        return got
