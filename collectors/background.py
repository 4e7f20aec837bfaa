"""Run the collectors inside another process (the dashboard) on a daemon thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config
from mmlens.store.base import SQLStore
from mmlens.store.open import open_store


@dataclass
class BackgroundCollectors:
    runner: CollectorRunner
    thread: threading.Thread
    stop_event: threading.Event
    store: SQLStore
    client: httpx.Client

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout=timeout_s)
        self.client.close()
        self.store.close()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


def start_background(cfg: Config, db: str | Path, duration_s: float | None = None,
                     ) -> BackgroundCollectors:
    """Start every collector of ``cfg`` writing to ``db``; the caller reads the same file."""
    store = open_store(db)
    client = httpx.Client()
    runner = CollectorRunner(cfg, store, http=client)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"duration_s": duration_s, "stop": stop},
                              name="mmlens-collectors", daemon=True)
    thread.start()
    return BackgroundCollectors(runner, thread, stop, store, client)
