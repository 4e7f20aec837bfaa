"""One subscribed KV-event endpoint (a worker's DP rank): its sockets, where its stream
stands, the replay it waits for and the live batches held behind that replay, and the
batches it is still owed (a replay that timed out silently, asked again later)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mmlens.collectors.kv_replay import Replay
from mmlens.collectors.zmq_types import ZmqSocket

from mmlens.ingest.kv_owed import OwedLedger
from mmlens.ingest.kv_stream import StreamState
from mmlens.records import CollectorHealth

BACKOFF_S = (5.0, 300.0)  # first and longest pause of a replay socket that timed out


@dataclass(slots=True)
class Endpoint:
    worker: str
    rank: int
    endpoint: str
    replay: str | None
    topic: bytes
    socket: ZmqSocket
    health: CollectorHealth
    monitor: ZmqSocket | None = None
    stream: StreamState = field(default_factory=StreamState)
    pending: Replay | None = None
    held: list[tuple[int, bytes, float, bool]] = field(default_factory=list)  # …, live
    connected_once: bool = False
    connected: bool = False
    replayed: dict[int, bytes] = field(default_factory=dict)  # until the held ones are in
    hole_retry: bool = False  # the next gap was a hole in a replay's answer: asked once more
    silent_until: float = 0.0
    last_activity: float = field(default_factory=time.monotonic)
    backoff_s: float = BACKOFF_S[0]
    lag_sum: float = 0.0
    lag_n: int = 0
    owed: OwedLedger = field(default_factory=OwedLedger)
    late: Replay | None = None  # a replay asking for owed batches; live batches never wait
    late_next: float = 0.0  # time.monotonic() before which owed batches are not asked again
