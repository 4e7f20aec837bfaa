"""The tap's recorder in a process of its own (what ``mmlens tap`` runs): the proxy's event loop
then never waits for the recorder's hold on the interpreter (parsing a 1 MB image request,
hashing it, writing the store), and by default the recorder runs only when the proxy does
not (``SCHED_IDLE`` where the system has it, else nice 10; ``PRIORITIES``): sharing one core,
a woken proxy takes it at once instead of waiting out the recorder's time slice.

The proxy hands each exchange over a pipe as framed bytes (``tap_frames``; a large one's
data through a ring of shared memory beside it), written by its loop once the response is
relayed, the frames of one loop iteration in one write and never
waited for; past the backlog bound an exchange is dropped and counted. Its own counters
(requests, upstream errors, clients gone) go along every half second when they changed, and
the recorder writes one health row with both. The recorder process reads the pipe and
records on one thread (what one read brought is parsed in the read buffer, then read on);
while a store write waits, the pipe and then the proxy's writer hold what comes.

The proxy may be killed at any instant (SIGKILL included), so nothing the recorder needs is
behind a lock the proxy could die holding: the bytes in flight are two counters, each
written by one side only, and the pipe's end tells the recorder the proxy is gone (its last
frame, cut off by the kill, is dropped): it has then read all that was sent, and stops:
what it holds goes to the spill file for the next tap.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import reduction
from typing import Any

from mmlens.collectors.tap_frames import (
    EXCHANGE,
    HEALTH,
    RING_BYTES,
    FrameReader,
    PipeWriter,
    Ring,
    exchange_frame,
    health_frame,
    stop_frame,
)
from mmlens.collectors.tap_record import MAX_BACKLOG_BYTES

from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth

HEALTH_EVERY_S = 0.5
NICE = 10  # "low", and "idle" where there is no SCHED_IDLE
# The recorder's scheduling: "idle" (SCHED_IDLE: only CPU no other thread wants, so the proxy
# never waits behind it) or "low" (nice 10: a share of a busy core).
PRIORITIES = ("idle", "low")
# A read that found less than this in the pipe is followed by a pause: the pipe (1 MB) holds
# what comes meanwhile, and the recorder wakes 200 times a second, not once per exchange
# (a fuller pipe is read on at once: large images come at the pipe's speed).
FEW_BYTES = 128 << 10
GATHER_S = 0.005

# What the child builds its recorder from: (write, flush_health, recorder options) made in
# the child (stores and sessions do not cross processes).
Setup = Callable[[CollectorHealth], tuple[Any, dict[str, Any]]]


class RecorderProcess:
    def __init__(self, setup: Setup, health: CollectorHealth, max_backlog: int = 10_000,
                 max_backlog_bytes: int = MAX_BACKLOG_BYTES, priority: str = "idle") -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"recorder priority {priority!r}: one of {', '.join(PRIORITIES)}")
        self.health = health
        self.max_backlog = max_backlog
        self.max_backlog_bytes = max_backlog_bytes
        ctx = mp.get_context("spawn")
        # Exchanges and bytes handed over (written here only) and taken by the recorder
        # (written there only): lock-free, so a proxy killed mid-submit leaves no lock held.
        self._handed: Any = ctx.RawArray("q", 2)
        self._taken: Any = ctx.RawArray("q", 2)
        read_end, write_end = ctx.Pipe(duplex=False)
        # Where the ring's use begins (written by the recorder only).
        freed: Any = ctx.RawArray("q", 1)
        ring_fd = Ring.memory(RING_BYTES)
        shared = None if ring_fd is None else SharedFd(ring_fd)
        self._proc = ctx.Process(target=_child, args=(setup, read_end, self._taken,
                                                      health.collector, health.target,
                                                      priority, shared, freed),
                                 name="tap-recorder", daemon=True)
        self._proc.start()
        read_end.close()  # the recorder's alone: its end of the stream is the proxy's exit
        self._ring: Ring | None = None
        if ring_fd is not None:
            self._ring = Ring(ring_fd, RING_BYTES, freed)
            os.close(ring_fd)  # (mapped)
        fd = os.dup(write_end.fileno())  # the writer's own (it closes it)
        write_end.close()
        self._pipe = PipeWriter(fd, self._recorder_gone)
        self._sent: tuple[float, int] | None = None
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="tap-health", daemon=True)
        self._ticker.start()

    def submit(self, ex: Exchange) -> None:
        """Called on the proxy's loop: never blocks."""
        size = ex.size()
        handed, taken = self._handed, self._taken
        if (handed[0] - taken[0] >= self.max_backlog
                or handed[1] - taken[1] + size > self.max_backlog_bytes):
            self.health.count("dropped_backlog")
            return
        handed[0] += 1
        handed[1] += size
        self._pipe.send(exchange_frame(ex, self._ring))

    def _recorder_gone(self) -> None:
        self.health.error("recorder", "the recorder process is gone", time.time())

    def _health_snapshot(self) -> CollectorHealth | None:
        state = (sum(self.health.counters.values()), sum(self.health.errors.values()))
        if state == self._sent:
            return None
        self._sent = state
        return replace(self.health, counters=dict(self.health.counters),
                       errors=dict(self.health.errors))

    def _tick(self) -> None:
        while not self._stop.wait(HEALTH_EVERY_S):
            snap = self._health_snapshot()
            if snap is not None:
                self._pipe.send(health_frame(snap))
            else:
                self._pipe.flush()  # what a full pipe left, should the loop be idle

    def close(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        self._ticker.join(2)
        self._sent = None
        snap = self._health_snapshot()
        with contextlib.suppress(OSError):
            self._pipe.close([*health_frame(snap), *stop_frame()])
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)

    @property
    def pid(self) -> int | None:
        return self._proc.pid


class SharedFd:
    """A file descriptor handed to the spawned recorder (as ``multiprocessing`` hands it a
    pipe's end): the child gets its own copy of it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup: Any) -> int:
    return int(dup.detach())


def _child(setup: Setup, read_end: Any, taken_counts: Any, collector: str, target: str,
           priority: str = "idle", ring_fd: int | None = None, freed: Any = None) -> None:
    from mmlens.collectors.tap_record import Recorder

    yield_to_proxy(priority)
    health = CollectorHealth(collector, target)  # the recorder's counters
    proxy = [CollectorHealth(collector, target)]  # the proxy's, as last sent
    write, options = setup(health)
    flush = options.pop("flush_health", None)

    def both(row: CollectorHealth) -> None:
        if flush is not None:
            flush(merged(row, proxy[0]))

    # One thread reads the pipe and records what it read before reading on: no hand-over
    # between threads, and a request's bytes are parsed where the read put them.
    rec = Recorder(write, health, flush_health=both, thread=False, **options)

    rec.taken = lambda ex: None  # type: ignore[method-assign]  (counted as read: below)
    ring = None
    if ring_fd is not None:
        ring = Ring(ring_fd, RING_BYTES, freed)
        os.close(ring_fd)
    rec.run(PipeIntake(FrameReader(read_end.fileno(), ring), rec, proxy, health,
                       taken_counts))


def yield_to_proxy(priority: str) -> None:
    """The recorder's scheduling (``PRIORITIES``). Measured on one core shared with the proxy
    (``benchmarks/tap_latency.py``, 800 sequential requests, 4 rounds, load 0.4-0.7): the
    added p99 2.67 ms at nice 10, 0.25 ms under SCHED_IDLE, the CPU per request the same. But
    SCHED_IDLE runs only on CPU nothing else wants: on a host whose every core is busy, the
    recorder falls behind, and its bounded backlog drops (counted) what nice 10 would have
    recorded; "low" is for such hosts."""
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined]
            return
        except (AttributeError, OSError):
            pass
    with contextlib.suppress(OSError):
        os.nice(NICE)


def _proxy_gone() -> None:
    """The proxy was killed: nobody is left to yield the core to, so the recorder's lower
    priority is given up where the system allows, before it records what it read and
    spills what the store did not take."""
    for t in threading.enumerate():  # a thread's priority is its own on Linux
        with contextlib.suppress(OSError, TypeError, AttributeError):
            os.sched_setscheduler(t.native_id, os.SCHED_OTHER,  # type: ignore[arg-type]
                                  os.sched_param(0))
        with contextlib.suppress(OSError, TypeError):
            os.setpriority(os.PRIO_PROCESS, t.native_id, 0)  # type: ignore[arg-type]


class PipeIntake:
    """The proxy's frames as the recorder's loop takes them (``tap_record.Intake``): the
    exchanges of one read of the pipe, their request bodies borrowed from the reader's
    buffer (parsed before the next read); the proxy's health rows kept aside; None once
    the proxy says stop or its end of the pipe closes without a word (it is gone). The
    exchanges of a read are counted taken at once (the parent may hand over as much again):
    they are recorded before the next read."""

    def __init__(self, reader: FrameReader, rec: Any, proxy: list[CollectorHealth],
                 health: CollectorHealth, taken: Any = None) -> None:
        self.reader = reader
        self.taken = taken  # (exchanges, bytes), shared with the parent
        self.rec = rec
        self.proxy = proxy
        self.health = health
        self.done = False
        self._rest_until = 0.0  # after a read that found little: let more come first
        self._poll = select.poll()
        self._poll.register(reader.fd, select.POLLIN)

    def get(self, timeout: float) -> Any:
        self.reader.release()  # what the last get gave is parsed: the proxy may reuse it
        if self.done:  # the images still being fetched, then the end
            self.rec.close_fetches()
            return self.rec.fetched()
        end = time.monotonic() + timeout
        while True:
            fetched = self.rec.fetched()
            if fetched is not None:
                return fetched
            now = time.monotonic()
            if now < self._rest_until:
                if now >= end:
                    raise queue.Empty
                time.sleep(min(self._rest_until, end) - now)
                continue
            if self._poll.poll(max(0.0, min(end - now, 0.05)) * 1e3):
                return self._read()
            if time.monotonic() >= end:
                raise queue.Empty

    def _read(self) -> list[Exchange] | None:
        try:
            frames = self.reader.read(borrow=True)
        except OSError:
            frames = None
        if frames is None:
            self.done = True
            _proxy_gone()
            return self.get(0.0)
        exchanges = []
        for kind, item in frames:
            if kind == EXCHANGE:
                exchanges.append(item)
            elif kind == HEALTH:
                self.proxy[0] = item
                self.health.counters["proxy_updated"] = time.time()
            else:
                self.done = True
        if exchanges and self.taken is not None:
            self.taken[0] += len(exchanges)
            self.taken[1] += sum(ex.size() for ex in exchanges)
        if self.reader.last_read < FEW_BYTES:
            self._rest_until = time.monotonic() + GATHER_S
        return exchanges


def merged(recorder: CollectorHealth, proxy: CollectorHealth) -> CollectorHealth:
    """One health row: both sides' counters and errors (they count different things),
    the later success and error."""
    row = replace(recorder, counters={**proxy.counters, **recorder.counters},
                  errors={**proxy.errors, **recorder.errors})
    row.counters.pop("proxy_updated", None)
    if (proxy.last_error_ts or 0) > (recorder.last_error_ts or 0):
        row.last_error, row.last_error_ts = proxy.last_error, proxy.last_error_ts
    row.last_success = max(recorder.last_success or 0, proxy.last_success or 0) or None
    return row
