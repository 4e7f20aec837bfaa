"""A vLLM-shaped KV-event publisher for fault injection: PUB + ROUTER replay that can crash
and come back on its ports, lose batches on the way, or send garbage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from tests.live_support import loopback_endpoints as loopback_endpoints

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_enc = msgspec.msgpack.Encoder()


class FaultPublisher:
    """PUB + ROUTER replay like vLLM's ``ZmqEventPublisher``; ``down()``/``up()`` is a worker
    restart (seq back to 0, buffer empty). ``replay``: "answer", "lossy" (every other
    request's answer misses every 7th batch, as a ROUTER past its high-water mark does),
    "silent" (bound, never answers) or None (no replay socket). ``silent_until``
    (``time.monotonic()``): requests that arrive before it are dropped unanswered, as by a
    busy worker or a restarted replay thread; the buffer keeps every batch meanwhile."""

    def __init__(self, pub: str, replay: str | None, replay_mode: str | None = "answer",
                 buffer_steps: int = 10_000, hash_base: int = 0) -> None:
        self.ctx = zmq.Context()
        self.endpoints = (pub, replay)
        self.replay_mode = replay_mode if replay else None
        self.buffer_steps = buffer_steps
        self.buffer: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        self.seq = 0
        self.next_hash = hash_base
        self.events = 0  # valid events published (live or only into the buffer)
        self.incarnations = 0
        self.replay_requests = 0
        self.silent_until = 0.0
        self.ignored_requests = 0
        self.dropped = 0  # valid events of batches lost on the way (only a replay has them)
        self._pub: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def up(self, attempts: int = 100) -> FaultPublisher:
        self.seq, self.buffer, self.incarnations = 0, [], self.incarnations + 1
        for i in range(attempts):  # the old sockets' ports take a moment to free
            try:
                self._pub = self.ctx.socket(zmq.XPUB)  # a PUB that sees subscriptions
                self._pub.setsockopt(zmq.LINGER, 0)
                self._pub.setsockopt(zmq.SNDHWM, 1_000_000)
                self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
                self._pub.bind(self.endpoints[0])
                break
            except zmq.ZMQError:
                self._pub.close(linger=0)
                if i == attempts - 1:
                    raise
                time.sleep(0.05)
        if self.replay_mode is not None:
            self._stop.clear()
            ready = threading.Event()
            self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
            self._thread.start()
            ready.wait(5)
        return self

    def wait_subscribed(self, timeout: float = 10.0) -> None:
        """Until a subscriber's subscription reached this incarnation (no slow joiner)."""
        if not self._pub.poll(int(timeout * 1000)):
            raise TimeoutError("no subscriber")
        self._pub.recv()

    def down(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._pub is not None:
            self._pub.close(linger=0)
            self._pub = None

    def close(self) -> None:
        self.down()
        self.ctx.term()

    def _serve(self, ready: threading.Event) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        for _ in range(100):
            try:
                router.bind(self.endpoints[1])
                break
            except zmq.ZMQError:
                time.sleep(0.05)
        ready.set()
        try:
            while not self._stop.is_set():
                if not router.poll(20):
                    continue
                frames = router.recv_multipart()
                if self.replay_mode not in ("answer", "lossy") or len(frames) != 3 or len(
                        frames[2]) != 8:
                    continue
                if time.monotonic() < self.silent_until:
                    self.ignored_requests += 1
                    continue
                start = int.from_bytes(frames[2], "big")
                self.replay_requests += 1
                lossy = self.replay_mode == "lossy" and self.replay_requests % 2
                with self.lock:
                    items = [(s, p) for i, (s, p) in enumerate(
                        (s, p) for s, p in self.buffer if s >= start)
                        if not (lossy and i % 7 == 3)]
                for s, p in items:
                    router.send_multipart([frames[0], b"", s.to_bytes(8, "big"), p])
                router.send_multipart([frames[0], b"", END_SEQ, b""])
        finally:
            router.close(linger=0)

    def batch(self, n_events: int) -> bytes:
        events = []
        for _ in range(n_events):
            self.next_hash += 1
            events.append({"type": "BlockStored", "block_hashes": [self.next_hash],
                           "parent_block_hash": None, "token_ids": [1] * 16,
                           "block_size": 16, "medium": "GPU"})
        self.events += n_events
        return _enc.encode([time.time(), events, 0])

    def publish(self, payload: bytes, send: bool = True, seq: int | None = None) -> int:
        """Buffer a batch (the publisher's replay keeps it) and send it unless ``send`` is
        False (lost on the way); ``seq`` overrides the number (garbage)."""
        with self.lock:
            number = self.seq if seq is None else seq
            if seq is None:
                self.seq += 1
                self.buffer.append((number, payload))
                del self.buffer[:-self.buffer_steps]
        if send and self._pub is not None:
            self._pub.send_multipart([b"", number.to_bytes(8, "big"), payload])
        return number

    def send_raw(self, frames: list[bytes]) -> None:
        self._pub.send_multipart(frames)

    def stream(self, n_events: int, per_batch: int = 4, rate: float = 20_000.0,
               drop: Callable[[int], bool] = lambda seq: False) -> None:
        """Publish ``n_events`` at about ``rate`` events/s; batches ``drop`` picks are lost."""
        started, sent = time.monotonic(), 0
        while sent < n_events:
            k = min(per_batch, n_events - sent)
            lose = drop(self.seq)
            self.dropped += k if lose else 0
            self.publish(self.batch(k), send=not lose)
            sent += k
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0.002:
                time.sleep(ahead)
