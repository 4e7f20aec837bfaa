"""SubscribeKvEvents streams of gRPC workers (SMG's gRPC mode), one thread per worker.

The vLLM engine service and SGLang's scheduler service both stream ``common.KvEventBatch``.
Each stream keeps its cursor: a batch past ``cursor + 1`` is a gap, filled by re-subscribing
at the missing sequence (the servicer replays from its buffer); a batch or heartbeat below the
cursor on a fresh stream is a publisher restart, which empties that worker's resident blocks
and re-reads the new publisher from its first batch. Load-only batches are heartbeats.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import grpc
from smg_grpc_proto.generated import common_pb2

from mmlens.ingest.kv_events import KVEventError
from mmlens.ingest.kv_grpc import GrpcBatch, batch_events
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.records import CollectorHealth, KVEvent

SERVICES = {
    "vllm": "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents",
    "sglang": "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents",
}
RETRY_S = 1.0


class _Resubscribe(Exception):
    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.start = start


def grpc_target(url: str) -> str:
    """``grpc://host:port`` (or ``host:port``) → the channel target ``host:port``."""
    parts = urlsplit(url if "://" in url else f"grpc://{url}")
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname or parts.port is None:
        raise ValueError(f"not a gRPC worker address: {url!r} (expected grpc://host:port)")
    return f"{parts.hostname}:{parts.port}"


@dataclass
class GrpcStream:
    """One worker's stream; ``apply`` stores events in the shared index and sink."""

    worker: str
    url: str
    engine: str
    apply: Callable[[GrpcStream, GrpcBatch], None]
    restart: Callable[[GrpcStream], None]
    health: CollectorHealth
    cursor: int = 0  # last event batch applied (0: none yet)
    service: str | None = None
    _call: Any = field(default=None, repr=False)

    def run(self, stop: threading.Event) -> None:
        start = 1  # the publisher's whole buffer on first contact
        while not stop.is_set():
            try:
                self._stream(start, stop)
                start = self.cursor + 1
            except _Resubscribe as again:
                start = again.start
                continue
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.CANCELLED and stop.is_set():
                    return
                self.health.error("stream_error", f"{code}: {_details(exc)}", time.time())
                self.health.count("reconnects")
                start = self.cursor + 1
            stop.wait(RETRY_S)

    def cancel(self) -> None:
        call = self._call
        if call is not None:
            call.cancel()

    def _methods(self) -> list[str]:
        if self.service:
            return [self.service]
        first = SERVICES.get(self.engine, SERVICES["vllm"])
        return [first, *(m for m in SERVICES.values() if m != first)]

    def _stream(self, start: int, stop: threading.Event) -> None:
        with grpc.insecure_channel(grpc_target(self.url)) as channel:
            for method in self._methods():
                call = channel.unary_stream(
                    method, request_serializer=common_pb2.SubscribeKvEventsRequest.
                    SerializeToString, response_deserializer=common_pb2.KvEventBatch.FromString)
                self._call = call(common_pb2.SubscribeKvEventsRequest(
                    start_sequence_number=start, load_records_before_first_batch=True))
                try:
                    self.service = method
                    self._consume(self._call, start, stop)
                    return
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED or len(self._methods()) == 1:
                        raise
                    self.service = None
                    continue
            self.health.error("kv_events_unavailable",
                              f"{self.url} implements no SubscribeKvEvents", time.time())

    def _consume(self, call: Any, start: int, stop: threading.Event) -> None:
        fresh = True
        for msg in call:
            if stop.is_set():
                call.cancel()
                return
            try:
                batch = batch_events(msg, self.worker, self.health.errors)
            except KVEventError as exc:
                self.health.error(exc.kind, str(exc), time.time())
                continue
            self.health.ok(time.time())
            if batch.load_only:
                self.health.count("heartbeats")
                if fresh and 0 < batch.seq < self.cursor:
                    self._restarted()  # the new publisher is behind us: it restarted
                    raise _Resubscribe(1)
                continue
            if batch.seq <= self.cursor:
                if fresh and batch.seq < start:
                    self._restarted()
                    raise _Resubscribe(1)
                self.health.count("stale_batches")
                continue
            if batch.seq > self.cursor + 1:
                missing = batch.seq - self.cursor - 1
                if fresh and self.cursor == 0:
                    # Joined after the servicer's buffer stopped reaching back to batch 1:
                    # blocks stored before that are unknowable.
                    self.health.count("late_join_missed", missing)
                elif fresh:  # asked for the missing batches; the servicer no longer has them
                    self.health.count("gaps")
                    self.health.count("missed_batches", missing)
                    self.health.error("unrecovered_gap",
                                      f"seq {self.cursor + 1}..{batch.seq - 1}", time.time())
                else:
                    self.health.count("gaps")
                    call.cancel()
                    raise _Resubscribe(self.cursor + 1)
            fresh = False
            self.cursor = batch.seq
            self.apply(self, batch)

    def _restarted(self) -> None:
        self.health.count("restarts")
        self.cursor = 0
        self.restart(self)


def _details(exc: grpc.RpcError) -> str:
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return (details or "")[:200]


class GrpcKvCollector:
    """Every gRPC worker's stream, applied to one resident index under one lock."""

    def __init__(self, index: ResidentIndex, lock: threading.Lock,
                 sink: Callable[[list[KVEvent]], None] | None = None) -> None:
        self.index = index
        self.lock = lock
        self.sink = sink
        self.streams: list[GrpcStream] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def add_worker(self, worker: str, url: str, engine: str = "vllm") -> GrpcStream:
        grpc_target(url)  # refuse a bad address now, not in the thread
        stream = GrpcStream(worker, url, engine, self._apply, self._restart,
                            CollectorHealth("kv_events", f"{worker}#0"))
        stream.health.counters["transport_grpc"] = 1
        self.streams.append(stream)
        return stream

    def _apply(self, stream: GrpcStream, batch: GrpcBatch) -> None:
        h = stream.health
        h.count("batches")
        h.count("events", len(batch.events))
        h.counters["last_seq"] = batch.seq
        if not batch.events:
            return
        lag = time.time() - batch.ts
        if 0 <= lag < 3600:
            h.counters["last_lag_s"] = lag
        with self.lock:
            self.index.apply(batch.events)
        if self.sink is not None:
            self.sink(batch.events)

    def _restart(self, stream: GrpcStream) -> None:
        with self.lock:
            for (worker, rank) in list(self.index.workers):
                if worker == stream.worker:
                    self.index.restart(worker, rank)

    def start(self) -> None:
        for s in self.streams[len(self._threads):]:  # those not started yet
            t = threading.Thread(target=s.run, args=(self._stop,), daemon=True,
                                 name=f"kv-grpc-{s.worker}")
            t.start()
            self._threads.append(t)

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        for s in self.streams:
            s.cancel()
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()

    @property
    def health(self) -> list[CollectorHealth]:
        return [s.health for s in self.streams]
