"""ZMQ SUB per worker KV-event endpoint (vLLM and SGLang publishers), with replay.

Messages are ``[topic, seq (8 bytes big-endian), msgpack batch]``. A sequence gap is filled
from the worker's ROUTER replay socket (a DEALER here sends ``[b"", start_seq]`` and reads
``[b"", seq, payload]`` replies until ``seq == -1``); a sequence back at 0 is a publisher
restart and empties that worker's resident index. All socket work happens on the thread
that calls ``poll``/``run``: zmq sockets are not thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from mmlens.ingest.kv_dynamo_plane import looks_like_dynamo_plane
from mmlens.ingest.kv_events import END_SEQ, KVEventError, KVIngest, SequenceTracker, parse_seq
from mmlens.records import CollectorHealth, KVEvent

EventSink = Callable[[list[KVEvent]], None]
MAX_SEQ = (1 << 63) - 1


@dataclass(slots=True)
class Endpoint:
    worker: str
    rank: int
    endpoint: str
    replay: str | None
    topic: bytes
    socket: zmq.Socket  # type: ignore[type-arg]
    health: CollectorHealth
    lag_sum: float = 0.0
    lag_n: int = 0


class KVEventCollector:
    def __init__(self, ingest: KVIngest | None = None, context: zmq.Context | None = None,  # type: ignore[type-arg]
                 sink: EventSink | None = None, replay_timeout_s: float = 1.0,
                 max_replay_batches: int = 100_000) -> None:
        self.ingest = ingest or KVIngest()
        self.ctx = context or zmq.Context.instance()
        self.sink = sink
        self.replay_timeout_s = replay_timeout_s
        self.max_replay_batches = max_replay_batches
        self.tracker = SequenceTracker()
        self.endpoints: list[Endpoint] = []
        self._by_socket: dict[zmq.Socket, Endpoint] = {}  # type: ignore[type-arg]
        self.poller = zmq.Poller()
        self._stop = threading.Event()
        self.lock = threading.Lock()  # guards the index for readers on other threads

    # --- set-up --------------------------------------------------------------------------

    def add_endpoint(self, worker: str, rank: int, endpoint: str, replay: str | None = None,
                     topic: str = "") -> Endpoint:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sock.connect(endpoint)
        ep = Endpoint(worker, rank, endpoint, replay, topic.encode(), sock,
                      CollectorHealth("kv_events", f"{worker}#{rank}"))
        self.endpoints.append(ep)
        self._by_socket[sock] = ep
        self.poller.register(sock, zmq.POLLIN)
        return ep

    def close(self) -> None:
        self._stop.set()
        for ep in self.endpoints:
            self.poller.unregister(ep.socket)
            ep.socket.close(linger=0)
        self.endpoints.clear()
        self._by_socket.clear()

    # --- receive ---------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 100, max_messages: int = 10_000) -> int:
        handled = 0
        for sock, _ in self.poller.poll(timeout_ms):
            ep = self._by_socket.get(sock)
            if ep is None:
                continue
            while handled < max_messages:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    self.handle(ep, frames)
                except Exception as exc:  # one odd batch must not stop every worker's stream
                    ep.health.error("internal_error", f"{type(exc).__name__}: {exc}", time.time())
                handled += 1
        return handled

    def run(self, stop: threading.Event | None = None, timeout_ms: int = 100) -> None:
        stop = stop or self._stop
        self.initial_sync()
        while not stop.is_set():
            self.poll(timeout_ms)

    def initial_sync(self) -> None:
        """Replay each worker's buffer from seq 0 before listening.

        vLLM announces a block once, when it is first stored (never on a cache hit), so a
        collector that starts after the cache warmed up would otherwise never learn what is
        resident. The publisher keeps its last ``buffer_steps`` batches for replay.
        """
        for ep in self.endpoints:
            if ep.replay is None or (ep.worker, ep.rank) in self.tracker.last:
                continue
            got = self.replay(ep, 0, MAX_SEQ)
            ep.health.count("initial_sync_batches", len(got))
            if got and got[0][0] != 0:
                ep.health.count("initial_sync_partial")  # the buffer no longer starts at 0
            for seq, payload in got:
                if self.tracker.observe((ep.worker, ep.rank), seq).status == "stale":
                    continue
                self._apply(ep, seq, payload, time.time(), live=False)

    def handle(self, ep: Endpoint, frames: list[bytes]) -> None:
        now = time.time()
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
        key = (ep.worker, ep.rank)
        verdict = self.tracker.observe(key, seq)
        if verdict.status == "stale":
            h.count("stale_batches")
            return
        if verdict.status == "restart":
            h.count("restarts")
            with self.lock:
                self.ingest.index.restart(ep.worker, ep.rank)
        elif verdict.status == "gap":
            assert verdict.missing_from is not None and verdict.missing_to is not None
            self._fill_gap(ep, verdict.missing_from, verdict.missing_to)
        elif verdict.status == "first" and seq > 0:
            # Joined a running publisher (or its first batches never reached us): fetch what
            # it still buffers; blocks announced before that are unknowable.
            h.count("late_join_missed", seq)
            if ep.replay is not None:
                got = self.replay(ep, 0, seq - 1)
                h.count("replayed_batches", len(got))
                for old_seq, payload in got:
                    self._apply(ep, old_seq, payload, time.time(), live=False)
        self._apply(ep, seq, frames[2], now)

    def _apply(self, ep: Endpoint, seq: int, payload: bytes, now: float,
               live: bool = True) -> None:
        h = ep.health
        before = sum(h.errors.values())
        with self.lock:
            events = self.ingest.ingest(ep.worker, seq, payload, ep.rank, h.errors)
        if sum(h.errors.values()) != before:
            h.last_error, h.last_error_ts = "bad batch or event (see errors)", now
        h.count("batches")
        h.count("events", len(events))
        h.counters["last_seq"] = seq
        if events:
            h.ok(now)
            lag = now - events[0].ts
            if live and 0 <= lag < 3600:  # replayed batches are old by design
                ep.lag_sum += lag
                ep.lag_n += 1
                h.counters["mean_lag_s"] = ep.lag_sum / ep.lag_n
                h.counters["last_lag_s"] = lag
            if self.sink is not None:
                self.sink(events)

    # --- replay ----------------------------------------------------------------------------

    def _fill_gap(self, ep: Endpoint, first: int, last: int) -> None:
        h = ep.health
        missing = last - first + 1
        h.count("gaps")
        h.count("missed_batches", missing)
        if ep.replay is None:
            h.error("unrecovered_gap", f"seq {first}..{last}, no replay endpoint", time.time())
            return
        got = self.replay(ep, first, last)
        h.count("replays")
        h.count("replayed_batches", len(got))
        for seq, payload in got:
            self._apply(ep, seq, payload, time.time(), live=False)
        if len(got) < missing:
            h.error("unrecovered_gap", f"replay returned {len(got)}/{missing}", time.time())

    def replay(self, ep: Endpoint, first: int, last: int) -> list[tuple[int, bytes]]:
        """Batches ``first..last`` from the ROUTER replay socket (bounded by a timeout)."""
        assert ep.replay is not None
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(ep.replay)
            sock.send_multipart([b"", first.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while len(out) <= self.max_replay_batches:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    ep.health.error("replay_timeout", f"from seq {first}", time.time())
                    break
                frames = sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) != 2 or len(frames[0]) != 8:
                    ep.health.error("truncated_frame", "replay reply", time.time())
                    continue
                if frames[0] == END_SEQ:
                    break
                seq = int.from_bytes(frames[0], "big")
                if first <= seq <= last:
                    out.append((seq, frames[1]))
        finally:
            sock.close(linger=0)
        return out

    # --- state -----------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return self.ingest.index.summary()
