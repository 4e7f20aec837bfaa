"""Runs every collector of a config into the store: the headless ``mmlens collect`` loop, also
usable in-process by the dashboard (``tick()`` on its own schedule)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from mmlens.collectors.availability_job import AvailabilityJob
from mmlens.collectors.log_follow import (
    LogFollower,
    StreamFollower,
    resume_followers,
    save_positions,
)
from mmlens.collectors.metrics_scrape import MetricsScraper
from mmlens.collectors.observed_sink import ObservedSink
from mmlens.collectors.otlp_receiver import OtlpReceiver
from mmlens.collectors.prometheus_source import PromQLSource
from mmlens.collectors.rollup_job import RollupJob
from mmlens.collectors.router_state import RouterStateCollector
from mmlens.collectors.runner_kv import KVSide
from mmlens.collectors.store_buffer import MAX_MEMORY, BufferedStore
from mmlens.collectors.supervisor import guarded
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.verdict_job import VerdictJob

from mmlens.analysis.liveness import liveness_names
from mmlens.config import (
    Config,
    RouterTarget,
    WorkerTarget,
    apply_ready,
    read_ready_file,
    smg_worker_target,
)
from mmlens.ingest.dynamo_logs import ModelMmRouting, merge_mm_routing, model_mm_routing
from mmlens.ingest.observed import name_router
from mmlens.ingest.observed_logs import Attempts, read_lines
from mmlens.ingest.observed_spans import READ_SPANS, read_spans
from mmlens.ingest.sample_thinning import SampleThinner
from mmlens.records import CollectorHealth, RequestTrace, SpanRecord
from mmlens.shard import COLLECTOR as SHARD_COLLECTOR
from mmlens.shard import Shard
from mmlens.store.base import SQLStore

log = logging.getLogger("mmlens.collect")

# The share of a tick's interval its log reading may take while a backlog remains.
LOG_SHARE = 0.8
# How soon between ticks lines appended to a followed log are read.
LOG_POLL_S = 0.25
WORKER_LOG = "worker:"  # a worker's own log among the followers (the rest: routers')
_RUNNERS = itertools.count()  # two runners in one process (tests, a dashboard) are two rows


class CollectorRunner:
    def __init__(self, cfg: Config, store: SQLStore, http: httpx.Client | None = None,
                 zmq_context: Any = None, prom: Any = None,
                 log_streams: dict[str, Any] | None = None, shard: Shard | None = None,
                 spill_dir: str | Path | None = None, buffer_records: int = MAX_MEMORY,
                 ) -> None:
        self.cfg = cfg
        self.configured_workers = {w.name for w in cfg.workers}  # named by the config file
        # Appends held through a store outage (bounded, spilling to ``spill_dir``), retried.
        self.store: Any = BufferedStore(store, spill_dir, max_memory=buffer_records)
        self.shard = shard
        self.leads = shard is None or shard.leads
        self.http = http or httpx.Client(follow_redirects=False)
        self.scraper = MetricsScraper(self.http, timeout_s=cfg.timeout_s)
        # What of each scrape is stored: changes, a keyframe a minute, liveness always.
        self.thinner = SampleThinner(always=liveness_names())
        self.router_state = RouterStateCollector(self.http, timeout_s=cfg.timeout_s)
        # Crashed collector threads (restarted) and failed tick steps, counted.
        self.supervisor_health = CollectorHealth("supervisor", "collect")
        self.kv_side = KVSide(self.store, zmq_context, self.supervisor_health)
        # Its parts, by the names the runner's callers use.
        self.kv, self.kv_grpc = self.kv_side.kv, self.kv_side.grpc
        self.planes, self.router_view = self.kv_side.planes, self.kv_side.router_view
        self.kv_transports = self.kv_side.transports
        self.promql = PromQLSource(prom) if prom is not None else None
        self.followers: dict[str, LogFollower | StreamFollower] = dict(log_streams or {})
        self._attempts: dict[str, Attempts] = {}  # SMG's retries, per router log
        self._kinds: dict[str, str] = {}  # a followed router log's kind
        self.log_health: dict[str, CollectorHealth] = {}
        self._log_positions: dict[str, Any] = {}
        self.dynamo_mm_routing: dict[str, ModelMmRouting] = {}
        self.discovery_health = CollectorHealth("discovery", "config")
        # Records the store refused because they would not read back, named (``readback``).
        self.store_health = CollectorHealth("store", "writes", errors=store.rejected)
        # Health rows are kept per collector process: two collectors on one store both show.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{next(_RUNNERS)}"
        self.shard_health = None if shard is None else CollectorHealth(SHARD_COLLECTOR,
                                                                       shard.label)
        self.ticks = 0
        self._quarantined: list[dict[str, Any]] = []
        # Requests mmlens did not send: router logs, OTLP spans (and the tap, its own process).
        self.traces = TraceSink(self.store.add_traces)
        self.observed = ObservedSink(self.traces.record_all, self.store.add_decisions)
        self.otlp: OtlpReceiver | None = None
        # Available vs achieved, over every shard's KV events: the lead evaluates requests.
        self.availability: AvailabilityJob | None = None
        self.availability_health = CollectorHealth("availability", "requests")
        # One verdict per request, judged once the request settled (and once more on late
        # evidence): every view reads it.
        self.verdicts: VerdictJob | None = None
        self.verdict_health = CollectorHealth("verdicts", "requests")
        # Per-worker minutes the pages read on fleets, from every shard's rows: the lead's.
        self.rollups = RollupJob(store)
        self.rollup_health = CollectorHealth("rollups", "worker_minutes")

    # --- set-up ----------------------------------------------------------------------------

    def setup(self) -> None:
        if self.cfg.ready_file:
            try:
                for note in apply_ready(self.cfg, read_ready_file(self.cfg.ready_file),
                                        Path(self.cfg.ready_file).parent):
                    self.discovery_health.error("ready_file_log", note, time.time())
            except (OSError, ValueError) as exc:
                self.discovery_health.error("ready_file", str(exc), time.time())
        for router in self.cfg.routers:
            self.add_router(router)
        for name in resume_followers(self.store, self.followers):
            self.log_health.setdefault(name, CollectorHealth("router_logs", name)).count(
                "resumed")
        if self.leads and (self.cfg.otlp_grpc_port is not None
                           or self.cfg.otlp_http_port is not None):
            self.start_otlp()
        if self.leads:  # the whole fleet, before a shard keeps its own workers
            self.store.set_meta("targets", self.targets())
        self._keep_own_share()
        for w in self.cfg.workers:
            self.add_kv_source(w)
            self.add_worker_log(w)
        for router in self.cfg.routers:
            if router.event_plane:
                self.kv_side.add_plane(router.name, router.event_plane, router.namespace)
        if self.promql is not None:
            self.promql.instance_targets = {
                urlsplit(url).netloc: name for name, url in self.metric_targets()}

    def add_router(self, router: RouterTarget) -> None:
        """Follow its log; on SMG with ``discover_workers``, add the workers it lists."""
        if router.log_file and router.name not in self.followers:
            self.followers[router.name] = LogFollower(router.log_file)
        self._kinds[router.name] = router.kind
        if router.discover_workers:
            state = self.router_state.poll(router)
            for w in RouterStateCollector.workers_of(state):
                if self.cfg.add_worker(smg_worker_target(w.url, {"runtime_type": w.runtime})):
                    self.discovery_health.count("discovered_workers")

    def add_worker_log(self, w: WorkerTarget) -> None:
        """Follow a worker's own log: when each request reached it, on its clock."""
        if w.log_file and WORKER_LOG + w.name not in self.followers:
            self.followers[WORKER_LOG + w.name] = LogFollower(w.log_file)

    def add_kv_source(self, w: WorkerTarget, running: bool = False) -> None:
        """Read the worker's KV events (its ZMQ endpoints or its gRPC stream); ``running``:
        the KV threads run already (a target added by a config reload)."""
        self.kv_side.add_source(w, running)

    def _keep_own_share(self) -> None:
        """A shard keeps the workers it owns; shards other than 0 drop the routers (their
        metrics, state and logs are shard 0's) and leave PromQL to shard 0."""
        if self.shard is None:
            return
        fleet = len(self.cfg.workers)
        self.cfg.workers = [w for w in self.cfg.workers if self.shard.owns(w)]
        if not self.leads:
            self.cfg.routers = []
            self.followers.clear()
        assert self.shard_health is not None
        self.shard_health.counters.update(
            fleet_workers=fleet, workers=len(self.cfg.workers),
            kv_endpoints=sum(len(w.kv_endpoints()) for w in self.cfg.workers))

    def start_otlp(self) -> None:
        """The OTLP receiver (ports from the config; a port that cannot be bound is a
        collector error, the rest of the collectors run on)."""
        rx = OtlpReceiver(self.on_spans, self.cfg.otlp_host, self.cfg.otlp_grpc_port,
                          self.cfg.otlp_http_port, wanted=READ_SPANS)
        try:
            self.otlp = rx.start()
        except (OSError, RuntimeError) as exc:
            self.discovery_health.error("otlp_bind", str(exc), time.time())
            return
        log.info("OTLP receiver on %s", rx.endpoints())

    def on_spans(self, spans: list[SpanRecord]) -> None:
        frags, decisions = read_spans(spans)
        for kind in {f.router_kind for f in frags}:
            named = [r.name for r in self.cfg.routers if r.kind == kind]
            if len(named) == 1:  # spans do not name the router; the config's one of its kind
                name_router((f for f in frags if f.router_kind == kind), named[0],
                            "config:otlp")
        self.observed.add(frags, decisions)

    def metric_targets(self) -> list[tuple[str, str]]:
        out = [(r.name, r.metrics_url) for r in self.cfg.routers if r.metrics_url]
        out += [(w.router_url or w.name, w.metrics_url) for w in self.cfg.workers if w.metrics_url]
        return [(n, u) for n, u in out if u]

    def targets(self) -> dict[str, Any]:
        return {
            "routers": [{"name": r.name, "kind": r.kind, "url": r.url,
                         "metrics_url": r.metrics_url, "log_file": r.log_file,
                         "api_key_env": r.api_key_env, "media_origin": r.media_origin}
                        for r in self.cfg.routers],
            "workers": [{k: v for k, v in asdict(w).items()} for w in self.cfg.workers],
            "prometheus": self.cfg.prometheus_url,
            "otlp": None if self.otlp is None else {
                "host": self.otlp.host, "grpc_port": self.otlp.grpc_port,
                "http_port": self.otlp.http_port},
        }

    def start_kv(self, plane_wait_s: float = 3.0) -> None:
        self.kv_side.start(plane_wait_s)

    # --- one round ---------------------------------------------------------------------------

    def tick(self) -> None:
        now, started = time.time(), time.monotonic()
        self.store.retry()
        if self.promql is not None:
            samples = self.promql.instant() if self.leads else []
        else:
            samples = self.scraper.scrape_all(self.metric_targets())
        self.store.add_samples(self.thinner.keep(samples))
        self.kv_side.compare_views(samples, now)

        if self.leads:
            states = [self.router_state.poll(r) for r in self.cfg.routers]
            self.store.set_meta("router_state", states)

        # A backlog of log lines may take most of the tick, not the rest of it.
        self._read_logs(started + LOG_SHARE * self.cfg.interval_s)
        self.observed.flush()
        self.kv_side.drain(now, self.shard_health)
        self._evaluate_availability(now)
        self._judge(now)
        self._write_rollups(now)
        self.ticks += 1
        if self.shard_health is not None:
            self.shard_health.ok(now)
            self.shard_health.counters["ticks"] = self.ticks
        self.store.set_health(self.all_health(), now, self.instance)
        self._save_quarantined()
        if self.leads and self.ticks % 12 == 1 and self.store.down_since is None:
            self.store.prune(self.cfg.retention_s, self.cfg.max_mb * 1e6, now)

    def _read_log(self, name: str, follower: LogFollower | StreamFollower) -> bool:
        """One read of one log, its decisions stored and fragments handed to the sink;
        whether more is waiting."""
        h = self.log_health.setdefault(name, CollectorHealth(
            "worker_logs" if name.startswith(WORKER_LOG) else "router_logs", name))
        lines = follower.read_new()
        if getattr(follower, "refused", 0):
            h.errors["symlink_refused"] = follower.refused
        if getattr(follower, "dropped", 0):
            h.errors["lines_dropped"] = follower.dropped
        h.counters["backlog_bytes"] = getattr(follower, "backlog", 0)
        if not lines:
            return False
        found, frags = read_lines(lines, h.errors,
                                  self._attempts.setdefault(name, Attempts()),
                                  getattr(follower, "first_seq", None))
        if not name.startswith(WORKER_LOG):
            name_router(frags, name, "config:log_file")
        # Dynamo says once per model whether it routes images exactly, and why not (an SMG
        # router's log has no such line).
        if self._kinds.get(name) != "smg" and merge_mm_routing(self.dynamo_mm_routing,
                                                                model_mm_routing(lines)):
            self.store.set_meta("dynamo_mm_routing", {
                m: asdict(v) for m, v in self.dynamo_mm_routing.items()})
        now = time.time()
        for d in found:
            if d.ts is None:
                d.ts = now
        # Stored on their own: every trace meets its decisions when read (the one join).
        self.store.add_decisions(found)
        self.observed.add(frags)
        h.ok(now)
        h.count("lines", len(lines))
        h.count("decisions", len(found))
        return getattr(follower, "backlog", 0) > 0

    def _save_quarantined(self) -> None:
        """The bad items every collector set aside lately, named, when they changed."""
        items = [{"collector": h.collector, "target": h.target, **q}
                 for h in self.all_health() for q in h.quarantined]
        if items != self._quarantined:
            self.store.set_quarantined(items, self.instance)
            self._quarantined = items

    def _read_logs(self, deadline: float) -> None:
        """Each followed log read up to its end, or until ``deadline`` (monotonic) while a
        backlog remains: the logs in turn, one read (``LogFollower.max_read``) each per
        round, so one busy log does not starve the rest, and the positions saved after each
        round; while the store is down, one round. What is left unread is the log's
        ``backlog_bytes`` (the Overview then says the collector is behind)."""
        pending = list(self.followers.items())
        while pending:
            pending = [(name, f) for name, f in pending if self._read_log(name, f)]
            self._save_positions()
            # A store that is down holds what is read in memory, then in a spill file: the
            # log file itself keeps the rest better, so one round a tick until it is back.
            if time.monotonic() >= deadline or self.store.down_since is not None:
                break

    def logs_behind(self) -> bool:
        return any(getattr(f, "backlog", 0) > 0 for f in self.followers.values())

    def _save_positions(self) -> None:
        # The lines read count as read once their decisions are stored or in a spill file
        # (what only this process holds would be lost with it).
        if self.store.down_since is None and not self.store.held_in_memory:
            try:
                self._log_positions = save_positions(self.store, self.followers,
                                                     self._log_positions)
            except Exception as exc:
                if not self.store.is_outage(exc):
                    raise

    def record_traces(self, traces: list[RequestTrace]) -> None:
        """Traces sent elsewhere in this process (``mmlens collect --workload``), stored now."""
        self.traces.record_all(traces)

    def flush(self) -> None:
        self._read_logs(time.monotonic() + LOG_SHARE * self.cfg.interval_s)
        self.observed.flush(force=True)
        self.kv_side.drain(time.time(), self.shard_health)
        self._evaluate_availability(time.time(), settle_s=0.0)
        self._judge(time.time(), settle_s=0.0)
        self._write_rollups(time.time(), force=True)
        self.store.set_health(self.all_health(), instance=self.instance)
        self._save_quarantined()

    def _settle(self, settle_s: float | None) -> float:
        return self.cfg.settle_s if settle_s is None else settle_s

    def _evaluate_availability(self, now: float, settle_s: float | None = None) -> None:
        if not self.leads:
            return
        try:
            if self.availability is None:
                self.availability = AvailabilityJob(self.store)
            tail = self.availability.kv_tail
            late, dropped = tail.late, tail.dropped
            revised = self.availability.revised
            done = self.availability.run(now, self._settle(settle_s))
        except Exception as exc:  # one failed pass must not stop collection
            log.exception("availability pass failed")
            self.availability_health.error("evaluate", f"{type(exc).__name__}: {exc}", now)
            return
        self.availability_health.ok(now)
        self.availability_health.count("requests", len(done))
        # Rows replaced once later KV events named their images (AvailabilityJob.unresolved).
        self.availability_health.count("revised", self.availability.revised - revised)
        # KV rows another shard committed after higher ids were read, and id gaps given up
        # on before anything came (``IdTail``).
        self.availability_health.count("late_kv_rows", tail.late - late)
        self.availability_health.count("kv_gaps_dropped", tail.dropped - dropped)

    def _judge(self, now: float, settle_s: float | None = None) -> None:
        if not self.leads:
            return
        try:
            if self.verdicts is None:
                self.verdicts = VerdictJob(self.store)
            job = self.verdicts
            job.run(now, self._settle(settle_s))
        except Exception as exc:  # one failed pass must not stop collection
            log.exception("verdict pass failed")
            self.verdict_health.error("judge", f"{type(exc).__name__}: {exc}", now)
            return
        self.verdict_health.ok(now)
        self.verdict_health.counters.update(judged=job.judged, rejudged=job.rejudged,
                                            pending=job.pending)

    def _write_rollups(self, now: float, force: bool = False) -> None:
        if not self.leads:
            return
        try:
            n = self.rollups.run(now, force)
        except Exception as exc:  # a failed pass is retried next time; collection goes on
            log.exception("rollup pass failed")
            self.rollup_health.error("rollup", f"{type(exc).__name__}: {exc}", now)
            return
        if n:
            self.rollup_health.ok(now)
            self.rollup_health.count("minutes_written", n)

    def all_health(self) -> list[CollectorHealth]:
        items = list(self.scraper.health.values()) + list(self.router_state.health.values())
        items += [ep.health for ep in self.kv.endpoints] + list(self.log_health.values())
        items += self.kv_grpc.health + [p.health for p in self.planes]
        items += [self.discovery_health, self.supervisor_health, self.observed.health,
                  self.store_health, self.store.outage_health]
        if self.leads:
            items += [self.availability_health, self.verdict_health, self.rollup_health]
        if self.otlp is not None:
            items.append(self.otlp.health)
        if self.shard_health is not None:
            items.append(self.shard_health)
        if self.promql is not None and self.leads:
            items.append(self.promql.health)
        return items

    # --- loop --------------------------------------------------------------------------------

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None,
            on_tick: Callable[[CollectorRunner], None] | None = None) -> None:
        stop = stop or threading.Event()
        self.setup()
        self.start_kv()
        end = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not stop.is_set():
                started = time.monotonic()
                guarded("tick", self.tick, self.supervisor_health)
                if on_tick is not None:
                    guarded("on_tick", lambda: on_tick(self), self.supervisor_health)
                if end is not None and time.monotonic() >= end:
                    break
                wait = self.cfg.interval_s - (time.monotonic() - started)
                if self.logs_behind() and self.store.down_since is None:
                    wait = 0.0  # catching up: the next tick at once
                if end is not None:
                    wait = min(wait, end - time.monotonic())
                if wait > 0:
                    self._wait_reading_logs(stop, wait)
            self.stop_kv()  # the KV thread drains its sockets and open replays first
            guarded("tick", self.tick, self.supervisor_health)
            guarded("flush", self.flush, self.supervisor_health)
        finally:
            self.close()

    def _wait_reading_logs(self, stop: threading.Event, wait: float) -> None:
        """The wait between ticks, in which lines appended to a followed log are read within
        ``LOG_POLL_S`` (their decisions stored then) and requests are written once the sink
        has held them its ``hold_s``, not at the next tick."""
        due = time.monotonic() + wait
        while True:
            left = due - time.monotonic()
            if left <= 0 or stop.wait(min(LOG_POLL_S, left)):
                return
            if self.store.down_since is None and any(
                    f.has_new() for f in self.followers.values() if hasattr(f, "has_new")):
                guarded("logs", lambda: self._read_logs_now(due), self.supervisor_health)
            elif self.observed.pending():  # requests held for late fragments, once settled
                guarded("flush", self.observed.flush, self.supervisor_health)

    def _read_logs_now(self, due: float) -> None:
        self._read_logs(due)
        self.observed.flush()
        self.store.set_health([*self.log_health.values(), self.observed.health], time.time(),
                              self.instance)

    def stop_kv(self, timeout_s: float = 5.0) -> None:
        self.kv_side.stop(timeout_s)

    def close(self) -> None:
        self.store.flush_backlog()
        if self.otlp is not None:
            self.otlp.stop()
            self.otlp = None
        self.kv_side.close()
        self.scraper.close()

