"""Run the collectors inside another process (the dashboard) on a daemon thread. A crash of
the collector loop (its set-up included) is logged, counted on the next runner's
``supervisor`` health row and followed by a fresh runner after a short pause."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from mmlens.collectors.runner import CollectorRunner
from mmlens.collectors.supervisor import PAUSES_S

from mmlens.config import Config
from mmlens.store.base import SQLStore
from mmlens.store.open import open_store

log = logging.getLogger("mmlens.collect")


@dataclass
class BackgroundCollectors:
    runner: CollectorRunner
    thread: threading.Thread
    stop_event: threading.Event
    store: SQLStore
    client: httpx.Client
    crashes: list[str] = field(default_factory=list)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout=timeout_s)
        self.client.close()
        self.store.close()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def _loop(self, cfg: Config, duration_s: float | None) -> None:
        pause = PAUSES_S[0]
        end = None if duration_s is None else time.monotonic() + duration_s
        while not self.stop_event.is_set():
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                self.runner.run(duration_s=left, stop=self.stop_event)
                return  # stopped, or its time is up
            except Exception as exc:
                log.exception("background collectors crashed; starting them again")
                self.crashes.append(f"{type(exc).__name__}: {exc}")
            self.stop_event.wait(pause)
            pause = min(pause * 2, PAUSES_S[1])
            self.runner = CollectorRunner(cfg, self.store, http=self.client)
            h = self.runner.supervisor_health
            h.error("thread_crashed:collectors", self.crashes[-1], time.time())
            h.count("restarts:collectors", len(self.crashes))


def start_background(cfg: Config, db: str | Path, duration_s: float | None = None,
                     ) -> BackgroundCollectors:
    """Start every collector of ``cfg`` writing to ``db``; the caller reads the same file."""
    store = open_store(db)
    client = httpx.Client()
    stop = threading.Event()
    bg = BackgroundCollectors(CollectorRunner(cfg, store, http=client), threading.Thread(),
                              stop, store, client)
    bg.thread = threading.Thread(target=bg._loop, args=(cfg, duration_s),
                                 name="mmlens-collectors", daemon=True)
    bg.thread.start()
    return bg
