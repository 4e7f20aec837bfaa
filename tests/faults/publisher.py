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


class GrpcFaultPublisher:
    """A gRPC worker's ``SubscribeKvEvents`` stream on loopback: the demo's vLLM publisher
    (``KvPublisher``, its buffer answering a re-subscription) behind the demo workers' own
    stream (``stream_kv_events``: the load-only first record, the buffer from the asked
    sequence, then live batches and heartbeats), on a real gRPC server."""

    METHOD = ("vllm.grpc.engine.VllmEngine", "SubscribeKvEvents")

    def __init__(self) -> None:
        import asyncio

        from mmlens.demo.kv_publisher import KvPublisher

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.s = self  # what ``stream_kv_events`` reads the publisher from
        self.publisher = self._run(self._make(KvPublisher))
        self.starts: list[int] = []  # each subscription's start sequence number
        self.events = 0  # valid events published
        self._event_id = 0
        self.next_hash = 0
        self.port = self._run(self._serve())

    @staticmethod
    async def _make(cls: Any) -> Any:
        return cls(None, None)  # no ZMQ sockets: gRPC subscribers only

    def _run(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _serve(self) -> int:
        import grpc
        from mmlens.demo.grpc_service import stream_kv_events
        from smg_grpc_proto.generated import common_pb2

        async def subscribe(request: Any, context: Any) -> Any:
            self.starts.append(request.start_sequence_number)
            async for batch in stream_kv_events(self, request, context):
                yield batch

        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            self.METHOD[0], {self.METHOD[1]: grpc.unary_stream_rpc_method_handler(
                subscribe, request_deserializer=common_pb2.SubscribeKvEventsRequest.FromString,
                response_serializer=common_pb2.KvEventBatch.SerializeToString)}),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def engine_load(self, load_only: bool) -> Any:
        from smg_grpc_proto.generated import common_pb2

        return common_pb2.EngineLoad(load_only=load_only)

    def proto_batch(self, b: Any) -> Any:
        from mmlens.demo.grpc_service import _proto_event
        from smg_grpc_proto.generated import common_pb2

        events = []
        for ev in b.events:
            self._event_id += 1
            events.append(_proto_event(ev, self._event_id))
        return common_pb2.KvEventBatch(sequence_number=b.seq + 1, timestamp=b.ts,
                                       events=events, dp_rank=0)

    def stored(self, image: tuple[str, int] | None = None) -> Any:
        """One stored block of its own hash; ``image``: its one multimodal key."""
        from mmlens.demo.prefix_cache import StoredBlocks

        self.next_hash += 1
        return StoredBlocks([self.next_hash], None, [1] * 16, 16,
                            [[image]] if image is not None else [None])

    def publish(self, events: list[Any], valid: int | None = None) -> int:
        """One batch; returns its gRPC sequence number. ``valid``: how many of its events
        are (default: all)."""
        self._run(self.publisher.publish(events))
        self.events += len(events) if valid is None else valid
        return self.publisher.next_seq  # the ZMQ seq + 1 of the batch just published

    def wait_subscribed(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.publisher.subscribers:
            if time.monotonic() > deadline:
                raise TimeoutError("no subscriber")
            time.sleep(0.02)

    def close(self) -> None:
        self._run(self.server.stop(0))
        self.publisher.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
