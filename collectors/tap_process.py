"""The tap's recorder in a process of its own (what ``mmlens tap`` runs): the proxy's event loop
then never waits for the recorder's hold on the interpreter (parsing a 1 MB image request,
hashing it, writing the store), and the recorder runs at a lower priority, so the kernel
gives the core to the proxy first.

The proxy hands each exchange over a bounded queue (full: dropped and counted, never
waited for); its own counters (requests, upstream errors, clients gone) go along every
half second when they changed, and the recorder writes one health row with both.

The proxy may be killed at any instant (SIGKILL included), so nothing the recorder needs is
behind a lock the proxy could die holding: the bytes in flight are two counters, each
written by one side only. The recorder watches the proxy's process itself (not only when
its queue is idle) and, the proxy gone, takes what is still in the pipe and stops: what it
holds goes to the spill file for the next tap.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from mmlens.collectors.tap_record import MAX_BACKLOG_BYTES

from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth

HEALTH_EVERY_S = 0.5
NICE = 10
WATCH_S = 0.1  # how often the recorder looks whether the proxy still lives
# The proxy gone: what it sent is taken from the pipe for as long as items keep coming
# (one cut off mid-write by the kill never completes: not waited for past this).
DRAIN_S = 2.0

# What the child builds its recorder from: (write, flush_health, recorder options) made in
# the child (stores and sessions do not cross processes).
Setup = Callable[[CollectorHealth], tuple[Any, dict[str, Any]]]


class RecorderProcess:
    def __init__(self, setup: Setup, health: CollectorHealth, max_backlog: int = 10_000,
                 max_backlog_bytes: int = MAX_BACKLOG_BYTES) -> None:
        self.health = health
        self.max_backlog_bytes = max_backlog_bytes
        ctx = mp.get_context("spawn")
        self._q: Any = ctx.Queue(maxsize=max_backlog)
        # Bytes handed over (written here only) and taken by the recorder (written there
        # only): lock-free, so a proxy killed mid-submit leaves no lock held.
        self._handed: Any = ctx.RawValue("q", 0)
        self._taken: Any = ctx.RawValue("q", 0)
        self._proc = ctx.Process(target=_child, args=(setup, self._q, self._taken,
                                                      health.collector, health.target),
                                 name="tap-recorder", daemon=True)
        self._proc.start()
        self._sent: tuple[float, int] | None = None
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="tap-health", daemon=True)
        self._ticker.start()

    def submit(self, ex: Exchange) -> None:
        """Called on the proxy's loop: never blocks."""
        size = ex.size()
        if self._handed.value - self._taken.value + size > self.max_backlog_bytes:
            self.health.count("dropped_backlog")
            return
        try:
            self._q.put_nowait(ex)
            self._handed.value += size
        except queue.Full:
            self.health.count("dropped_backlog")

    def _send_health(self) -> None:
        state = (sum(self.health.counters.values()), sum(self.health.errors.values()))
        if state == self._sent:
            return
        snap = replace(self.health, counters=dict(self.health.counters),
                       errors=dict(self.health.errors))
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(("health", snap))
            self._sent = state

    def _tick(self) -> None:
        while not self._stop.wait(HEALTH_EVERY_S):
            self._send_health()

    def close(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        self._ticker.join(2)
        self._sent = None
        self._send_health()
        self._q.put(None)
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)

    @property
    def pid(self) -> int | None:
        return self._proc.pid


def _child(setup: Setup, q: Any, taken_bytes: Any, collector: str, target: str) -> None:
    from mmlens.collectors.tap_record import Recorder

    with contextlib.suppress(OSError):
        os.nice(NICE)
    health = CollectorHealth(collector, target)  # the recorder's counters
    proxy = [CollectorHealth(collector, target)]  # the proxy's, as last sent
    write, options = setup(health)
    flush = options.pop("flush_health", None)

    def both(row: CollectorHealth) -> None:
        if flush is not None:
            flush(merged(row, proxy[0]))

    rec = Recorder(write, health, flush_health=both, **options)
    done = rec.taken

    def taken(ex: Exchange) -> None:  # the parent may hand over as much again
        done(ex)
        taken_bytes.value += ex.size()

    rec.taken = taken  # type: ignore[method-assign]
    parent = mp.parent_process()
    gone = threading.Event()
    got = [0]  # items taken from the pipe
    intake = threading.Thread(target=_intake, args=(q, rec, proxy, health, gone, got),
                              name="tap-intake", daemon=True)
    intake.start()
    while intake.is_alive():
        if parent is not None and wait([parent.sentinel], WATCH_S):
            _proxy_gone(gone, intake, got)
            break
        intake.join(0 if parent is not None else WATCH_S)
    rec.close()


def _proxy_gone(gone: threading.Event, intake: threading.Thread, got: list[int]) -> None:
    """The proxy was killed: nobody is left to yield the core to (so the recorder's lower
    priority is given up where the system allows), and what is still in the pipe is taken
    before the recorder stops and spills what it holds."""
    gone.set()
    for t in threading.enumerate():  # a thread's priority is its own on Linux
        with contextlib.suppress(OSError, TypeError):
            os.setpriority(os.PRIO_PROCESS, t.native_id, 0)  # type: ignore[arg-type]
    seen = -1
    while intake.is_alive() and got[0] != seen:
        seen = got[0]
        intake.join(DRAIN_S)


def _intake(q: Any, rec: Any, proxy: list[CollectorHealth], health: CollectorHealth,
            gone: threading.Event, got: list[int]) -> None:
    """The proxy's queue into the recorder until the proxy says stop, or is gone and its
    queue empty."""
    while True:
        try:
            item = q.get(timeout=WATCH_S)
        except queue.Empty:
            if gone.is_set():
                return
            continue
        except (EOFError, OSError):
            return
        if item is None:
            return
        got[0] += 1
        if isinstance(item, tuple):
            proxy[0] = item[1]
            health.counters["proxy_updated"] = time.time()
            continue
        rec.submit(item)


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
