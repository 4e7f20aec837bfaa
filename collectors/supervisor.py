"""Keeps collector threads alive: a crash is counted on a health row and the thread's work is
started again after a short pause, instead of the thread dying silently while the process
(and the dashboard) looks healthy."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mmlens.records import CollectorHealth

log = logging.getLogger("mmlens.collect")

PAUSES_S = (0.1, 5.0)  # first and longest pause before a restart


def supervise(name: str, work: Callable[[], None], stop: threading.Event,
              health: CollectorHealth, pauses_s: tuple[float, float] = PAUSES_S) -> None:
    """Run ``work`` until ``stop`` is set; an exception is reported and ``work`` runs again.
    ``work`` returning while ``stop`` is clear counts as a crash too (it should not)."""
    pause = pauses_s[0]
    while not stop.is_set():
        try:
            work()
            if stop.is_set():
                return
            raise RuntimeError("returned before it was stopped")
        except Exception as exc:  # the thread must outlive any one failure
            log.exception("collector thread %s crashed; restarting", name)
            health.error(f"thread_crashed:{name}", f"{type(exc).__name__}: {exc}", time.time())
            health.count(f"restarts:{name}")
        stop.wait(pause)
        pause = min(pause * 2, pauses_s[1])


def start_supervised(name: str, work: Callable[[], None], stop: threading.Event,
                     health: CollectorHealth) -> threading.Thread:
    thread = threading.Thread(target=supervise, args=(name, work, stop, health), name=name,
                              daemon=True)
    thread.start()
    return thread


def guarded(step: str, work: Callable[[], None], health: CollectorHealth) -> bool:
    """One step of a loop (a tick): an exception is counted and the loop goes on."""
    try:
        work()
    except Exception as exc:
        log.exception("collector step %s failed", step)
        health.error(f"step_failed:{step}", f"{type(exc).__name__}: {exc}", time.time())
        return False
    return True
