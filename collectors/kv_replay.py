"""One replay request to a publisher's ROUTER socket, read without blocking.

A DEALER sends ``[b"", start_seq]`` and reads ``[b"", seq, payload]`` replies until
``seq == -1`` (vLLM's END_SEQ). The collector polls the socket beside the live ones, so a
replay socket that never answers costs its deadline on that one stream, not on the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import zmq
from mmlens.collectors.zmq_types import ZmqContext, ZmqSocket

from mmlens.ingest.kv_events import END_SEQ, MAX_SEQ

Purpose = Literal["initial", "join", "gap", "hole", "restart", "resync", "reconnect", "tail",
                  "late"]


@dataclass(slots=True)
class Replay:
    socket: ZmqSocket
    purpose: Purpose
    first: int
    last: int  # inclusive
    deadline: float  # time.monotonic(): moves on with every reply, up to ``cap``
    timeout_s: float
    cap: float
    got: dict[int, bytes] = field(default_factory=dict)
    done: bool = False
    bad_frames: int = 0
    out_of_range: int = 0

    @classmethod
    def start(cls, ctx: ZmqContext, endpoint: str, purpose: Purpose, first: int,
              last: int, timeout_s: float) -> Replay:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # The publisher's ROUTER drops replies beyond the pipe's high-water mark (1000 by
        # default); an unbounded receive side keeps a 10,000-batch buffer whole.
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        sock.send_multipart([b"", first.to_bytes(8, "big")])
        now = time.monotonic()
        return cls(sock, purpose, first, last, now + timeout_s, timeout_s,
                   now + max(120.0, timeout_s))

    def read(self, max_batches: int) -> None:
        """Take every reply waiting on the socket; ``done`` once the end marker came."""
        while not self.done:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.deadline = min(self.cap, time.monotonic() + self.timeout_s)  # still answering
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) != 2 or len(frames[0]) != 8:
                self.bad_frames += 1
                continue
            if frames[0] == END_SEQ:
                self.done = True
                return
            seq = int.from_bytes(frames[0], "big")
            if seq > MAX_SEQ or not self.first <= seq <= self.last:
                self.out_of_range += 1
                continue
            self.got[seq] = frames[1]
            if len(self.got) >= max_batches:
                self.done = True

    def close(self) -> None:
        self.socket.close(linger=0)
