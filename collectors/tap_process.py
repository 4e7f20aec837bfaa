"""The tap's recorder in a process of its own (what ``mmlens tap`` runs): the proxy's event loop
then never waits for the recorder's hold on the interpreter (parsing a 1 MB image request,
hashing it, writing the store), and the recorder runs at a lower priority, so the kernel
gives the core to the proxy first.

The proxy hands each exchange over a bounded queue (full: dropped and counted, never
waited for); its own counters (requests, upstream errors, clients gone) go along every
half second when they changed, and the recorder writes one health row with both.
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
from typing import Any

from mmlens.collectors.tap_record import MAX_BACKLOG_BYTES

from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth

HEALTH_EVERY_S = 0.5
NICE = 10

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
        # Bytes handed over and not yet recorded (the child takes them off once stored).
        self._bytes: Any = ctx.Value("q", 0)
        self._proc = ctx.Process(target=_child, args=(setup, self._q, self._bytes,
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
        if self._bytes.value + size > self.max_backlog_bytes:
            self.health.count("dropped_backlog")
            return
        try:
            self._q.put_nowait(ex)
            with self._bytes.get_lock():
                self._bytes.value += size
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


def _child(setup: Setup, q: Any, in_flight: Any, collector: str, target: str) -> None:
    from mmlens.collectors.tap_record import Recorder

    with contextlib.suppress(OSError):
        os.nice(NICE)
    health = CollectorHealth(collector, target)  # the recorder's counters
    proxy = CollectorHealth(collector, target)  # the proxy's, as last sent
    write, options = setup(health)
    flush = options.pop("flush_health", None)

    def both(row: CollectorHealth) -> None:
        if flush is not None:
            flush(merged(row, proxy))

    rec = Recorder(write, health, flush_health=both, **options)
    done = rec.taken

    def taken(ex: Exchange) -> None:  # the parent may hand over as much again
        done(ex)
        with in_flight.get_lock():
            in_flight.value -= ex.size()

    rec.taken = taken  # type: ignore[method-assign]
    parent = mp.parent_process()
    while True:
        try:
            item = q.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                break  # the proxy was killed: what is held goes to the spill file
            continue
        except (EOFError, OSError):
            break
        if item is None:
            break
        if isinstance(item, tuple):
            proxy = item[1]
            health.counters["proxy_updated"] = time.time()
            continue
        rec.submit(item)
    rec.close()


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
