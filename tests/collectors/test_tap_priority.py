"""The tap recorder's scheduling, as the kernel reports it for a process that asked for it:
"idle" is SCHED_IDLE (where Linux has it), "low" stays SCHED_OTHER at nice 10."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
from mmlens.collectors.tap_process import NICE, RecorderProcess, yield_to_proxy

from mmlens.records import CollectorHealth


def _report(priority: str, out: mp.Queue) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    yield_to_proxy(priority)
    out.put((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0) - base))


def scheduling(priority: str) -> tuple[int, int]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_report, args=(priority, out))
    p.start()
    try:
        return out.get(timeout=30)
    finally:
        p.join(10)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE on this system")
def test_idle_is_sched_idle() -> None:
    policy, _ = scheduling("idle")
    assert policy == os.SCHED_IDLE


def test_low_is_a_nice_share_of_a_busy_core() -> None:
    assert scheduling("low") == (os.SCHED_OTHER, NICE)


def test_an_unknown_priority_is_refused_before_a_process_starts() -> None:
    with pytest.raises(ValueError, match="one of idle, low"):
        RecorderProcess(lambda h: None, CollectorHealth("tap", "t"), priority="high")
