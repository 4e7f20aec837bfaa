"""ZMQ SUB per worker KV-event endpoint (vLLM and SGLang publishers), with replay.

Messages are ``[topic, seq (8 bytes big-endian), msgpack batch]``. ``mmlens.ingest.kv_stream``
says what each number means; a gap, a restart (the number went back) or a reconnect is made
good from the worker's ROUTER replay socket (``kv_replay``). While a stream's replay is out,
its live batches wait beside it, so the resident index sees every batch in order; other
streams go on. A replay that does not answer by its deadline is given up, counted, and that
replay socket is left alone for a growing while. Everything reaching the index is handed to
``sink`` as it is applied; the store keys each event, so a batch handed over twice (after a
restart of mmlens or by a second collector) is stored once.
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
from mmlens.collectors.kv_replay import Purpose, Replay
from zmq.utils.monitor import recv_monitor_message

from mmlens.ingest.kv_dynamo_plane import looks_like_dynamo_plane
from mmlens.ingest.kv_events import MAX_SEQ, KVEventError, batch_ts, parse_seq
from mmlens.ingest.kv_index import KVIngest
from mmlens.ingest.kv_stream import StreamState, same_incarnation
from mmlens.records import CollectorHealth, KVEvent

EventSink = Callable[[list[KVEvent]], None]

MAX_HELD = 200_000  # live batches held behind one replay before it is cut short
IDLE_PROBE_S = 2.0  # a quiet stream asks its buffer for batches lost after its last one


class KVEventCollector:
    def __init__(self, ingest: KVIngest | None = None, context: zmq.Context | None = None,  # type: ignore[type-arg]
                 sink: EventSink | None = None, replay_timeout_s: float = 1.0,
                 max_replay_batches: int = 100_000) -> None:
        self.ingest = ingest or KVIngest()
        self.ctx = context or zmq.Context.instance()
        self.sink = sink
        self.replay_timeout_s = replay_timeout_s
        self.max_replay_batches = max_replay_batches
        self.endpoints: list[Endpoint] = []
        self._by_socket: dict[zmq.Socket, tuple[str, Endpoint]] = {}  # type: ignore[type-arg]
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
                      CollectorHealth("kv_events", f"{worker}#{rank}"))
        # A reconnect may hide a publisher restart: watch the connection itself.
        ep.monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(endpoint)
        self.endpoints.append(ep)
        for kind, s in (("sub", sock), ("monitor", ep.monitor)):
            self._by_socket[s] = (kind, ep)
            self.poller.register(s, zmq.POLLIN)
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
            if ep.pending is not None:
                self._unregister(ep.pending.socket)
                ep.pending.close()
                ep.pending = None
            for s in (ep.socket, ep.monitor):
                if s is not None:
                    self._unregister(s)
                    s.close(linger=0)
        self.endpoints.clear()

    def _unregister(self, sock: zmq.Socket) -> None:  # type: ignore[type-arg]
        self._by_socket.pop(sock, None)
        self.poller.unregister(sock)

    def reset_streams(self) -> None:
        """Forget every stream's position and counters (tests: after connection probes)."""
        for ep in self.endpoints:
            ep.stream = StreamState()
            ep.held.clear()
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
                ep.silent_until, ep.backoff_s = 0.0, BACKOFF_S[0]  # a new peer, a new chance
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
        """On stop: handle what is already queued and let open replays finish (bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = any(ep.pending is not None for ep in self.endpoints)
            # Stop after one quiet 50 ms: batches still on the wire when stop came count.
            if not self.poll(10 if busy else 50) and not busy:
                break
        for ep in self.endpoints:
            if ep.pending is not None:
                self._finish(ep, timed_out=True)

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
            if missing[0] != "join":
                h.error("unrecovered_gap", f"seq {missing[1]}..{missing[2]}, no replay", now)
        self._apply(ep, seq, payload, now, live)

    def _restart(self, ep: Endpoint) -> None:
        ep.health.count("restarts")
        ep.stream.restart()
        with self.lock:
            self.ingest.index.restart(ep.worker, ep.rank)

    def _apply(self, ep: Endpoint, seq: int, payload: bytes, now: float,
               live: bool = True) -> None:
        h = ep.health
        before = sum(h.errors.values())
        with self.lock:
            ts, events = self.ingest.ingest_batch(ep.worker, seq, payload, ep.rank, h.errors)
        ep.stream.applied(seq, ts)  # a bad batch still arrived: its errors are counted
        if sum(h.errors.values()) != before:
            h.last_error, h.last_error_ts = "bad batch or event (see errors)", now
        self._count_stream(ep)
        h.count("events", len(events))
        h.counters["last_seq"] = seq
        if not events:
            return
        h.ok(now)
        lag = now - events[0].ts
        if live and 0 <= lag < 3600:  # replayed batches are old by design
            ep.lag_sum += lag
            ep.lag_n += 1
            h.counters["mean_lag_s"] = ep.lag_sum / ep.lag_n
            h.counters["last_lag_s"] = lag
        if self.sink is not None:
            self.sink(events)

    @staticmethod
    def _count_stream(ep: Endpoint) -> None:
        st, c = ep.stream, ep.health.counters
        c["batches"] = st.received
        c["published_batches"] = st.published
        c["lost_batches"] = st.lost

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

    # --- replay ----------------------------------------------------------------------------

    def _can_replay(self, ep: Endpoint) -> bool:
        return ep.replay is not None and time.monotonic() >= ep.silent_until

    def _start_replay(self, ep: Endpoint, purpose: Purpose, first: int, last: int) -> None:
        assert ep.replay is not None and ep.pending is None
        ep.pending = Replay.start(self.ctx, ep.replay, purpose, first, last,
                                  self.replay_timeout_s)
        self._by_socket[ep.pending.socket] = ("replay", ep)
        self.poller.register(ep.pending.socket, zmq.POLLIN)
        ep.health.count("tail_probes" if purpose == "tail" else "replays")

    def _expire_replays(self) -> None:
        now = time.monotonic()
        for ep in self.endpoints:
            if ep.pending is not None and now >= ep.pending.deadline:
                self._finish(ep, timed_out=True)
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
        self._unregister(rep.socket)
        rep.close()
        h, now = ep.health, time.time()
        if rep.bad_frames:
            h.error("truncated_frame", f"{rep.bad_frames} in a replay reply", now)
        if timed_out:
            h.error("replay_timeout", f"{rep.purpose} from seq {rep.first}", now)
        if timed_out and not rep.got:  # silent: leave that socket alone for a while
            ep.silent_until = time.monotonic() + ep.backoff_s
            ep.backoff_s = min(ep.backoff_s * 2, BACKOFF_S[1])
        elif not timed_out:
            ep.backoff_s = BACKOFF_S[0]
        got = sorted(rep.got.items())
        if rep.purpose in ("resync", "reconnect"):
            got = self._resync(ep, got, rep.purpose)
        elif rep.purpose == "initial":
            h.count("initial_sync_batches", len(got))
            if got and got[0][0] != 0:
                h.count("initial_sync_partial")  # the buffer no longer starts at 0
        start = ep.stream.last_seq
        got = [(seq, p) for seq, p in got if start is None or seq > start]
        h.count("replayed_batches", len(got))
        rest = len(got)
        for i, (seq, payload) in enumerate(got):
            if ep.stream.last_seq is not None and seq > ep.stream.last_seq + 1 and (
                    rep.purpose != "initial" or i) and rep.purpose != "hole":
                rest = i  # a hole in the answer: the batches after it queue as a new gap
                break
            self._apply(ep, seq, payload, now, live=False)
        queued = [(seq, p, now, False) for seq, p in got[rest:]]
        got, ep.hole_retry = got[:rest], bool(queued)
        if not queued and rep.purpose not in ("initial", "reconnect", "tail"):
            missing = rep.last - (-1 if start is None else start) - len(got)
            if missing > 0 and rep.purpose != "join":
                h.error("unrecovered_gap", f"{missing} batches before seq {rep.last + 1} "
                        "not returned by the replay", now)
            ep.stream.skip_to(rep.last)  # what the replay did not return is lost
        held, ep.held = queued + ep.held, []
        ep.replayed.update(rep.got)
        for seq, payload, at, live in held:
            if live and ep.replayed.get(seq) == payload:  # a replay handed it over already
                h.count("duplicate_batches")
                continue
            self._on_live(ep, seq, payload, at, live)
        if ep.pending is None:
            ep.replayed.clear()

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

    # --- state -----------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return self.ingest.index.summary()
