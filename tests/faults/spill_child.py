"""A store writer in a process of its own, to be killed: ``python -m tests.faults.spill_child
DB SPILL_DIR write N`` waits for a line on stdin (the test then locks the store), writes N
samples, one a call, through a ``BufferedStore`` holding 10 in memory, and stops with its
backlog (spilled for the next writer); ``... replay`` adopts what writers before it left and
writes it, its outage row stored. Each prints its outage counters as one JSON line."""

from __future__ import annotations

import json
import sys

from mmlens.collectors.store_buffer import BufferedStore

from mmlens.records import MetricSample
from mmlens.store.sqlite import Store


def main(db: str, spill_dir: str, mode: str, n: int = 0) -> None:
    store = Store(db)
    store.db.execute("PRAGMA busy_timeout=200")  # a locked store is down in 0.2 s, not 5
    buffered = BufferedStore(store, spill_dir, max_memory=10, backoff=(0.05, 0.2))
    if mode == "write":
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        for i in range(n):
            buffered.add_samples([MetricSample("t", "n", (), float(i), 1.0 + i)])
        buffered.flush_backlog()
    else:
        while not buffered.retry():
            pass
        buffered.set_health([buffered.outage_health], instance="replay")
    print(json.dumps(buffered.outage_health.counters), flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:]))
