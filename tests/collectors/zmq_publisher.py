"""A vLLM-style KV-event publisher for tests: PUB (3 frames) + ROUTER replay, on loopback."""

from __future__ import annotations

import threading

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Publisher:
    def __init__(self, ctx: zmq.Context, pub: str, replay: str | None, topic: bytes = b"") -> None:
        self.ctx, self.topic = ctx, topic
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(pub)
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.enc = msgspec.msgpack.Encoder()
        self._stop = threading.Event()
        self.replay_requests: list[int] = []
        self.silent = False  # drop replay requests unanswered (a busy or restarted replay)
        self.ignored: list[int] = []
        self._thread = None
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(replay)
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            start = int.from_bytes(frames[2], "big")
            if self.silent:
                self.ignored.append(start)
                continue
            self.replay_requests.append(start)
            for seq, payload in list(self.buffer):
                if seq >= start:
                    self.router.send_multipart([frames[0], b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([frames[0], b"", END_SEQ, b""])

    def publish(self, batch: object, send: bool = True, raw: bytes | None = None) -> int:
        payload = raw if raw is not None else self.enc.encode(batch)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_frames(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def restart(self) -> None:
        self.seq = 0
        self.buffer.clear()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self.router.close(linger=0)
        self.pub.close(linger=0)
