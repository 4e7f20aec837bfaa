"""Late fill: batches a silent replay did not return are owed, asked again, applied late.

A replay that times out without an answer does not make its batches lost: the publisher may
only have been busy, and still holds them. The range goes into the endpoint's ``OwedLedger``
(``mmlens.ingest.kv_owed``) and the stream goes on past it at once. The owed batches are
asked for again by a replay of their own (``Endpoint.late``), beside the live stream: when
the socket's back-off is over, at once after a reconnect or when the socket answered another
replay, and a last time when the collector stops. What comes back is applied to the index
with its watermarks (``mmlens.ingest.kv_late_index``) and handed to the sink; the store's
event key stores it once. A store handed over before, while its parent's batch was owed, had
no content keys then: when the late parent makes them known, the event with its keys goes to
``content_sink`` (the store's content table only; its event row is there already).

Health: ``owed_batches``/``owed_ranges`` (gauges), ``late_replays``, ``late_recovered_batches``,
``given_up_batches:<reason>`` with an ``unrecovered_gap`` error per range given up, and
``lost_batches`` = published - received - owed (a recovered batch is not lost),
``late_content_events`` (stores given their content keys late).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq
from mmlens.collectors.kv_endpoint import Endpoint
from mmlens.collectors.kv_replay import Replay
from mmlens.collectors.zmq_types import ZmqContext, ZmqSocket

from mmlens.ingest.kv_events import MAX_SEQ, batch_ts
from mmlens.ingest.kv_index import KVIngest
from mmlens.ingest.kv_late_index import apply_late
from mmlens.ingest.kv_owed import GiveUpReason, OwedRange
from mmlens.records import BlockStored, KVEvent

LATE_PAUSE_S = 5.0  # after an answer that left owed batches out, before asking again
MAX_REMOVED_MARKS = 100_000  # removed blocks remembered for late batches, per stream

_REASONS = {
    "rolled_over": "the publisher's buffer no longer holds them",
    "restart": "the publisher restarted since (another incarnation)",
    "budget": "over the owed budget",
    "unanswered": "answers kept leaving them out",
    "stop": "still owed at stop",
}


class LateFill:
    """The late-fill half of ``KVEventCollector`` (and the socket registry both halves use)."""

    ctx: ZmqContext
    ingest: KVIngest
    lock: threading.Lock
    sink: Callable[[list[KVEvent]], None] | None
    content_sink: Callable[[list[KVEvent]], None] | None
    replay_timeout_s: float
    max_replay_batches: int
    backoff: tuple[float, float]  # first and longest pause of a replay socket that was silent
    endpoints: list[Endpoint]
    poller: zmq.Poller
    _by_socket: dict[ZmqSocket, tuple[str, Endpoint]]

    # --- sockets ---------------------------------------------------------------------------

    def _register(self, sock: ZmqSocket, kind: str, ep: Endpoint) -> None:
        self._by_socket[sock] = (kind, ep)
        self.poller.register(sock, zmq.POLLIN)

    def _unregister(self, sock: ZmqSocket) -> None:
        self._by_socket.pop(sock, None)
        self.poller.unregister(sock)

    def _close(self, ep: Endpoint, rep: Replay) -> None:
        self._unregister(rep.socket)
        rep.close()
        if rep.bad_frames:
            ep.health.error("truncated_frame", f"{rep.bad_frames} in a replay reply",
                            time.time())

    def _can_replay(self, ep: Endpoint) -> bool:
        return ep.replay is not None and time.monotonic() >= ep.silent_until

    def _silent(self, ep: Endpoint) -> None:
        """The replay socket did not answer: leave it alone for a growing while."""
        ep.silent_until = time.monotonic() + ep.backoff_s
        ep.backoff_s = min(ep.backoff_s * 2, self.backoff[1])

    # --- owing -----------------------------------------------------------------------------

    def _watch(self, ep: Endpoint, on: bool) -> None:
        with self.lock:
            self.ingest.index.watch(ep.worker, ep.rank, on)

    def _settle_watch(self, ep: Endpoint) -> None:
        """Watermarks only while something may still come late."""
        if not ep.owed and ep.pending is None and ep.late is None:
            self._watch(ep, False)

    def _owe(self, ep: Endpoint, first: int, last: int, kind: str,
             times: dict[int, float | None]) -> None:
        if last < first:
            return
        self._watch(ep, True)
        self._given_up(ep, ep.owed.owe(first, last, kind, times))
        self._count_owed(ep)

    def _given_up(self, ep: Endpoint, ranges: list[tuple[OwedRange, GiveUpReason]]) -> None:
        h, now = ep.health, time.time()
        for r, reason in ranges:
            h.count(f"given_up_batches:{reason}", r.size)
            if r.kind != "join":  # before the collector joined: never part of its stream
                h.error("unrecovered_gap", f"seq {r.first}..{r.last} ({r.kind}): "
                        f"{_REASONS.get(reason, reason)}", now)
        if ranges:
            self._count_owed(ep)

    def give_up_owed(self, ep: Endpoint, reason: GiveUpReason) -> None:
        self._given_up(ep, ep.owed.give_up_all(reason))
        self._settle_watch(ep)

    @staticmethod
    def _count_owed(ep: Endpoint) -> None:
        st, c = ep.stream, ep.health.counters
        c["owed_batches"] = ep.owed.total
        c["owed_ranges"] = len(ep.owed.ranges)
        c["lost_batches"] = max(0, st.lost - ep.owed.total)

    def _check_marks(self, ep: Endpoint) -> None:
        """Removed blocks are remembered while batches are owed: bounded, like the ranges."""
        marks = self.ingest.index.residency(ep.worker, ep.rank).marks
        if marks is not None and len(marks.removed_at) > MAX_REMOVED_MARKS:
            self.give_up_owed(ep, "budget")

    # --- asking again ----------------------------------------------------------------------

    def _late_due(self, ep: Endpoint, now: float, last_chance: bool = False) -> bool:
        return bool(ep.owed) and ep.late is None and ep.replay is not None and (
            last_chance or (self._can_replay(ep) and now >= ep.late_next))

    def _start_late(self, ep: Endpoint) -> None:
        assert ep.replay is not None and ep.late is None
        ep.late = Replay.start(self.ctx, ep.replay, "late", ep.owed.start, MAX_SEQ,
                               self.replay_timeout_s)
        self._register(ep.late.socket, "late", ep)
        ep.health.count("late_replays")

    @staticmethod
    def _answered(ep: Endpoint) -> None:
        """The replay socket answers again: owed batches are worth asking for now."""
        ep.late_next = 0.0

    def _finish_late(self, ep: Endpoint, timed_out: bool) -> None:
        rep = ep.late
        assert rep is not None
        ep.late = None
        self._close(ep, rep)
        if timed_out and not rep.got:
            ep.health.count("late_replay_timeouts")
            self._silent(ep)
            ep.late_next = 0.0  # again once the back-off is over
        else:
            ep.backoff_s = self.backoff[0]
            done = ep.owed.settle(rep.got, rep.done, batch_ts)
            for seq, payload in done.recovered:
                self._apply_late(ep, seq, payload)
            self._given_up(ep, done.given_up)
            ep.late_next = time.monotonic() + LATE_PAUSE_S
        self._count_owed(ep)
        self._settle_watch(ep)

    def _apply_late(self, ep: Endpoint, seq: int, payload: bytes) -> None:
        h = ep.health
        index = self.ingest.index
        resolved: list[BlockStored] = []

        def late(events: list[KVEvent]) -> None:
            h.count("late_superseded_blocks", apply_late(index, events, resolved))

        with self.lock:
            _, events = self.ingest.ingest_batch(ep.worker, seq, payload, ep.rank, h.errors,
                                                 apply=late)
        ep.stream.late_applied()
        h.count("late_recovered_batches")
        h.count("events", len(events))
        h.counters["batches"] = ep.stream.received
        if events and self.sink is not None:
            self.sink(events)
        if resolved:
            h.count("late_content_events", len(resolved))
            if self.content_sink is not None:
                content: list[KVEvent] = list(resolved)
                self.content_sink(content)
