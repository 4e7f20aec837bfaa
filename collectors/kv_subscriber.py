"""ZMQ SUB per worker KV-event endpoint (vLLM and SGLang publishers), with replay.

Messages are ``[topic, seq (8 bytes big-endian), msgpack batch]``. ``mmlens.ingest.kv_stream``
says what each number means; a gap, a restart (the number went back) or a reconnect is made
good from the worker's ROUTER replay socket (``kv_replay``, ``kv_replay_flow``). While a
stream's replay is out, its live batches wait beside it (up to the replay's deadline), so the
resident index sees every batch in order; other streams go on. What a replay did not return
in time is owed and asked for again later (``kv_late``), and that replay socket is left alone
for a growing while. Everything reaching the index is handed to ``sink`` as it is applied;
the store keys each event, so a batch handed over twice (after a restart of mmlens, by a
second collector, or late) is stored once. A store whose content keys became known only
later goes to ``content_sink`` (``kv_late``).
All socket work happens on the thread that calls ``poll``/``run``: zmq sockets are not
thread-safe.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import zmq
from mmlens.collectors.kv_endpoint import BACKOFF_S, Endpoint
from mmlens.collectors.kv_replay_flow import ReplayFlow
from mmlens.collectors.zmq_types import ZmqContext, ZmqSocket
from zmq.utils.monitor import recv_monitor_message

from mmlens.ingest.kv_dynamo_plane import looks_like_dynamo_plane
from mmlens.ingest.kv_events import MAX_SEQ, KVEventError, parse_seq
from mmlens.ingest.kv_index import KVIngest
from mmlens.ingest.kv_owed import MAX_BATCHES, MAX_RANGES, OwedLedger
from mmlens.ingest.kv_stream import StreamState
from mmlens.records import CollectorHealth, KVEvent

EventSink = Callable[[list[KVEvent]], None]
MAX_FINISH_AT_STOP = 100


class KVEventCollector(ReplayFlow):
    def __init__(self, ingest: KVIngest | None = None, context: ZmqContext | None = None,
                 sink: EventSink | None = None, replay_timeout_s: float = 1.0,
                 max_replay_batches: int = 100_000,
                 owed_budget: tuple[int, int] = (MAX_RANGES, MAX_BATCHES),
                 content_sink: EventSink | None = None) -> None:
        self.ingest = ingest or KVIngest()
        self.owed_budget = owed_budget  # (ranges, batches) an endpoint may be owed
        self.backoff = BACKOFF_S
        self.ctx = context or zmq.Context.instance()
        self.sink = sink
        self.content_sink = content_sink  # events handed over before, now with content keys
        self.replay_timeout_s = replay_timeout_s
        self.max_replay_batches = max_replay_batches
        self.endpoints: list[Endpoint] = []
        self._by_socket: dict[ZmqSocket, tuple[str, Endpoint]] = {}
        self.poller = zmq.Poller()
        self._stop = threading.Event()
        # Endpoints added while run() polls: the polling thread creates their sockets.
        self._later: queue.SimpleQueue[tuple[str, int, str, str | None, str]] = \
            queue.SimpleQueue()
        self.lock = threading.Lock()  # guards the index for readers on other threads

    # --- set-up --------------------------------------------------------------------------

    def add_endpoint(self, worker: str, rank: int, endpoint: str, replay: str | None = None,
                     topic: str = "") -> Endpoint:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        ep = Endpoint(worker, rank, endpoint, replay, topic.encode(), sock,
                      CollectorHealth("kv_events", f"{worker}#{rank}"),
                      owed=OwedLedger(*self.owed_budget), backoff_s=self.backoff[0])
        # A reconnect may hide a publisher restart: watch the connection itself.
        ep.monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(endpoint)
        self.endpoints.append(ep)
        self._register(sock, "sub", ep)
        self._register(ep.monitor, "monitor", ep)
        return ep

    def add_endpoint_later(self, worker: str, rank: int, endpoint: str,
                           replay: str | None = None, topic: str = "") -> None:
        """``add_endpoint`` from another thread than the one running ``run``."""
        self._later.put((worker, rank, endpoint, replay, topic))

    def _add_later(self) -> None:
        while True:
            try:
                self.add_endpoint(*self._later.get_nowait())
            except queue.Empty:
                return

    def close(self) -> None:
        self._stop.set()
        for ep in self.endpoints:
            for rep in (ep.pending, ep.late):
                if rep is not None:
                    self._unregister(rep.socket)
                    rep.close()
            ep.pending = ep.late = None
            for s in (ep.socket, ep.monitor):
                if s is not None:
                    self._unregister(s)
                    s.close(linger=0)
        self.endpoints.clear()

    def reset_streams(self) -> None:
        """Forget every stream's position and counters (tests: after connection probes)."""
        for ep in self.endpoints:
            ep.stream = StreamState()
            ep.held.clear()
            self.give_up_owed(ep, "stop")
            ep.health.errors.clear()
            ep.health.counters.clear()

    # --- receive ---------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 100, max_messages: int = 10_000) -> int:
        """Handle what arrived within ``timeout_ms``; returns the live messages handled."""
        handled = 0
        ready = [self._by_socket.get(sock, ("", None)) for sock, _ in self.poller.poll(timeout_ms)]
        ready.sort(key=lambda item: item[0] != "monitor")  # a reconnect before its batches
        for kind, ep in ready:
            if ep is None:
                continue
            try:
                if kind == "sub":
                    handled += self._read_live(ep, max_messages - handled)
                elif kind == "monitor":
                    self._read_monitor(ep)
                elif kind == "replay" and ep.pending is not None:
                    ep.pending.read(self.max_replay_batches)
                    if ep.pending.done:
                        self._finish(ep, timed_out=False)
                elif kind == "late" and ep.late is not None:
                    ep.late.read(self.max_replay_batches)
                    if ep.late.done:
                        self._finish_late(ep, timed_out=False)
            except Exception as exc:  # one odd batch must not stop every worker's stream
                ep.health.error("internal_error", f"{type(exc).__name__}: {exc}", time.time())
        self._expire_replays()
        return handled

    def _read_live(self, ep: Endpoint, budget: int) -> int:
        self._read_monitor(ep)
        n = 0
        while n < budget:
            try:
                frames = ep.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            try:
                self.handle(ep, frames)
            except Exception as exc:
                ep.health.error("internal_error", f"{type(exc).__name__}: {exc}", time.time())
        return n

    def _read_monitor(self, ep: Endpoint) -> None:
        while ep.monitor is not None and ep.monitor.poll(0):
            event = recv_monitor_message(ep.monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                ep.health.count("disconnects")
                ep.connected = False
            elif event == zmq.EVENT_CONNECTED:
                ep.connected = True
                ep.silent_until, ep.backoff_s = 0.0, self.backoff[0]  # a new peer, a new chance
                self._answered(ep)
                if ep.connected_once and ep.stream.last_seq is not None:
                    ep.stream.reconnected = True
                    ep.health.count("reconnects")
                    # A restarted worker may publish nothing for a while, or only batches
                    # sent before our subscription reached it: ask its buffer now.
                    if ep.pending is None and self._can_replay(ep):
                        self._start_replay(ep, "reconnect", 0, MAX_SEQ)
                ep.connected_once = True

    def run(self, stop: threading.Event | None = None, timeout_ms: int = 100,
            drain_s: float = 2.0) -> None:
        stop = stop or self._stop
        self.initial_sync(wait=False)
        while not stop.is_set():
            self._add_later()
            self.poll(timeout_ms)
        self.drain(drain_s)

    def drain(self, timeout_s: float = 2.0) -> None:
        """On stop: handle what is already queued, let open replays finish and ask once
        more for owed batches (bounded); what is still owed then is given up (``stop``)."""
        deadline = time.monotonic() + timeout_s
        asked = False
        while time.monotonic() < deadline:
            busy = any(ep.pending is not None or ep.late is not None for ep in self.endpoints)
            # Stop after one quiet 50 ms: batches still on the wire when stop came count.
            if not self.poll(10 if busy else 50) and not busy:
                if asked:
                    break
                asked = True
                due = [ep for ep in self.endpoints
                       if self._late_due(ep, time.monotonic(), last_chance=True)]
                if not due:
                    break
                for ep in due:
                    self._start_late(ep)
        for ep in self.endpoints:
            for _ in range(MAX_FINISH_AT_STOP):  # held batches may reveal another gap
                if ep.pending is None:
                    break
                self._finish(ep, timed_out=True)
            if ep.late is not None:
                self._finish_late(ep, timed_out=True)
            self.give_up_owed(ep, "stop")

    def initial_sync(self, wait: bool = True) -> None:
        """Replay each worker's buffer from seq 0 before listening.

        vLLM announces a block once, when it is first stored (never on a cache hit), so a
        collector that starts after the cache warmed up would otherwise never learn what is
        resident. The publisher keeps its last ``buffer_steps`` batches for replay.
        """
        for ep in self.endpoints:
            if ep.replay is not None and ep.stream.last_seq is None and ep.pending is None:
                self._start_replay(ep, "initial", 0, MAX_SEQ)
        deadline = time.monotonic() + self.replay_timeout_s + 0.5
        while wait and time.monotonic() < deadline and any(
                ep.pending is not None for ep in self.endpoints):
            self.poll(20)

    def handle(self, ep: Endpoint, frames: list[bytes], now: float | None = None) -> None:
        """One live PUB message."""
        now = time.time() if now is None else now
        h = ep.health
        if len(frames) != 3:
            if looks_like_dynamo_plane(frames):
                h.error("wrong_protocol", (
                    f"{ep.endpoint} is Dynamo's event plane (ZMQ broker), not a vLLM/SGLang ZMQ "
                    "publisher: set it as the router's event_plane in mmlens.toml"), now)
            else:
                h.error("truncated_frame", f"{len(frames)} frames", now)
            return
        try:
            seq = parse_seq(frames[1])
        except KVEventError as exc:
            h.error(exc.kind, str(exc), now)
            return
        ep.last_activity = time.monotonic()
        self._on_live(ep, seq, frames[2], now)

    def store(self, events: list[KVEvent], add: Callable[[list[KVEvent]], int]) -> None:
        """Store per stream (``add`` returns the rows it added), so each stream's health
        says how many rows were new and how many the store already had (a replay, another
        collector). Events of streams not read here (gRPC, event planes) are stored too."""
        streams: dict[tuple[str, int], list[KVEvent]] = {}
        for ev in events:
            streams.setdefault((ev.worker, ev.rank), []).append(ev)
        mine = {(ep.worker, ep.rank): ep.health for ep in self.endpoints}
        for key, evs in streams.items():
            stored = add(evs)
            if key in mine:
                mine[key].count("stored_events", stored)
                mine[key].count("duplicate_events", len(evs) - stored)

    # --- state -----------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return self.ingest.index.summary()
