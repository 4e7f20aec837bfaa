"""One Prometheus scrape of ``mmlens collect --metrics-port`` on a store of N image requests
(the recorded store's six requests repeated under new ids, every one judged), against the
floor (fetching the same trace rows without decoding them) and against reading the requests
as whole records (what the exporter did first).

    python benchmarks/export_bench.py [--requests 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the recorded store lives with the tests

from mmlens.collectors.metrics_export import StoreExport  # noqa: E402
from mmlens.collectors.verdict_job import VerdictJob  # noqa: E402

from mmlens.store.open import open_store  # noqa: E402
from mmlens.store.reader import StoreReader  # noqa: E402
from tests.export.metrics_text import scrape  # noqa: E402
from tests.pages.recorded_store import _traces, fill  # noqa: E402


def build(path: str, n: int) -> None:
    rec = fill(path, time.time())
    store = open_store(path)
    base, batch = _traces(rec.now), []
    for i in range(n // len(base)):
        batch += [dataclasses.replace(t, request_id=f"{t.request_id}-{i}", ts=t.ts - i * 0.01)
                  for t in base]
        if len(batch) >= 5000:
            store.add_traces(batch)
            batch = []
    store.add_traces(batch)
    VerdictJob(store).catch_up()
    store.close()


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        build(path, args.requests)
        export, reader = StoreExport(path), StoreReader(path)
        n = reader.trace_count()
        scrape(export)  # warm the page cache and the reader
        floor = median_s(lambda: reader._locked(
            lambda s: s._rows("SELECT body FROM traces")), args.repeat)
        whole = median_s(lambda: reader.recent_traces(n), args.repeat)
        got = median_s(lambda: scrape(export), args.repeat)
        reader.close()
        export.close()
    print(f"{n} stored requests, load average {os.getloadavg()[0]:.1f}, median of "
          f"{args.repeat}")
    print(f"  floor: fetch the trace rows           {floor * 1e3:8.0f} ms")
    print(f"  whole records (first exporter read)    {whole * 1e3:8.0f} ms "
          f"({whole / floor:.1f}x floor)")
    print(f"  one scrape (read + families + text)    {got * 1e3:8.0f} ms "
          f"({got / floor:.1f}x floor, {whole / got:.1f}x faster than whole records alone)")


if __name__ == "__main__":
    main()
