"""Fans each engine step's KV events out to ZMQ (PUB + ROUTER replay) and gRPC subscribers.

ZMQ follows vLLM's publisher: 3 frames (topic, 8-byte big-endian sequence number starting at
0, msgpack batch); the ROUTER socket answers `[identity, b"", start_seq]` with every buffered
`(seq, payload)` from start_seq on, then `(-1, b"")`.
gRPC batches carry sequence number = ZMQ seq + 1, so that load-only heartbeats sent before
the first batch can be numbered 0 as the proto asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

import zmq
import zmq.asyncio
from mmlens.demo.kv_wire import encode_batch, encode_sglang_batch
from mmlens.demo.prefix_cache import Event, RemovedBlocks, StoredBlocks

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class PublishedBatch:
    seq: int  # ZMQ sequence number
    ts: float
    events: list[Event]
    payload: bytes


class KvPublisher:
    def __init__(self, pub_endpoint: str | None, replay_endpoint: str | None,
                 topic: str = "", legacy: bool = False, buffer_steps: int = 10_000,
                 engine: str = "vllm") -> None:
        self.topic = topic.encode()
        self.legacy = legacy
        self.engine = engine  # vllm | sglang: whose wire encoding the ZMQ payloads use
        self.buffer: deque[PublishedBatch] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.counts = {"stored_blocks": 0, "removed_blocks": 0, "cleared": 0}
        self.drop_next = 0  # batches to keep off the PUB socket (replay still has them)
        # gRPC subscribers get each batch, or None: "the load changed without a KV event".
        self.subscribers: set[asyncio.Queue[PublishedBatch | None]] = set()
        self._ctx = zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        if pub_endpoint:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.set_hwm(100_000)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.bind(pub_endpoint)
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)

    def start(self) -> None:
        if self._replay is not None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, events: list[Event]) -> None:
        if not events:
            return
        ts = time.time()
        payload = (encode_sglang_batch(ts, list(events)) if self.engine == "sglang"
                   else encode_batch(ts, list(events), self.legacy))
        batch = PublishedBatch(self.next_seq, ts, list(events), payload)
        self.next_seq += 1
        self._count(events)
        self.buffer.append(batch)
        if self._pub is not None:
            if self.drop_next > 0:
                self.drop_next -= 1
            else:
                seq = batch.seq.to_bytes(8, "big")
                await self._pub.send_multipart([self.topic, seq, batch.payload])
        for q in list(self.subscribers):
            q.put_nowait(batch)

    def _count(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, StoredBlocks):
                self.counts["stored_blocks"] += len(ev.block_hashes)
            elif isinstance(ev, RemovedBlocks):
                self.counts["removed_blocks"] += len(ev.block_hashes)
            else:
                self.counts["cleared"] += 1

    def published(self) -> dict[str, int]:
        """What this publisher has sent (tests compare it with what a collector stored)."""
        return {"batches": self.next_seq, **self.counts}

    def load_changed(self) -> None:
        for q in list(self.subscribers):
            q.put_nowait(None)

    def since(self, seq: int) -> list[PublishedBatch]:
        return [b for b in self.buffer if b.seq >= seq]

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # vLLM ignores malformed replay requests
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            for b in self.since(start):
                await self._replay.send_multipart([ident, b"", b.seq.to_bytes(8, "big"),
                                                   b.payload])
            await self._replay.send_multipart([ident, b"", END_SEQ, b""])

    def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
        for s in (self._pub, self._replay):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.close(linger=0)
        self._ctx.term()
