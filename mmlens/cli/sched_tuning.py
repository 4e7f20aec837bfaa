"""The scheduler's time slice of ``mmlens tap``'s proxy thread (Linux 6.12 and later).

The proxy sleeps between reads and needs the core for tens of microseconds at a time, while
whatever shares its core (its own recorder, any other process) may run for a whole slice:
under EEVDF a woken thread waits until the running one's slice is used up unless its own
slice is shorter (``PREEMPT_SHORT``), and the default slice is 0.75 ms × (1 + log2 cores).
Measured (``benchmarks/tap_latency.py``): with a busy loop on the tap's core the added p99
4.06 ms against 6.23 ms with the default slice; on a quiet machine no difference (the
recorder, the tap's own neighbour, runs under SCHED_IDLE). A thread asking for a short slice through
``sched_setattr`` (``sched_runtime`` of a ``SCHED_OTHER`` thread, 0.1 to 100 ms) preempts
on waking, and its CPU share is unchanged (only how it is cut). Older kernels ignore the
field; where the call is not there, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import threading

SLICE_NS = 100_000  # the kernel's shortest
SCHED_OTHER = 0
# sched_setattr's number per architecture (asm/unistd.h).
SYSCALL = {"x86_64": 314, "aarch64": 274, "arm64": 274}
# struct sched_attr, as first defined (SCHED_ATTR_SIZE_VER0): size, policy, flags, nice,
# priority, runtime, deadline, period.
ATTR = struct.Struct("=IIQiIQQQ")


def set_slice(ns: int, tid: int = 0) -> bool:
    """Ask for a slice of ``ns`` nanoseconds for thread ``tid`` (0: the calling thread; 0
    ns: the kernel's default), keeping its nice value; True when the kernel took it."""
    number = SYSCALL.get(platform.machine())
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        nice = os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError):
        return False
    attr = ctypes.create_string_buffer(ATTR.pack(ATTR.size, SCHED_OTHER, 0, nice, 0, ns, 0, 0))
    return int(libc.syscall(number, tid, attr, 0)) == 0


def slice_ns(tid: int = 0) -> int | None:
    """The slice thread ``tid`` runs with, in nanoseconds (``/proc``), None where not shown."""
    try:
        with open(f"/proc/{os.getpid() if tid == 0 else tid}/task/"
                  f"{tid or threading.get_native_id()}/sched") as f:
            for line in f:
                if line.startswith("se.slice"):
                    return int(line.split(":")[1])
    except (OSError, ValueError):
        return None
    return None
