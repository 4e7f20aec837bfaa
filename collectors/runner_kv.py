"""The collector runner's KV side: the engines' KV-event streams (ZMQ endpoints, gRPC streams),
the routers' event planes, the supervised thread that reads the ZMQ sockets, storing what they
queued, and the comparison of a router's view with what the engines hold."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from mmlens.collectors.kv_grpc import GrpcKvCollector
from mmlens.collectors.kv_plane import EventPlaneCollector
from mmlens.collectors.kv_subscriber import KVEventCollector
from mmlens.collectors.supervisor import start_supervised

from mmlens.analysis.kv_divergence import Diffs, compare_counts, compare_sets, engine_block_sets
from mmlens.config import WorkerTarget
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.ingest.lag import LagHistogram
from mmlens.ingest.prompt_end import generation_prompt, suffix_bytes
from mmlens.records import CollectorHealth, KVEvent, MetricSample
from mmlens.store.base import SQLStore

LAG_WINDOW_S = 300.0


class KVSide:
    """Every KV-event source of one runner; events reach the store only through ``drain``."""

    def __init__(self, store: SQLStore, zmq_context: Any,
                 supervisor_health: CollectorHealth) -> None:
        self.store = store
        self.zmq_context = zmq_context
        self.supervisor_health = supervisor_health  # counts restarts of the KV thread
        self._queue: queue.SimpleQueue[list[KVEvent]] = queue.SimpleQueue()
        # Events stored before whose content keys a late batch made known: content rows only.
        self._content: queue.SimpleQueue[list[KVEvent]] = queue.SimpleQueue()
        self.kv = KVEventCollector(context=zmq_context, sink=self._queue.put,
                                   content_sink=self._content.put)
        self.grpc = GrpcKvCollector(self.kv.ingest.index, self.kv.lock, self._queue.put)
        self.planes: list[EventPlaneCollector] = []
        # What each router's event plane told it (Dynamo), beside the engines' own streams.
        self.router_view = ResidentIndex()
        self.view_lock = threading.Lock()
        self._view_diffs: Diffs = {}
        self.transports: dict[str, str] = {}  # worker → zmq | grpc | nats | zmq-broker
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.store_lag, self._lag_since = LagHistogram(), time.time()

    def add_source(self, w: WorkerTarget, running: bool = False) -> None:
        """Read the worker's KV events (its ZMQ endpoints or its gRPC stream); ``running``:
        the KV threads run already (a target added by a config reload)."""
        key = w.router_url or w.name
        if w.model and w.kv_transport:
            self._know_model(key, w.model)
        if w.kv_transport == "grpc" and w.kv_events:
            self.grpc.add_worker(key, w.kv_events, w.engine)
        for rank, pub, replay in w.kv_endpoints():
            if running and self._thread is not None:
                self.kv.add_endpoint_later(key, rank, pub, replay, w.topic)
            else:
                self.kv.add_endpoint(key, rank, pub, replay, w.topic)
        if w.kv_transport:
            self.transports[key] = w.kv_transport
        if running:
            self.grpc.start()
            self._start_thread()

    def _know_model(self, worker: str, model: str) -> None:
        """The worker's generation prompt, so its decode blocks say where prompts ended; a
        model mmlens cannot read is reported, and the events are read without it."""
        try:
            suffix = suffix_bytes(generation_prompt(model))
        except Exception as exc:
            self.supervisor_health.error("worker_model", f"{worker}: {model!r}: "
                                         f"{type(exc).__name__}: {exc}", time.time())
            return
        with self.kv.lock:
            self.kv.ingest.index.prompt_suffixes[worker] = suffix

    def add_plane(self, name: str, url: str, namespace: str) -> None:
        plane: EventPlaneCollector

        def on_events(events: list[KVEvent]) -> None:
            with self.view_lock:
                self.router_view.apply(events)
            # A worker whose engine stream mmlens does not read (a Dynamo deployment
            # configured by its frontend only): the plane is the best view of it there is.
            own = [e for e in events if self.transports.get(e.worker) in (
                None, plane.transport)]
            if own:
                for e in own:
                    self.transports.setdefault(e.worker, plane.transport)
                with self.kv.lock:
                    self.kv.ingest.index.apply(own)
                self._queue.put(own)

        plane = EventPlaneCollector(name, url, on_events, namespace, self.zmq_context)
        self.planes.append(plane)

    def start(self, plane_wait_s: float = 3.0) -> None:
        self.grpc.start()
        for plane in self.planes:
            plane.start()
        # An event plane keeps nothing for late subscribers (NATS Core, ZMQ PUB): wait for
        # the subscriptions before anything (a workload) makes the engines publish.
        deadline = time.monotonic() + plane_wait_s
        for plane in self.planes:
            plane.ready.wait(max(0.0, deadline - time.monotonic()))
        self._start_thread()

    def _start_thread(self) -> None:
        if self.kv.endpoints and self._thread is None:
            self._thread = start_supervised(
                "kv-events", lambda: self.kv.run(self._stop), self._stop,
                self.supervisor_health)

    def drain(self, now: float, shard_health: CollectorHealth | None) -> None:
        """Store the events queued since the last call and the resident summary."""
        events = _take(self._queue)
        if events:
            self.kv.store(events, self.store.add_kv_events)
            if shard_health is not None:
                self._note_store_lag(shard_health, events)
        content = _take(self._content)
        if content:
            self.store.add_kv_content(content)
        if self.kv.endpoints or self.grpc.streams or self.planes:
            summary = self.kv.summary()
            for entry in summary.values():
                entry["transport"] = self.transports.get(entry["worker"])
            self.store.set_kv_state(summary, now)

    def compare_views(self, samples: list[MetricSample], now: float) -> None:
        """Router view vs engine holdings: block sets where a router's event plane is heard
        (Dynamo), block counts where the router exports them (SMG ``smg_kv_index_blocks``)."""
        engine_fed = {w for w, t in self.transports.items() if t in ("zmq", "grpc")}
        with self.view_lock:
            router = {w: s for w, s in engine_block_sets(self.router_view.workers).items()
                      if w in engine_fed}
        with self.kv.lock:
            engine_sets = engine_block_sets(self.kv.ingest.index.workers)
        engine = {w: engine_sets.get(w, set()) for w in router}
        points, self._view_diffs = compare_sets(engine, router, now, self._view_diffs)
        gauge = {s.label("worker"): int(s.value) for s in samples
                 if s.name == "smg_kv_index_blocks" and s.label("worker")}
        points += compare_counts({w: len(engine_sets.get(w, ())) for w in gauge
                                  if w in engine_fed}, gauge, now)
        if points:
            self.store.add_kv_views(points)

    def _note_store_lag(self, h: CollectorHealth, events: list[KVEvent]) -> None:
        """Publisher timestamp → committed in the store, per shard, over the last window."""
        committed = time.time()
        if committed - self._lag_since > LAG_WINDOW_S:
            self.store_lag, self._lag_since = LagHistogram(), committed
        self.store_lag.add(committed - ev.ts for ev in events)
        h.count("kv_events", len(events))
        for key, q in (("store_lag_p50_s", 0.5), ("store_lag_p99_s", 0.99)):
            h.counters[key] = self.store_lag.quantile(q) or 0.0
        h.counters["store_lag_max_s"] = self.store_lag.max

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def close(self) -> None:
        self.stop()
        self.grpc.close()
        for plane in self.planes:
            plane.close()
        self.kv.close()


def _take(q: queue.SimpleQueue[list[KVEvent]]) -> list[KVEvent]:
    out: list[KVEvent] = []
    while True:
        try:
            out.extend(q.get_nowait())
        except queue.Empty:
            return out
