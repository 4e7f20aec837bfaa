"""Dynamo's event plane as its KV router hears it: NATS subjects or the ZMQ broker's XPUB side.

``nats://host:port`` subscribes to ``namespace.<ns>.component.*.endpoint.*.kv-events``;
``tcp://host:port`` connects a SUB socket to the broker's XPUB socket (``DYN_ZMQ_BROKER_URL``'s
``xpub=``). NATS Core and ZMQ PUB/SUB keep nothing for late or lost subscribers: a sequence gap
per publisher is counted as unrecovered (Dynamo's router asks the worker's local indexer; a
passive observer cannot). Events go to ``on_events(events)`` on this collector's thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import zmq
from mmlens.collectors.zmq_types import ZmqContext

from mmlens.ingest.kv_dynamo_plane import (
    PlaneMessage,
    decode_broker_frames,
    decode_nats,
    kv_subject,
    router_events,
)
from mmlens.ingest.kv_events import KVEventError
from mmlens.records import CollectorHealth, KVEvent

OnEvents = Callable[[list[KVEvent]], None]


def plane_transport(url: str) -> str:
    """``nats`` or ``zmq-broker`` for an event-plane URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme in ("nats", "tls") and parts.hostname:
        return "nats"
    if parts.scheme == "tcp" and parts.hostname and parts.port:
        return "zmq-broker"
    raise ValueError(f"event_plane {url!r}: expected nats://host:port (Dynamo on NATS) or "
                     "tcp://host:port (the xpub side of Dynamo's ZMQ broker)")


class EventPlaneCollector:
    def __init__(self, name: str, url: str, on_events: OnEvents, namespace: str = "*",
                 context: ZmqContext | None = None) -> None:
        self.name = name
        self.url = url
        self.transport = plane_transport(url)
        self.subject = kv_subject(namespace)
        self.on_events = on_events
        self.ctx = context or zmq.Context.instance()
        self.health = CollectorHealth("kv_event_plane", name)
        self.health.counters[f"transport_{self.transport.replace('-', '_')}"] = 1
        self.last_seq: dict[int, int] = {}
        self.ready = threading.Event()  # subscribed (NATS) or connected (ZMQ)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- messages ---------------------------------------------------------------------------

    def handle(self, msg: PlaneMessage) -> None:
        h = self.health
        h.count("messages")
        if not msg.is_kv:
            h.count("other_topics")
            return
        prev = self.last_seq.get(msg.publisher_id)
        if prev is None:
            h.count("publishers")
        elif msg.sequence <= prev:
            h.count("stale_or_restarted")
        elif msg.sequence > prev + 1:
            h.count("gaps")
            h.count("missed_batches", msg.sequence - prev - 1)
            h.error("unrecovered_gap", f"publisher {msg.publisher_id}: seq {prev + 1}.."
                    f"{msg.sequence - 1} lost (the event plane keeps no history)", time.time())
        self.last_seq[msg.publisher_id] = msg.sequence
        events = router_events(msg, h.errors)
        h.count("batches")
        h.count("events", len(events))
        h.ok(time.time())
        if events:
            self.on_events(events)

    def handle_frames(self, frames: list[bytes]) -> None:
        try:
            msg = decode_broker_frames(frames)
        except KVEventError as exc:
            if len(frames) == 3 and len(frames[1]) == 8:
                self.health.error("wrong_protocol", (
                    f"{self.url} speaks vLLM/SGLang ZMQ (3 frames: topic, seq, batch), not "
                    "Dynamo's event plane: configure it as a worker's kv_events"), time.time())
            else:
                self.health.error(exc.kind, str(exc), time.time())
            return
        self.handle(msg)

    # --- transports ---------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        if self.transport == "nats":
            asyncio.run(self._run_nats(stop))
        else:
            self._run_zmq(stop)

    def _run_zmq(self, stop: threading.Event) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.url)
        self.ready.set()
        try:
            while not stop.is_set():
                if sock.poll(100):
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._guarded(self.handle_frames, frames)
        finally:
            sock.close(0)

    async def _run_nats(self, stop: threading.Event) -> None:
        import nats  # optional dependency of the NATS transport only
        from nats.errors import NoServersError

        async def on_msg(msg: object) -> None:
            self._guarded(lambda m: self.handle(decode_nats(m.subject, m.data)), msg)

        while not stop.is_set():
            try:
                nc = await nats.connect(self.url, connect_timeout=2, max_reconnect_attempts=-1,
                                        allow_reconnect=True, reconnect_time_wait=1)
            except (NoServersError, OSError, TimeoutError) as exc:
                self.health.error("unreachable", (
                    f"{self.url}: no NATS server answered ({type(exc).__name__}); is it "
                    "Dynamo's NATS?"), time.time())
                await asyncio.sleep(1.0)
                continue
            try:
                await nc.subscribe(self.subject, cb=on_msg)
                await nc.flush()  # the server has the subscription: nothing after is missed
                self.health.counters["subscribed"] = 1
                self.ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.1)
            finally:
                await nc.close()

    def _guarded(self, fn: Callable[..., None], arg: object) -> None:
        try:
            fn(arg)
        except KVEventError as exc:
            self.health.error(exc.kind, str(exc), time.time())
        except Exception as exc:  # one odd message must not stop the plane
            self.health.error("internal_error", f"{type(exc).__name__}: {exc}", time.time())

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, args=(self._stop,), daemon=True,
                                            name=f"kv-plane-{self.name}")
            self._thread.start()

    def close(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
