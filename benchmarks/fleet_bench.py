"""Fleet load benchmark: simulated workers' KV-event streams → sharded collectors → PostgreSQL.

1. Starts a PostgreSQL server on 127.0.0.1 (as the tests do) and ``--workers`` lightweight
   publishers (``kv_publishers.py``) in ``--pub-processes`` processes, paced to ``--rate``
   blocks/s over all workers.
2. Starts ``--shards`` ``mmlens collect --shard I/N --db postgresql://…`` processes over one
   config listing every worker; publishing starts once every shard has ticked.
3. After ``--duration`` s, lets the collectors drain and prints: blocks sent and stored,
   sustained stored blocks/s over the steady part (after ``--warmup`` s), the end-to-end lag
   (publisher timestamp → committed, each shard's p50/p99/max), batches lost (sequence gaps
   the collectors counted), the store's size per million blocks, and each page's render time
   on that store (plus ``--traces`` request traces and an hour of samples from
   ``pages_bench.py``'s fillers). ``--backend sqlite`` runs the same load into one SQLite
   file, for comparison.

    python benchmarks/fleet_bench.py [--workers 1000] [--shards 4] [--rate 100000]
                                     [--duration 60]

Bounded: everything runs on loopback and stops by itself (publishers after ``--duration``,
collectors after ``--duration`` + 30 s, the server at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.kv_publishers import PublisherFleet, Totals, worker_tables  # noqa: E402
from mmlens.store.open import StoreError, open_store  # noqa: E402
from tests.live_support import free_port_base, stop_process  # noqa: E402
from tests.servers import postgres_server  # noqa: E402


def start_collectors(url: str, config: Path, shards: int, duration: float,
                     log_dir: Path) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "mmlens", "collect", "--config", str(config), "--db", url,
         "--shard", f"{i}/{shards}", "--duration", str(duration)], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=(log_dir / f"shard{i}.log").open("wb"))
        for i in range(shards)]


def shard_rows(db: str) -> dict[str, dict[str, float]]:
    try:
        store = open_store(db, readonly=True)
    except StoreError:
        return {}  # not created yet
    try:
        return {h.target: h.counters for h in store.health() if h.collector == "shard"}
    finally:
        store.close()


def wait_for_shards(db: str, n: int, procs: list[subprocess.Popen[bytes]],
                    timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(shard_rows(db)) < n:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a collector exited before its first tick (see its log)")
        if time.monotonic() > deadline:
            raise TimeoutError("collectors did not tick")
        time.sleep(0.5)


def kv_figures(db: str, t0: float, warmup: float, end: float) -> dict[str, float]:
    """Stored blocks and events, blocks/s stored over the steady part (by publisher time),
    the store's size (KV events, health and resident summaries only at this point) and the
    batches the collectors saw missing."""
    store = open_store(db, readonly=True)
    try:
        counts = store.kv_event_counts()
        steady = store.kv_event_rows(None, since=t0 + warmup, until=end, hashes=False)
        health = store.health()
        size = store.used_bytes()
    finally:
        store.close()
    return {
        "blocks": float(sum(c.get(f"{k}_blocks", 0) for c in counts.values()
                            for k in ("stored", "removed"))),
        "stored_blocks": float(sum(c.get("stored_blocks", 0) for c in counts.values())),
        "events": float(sum(c.get(f"{k}_events", 0) for c in counts.values()
                            for k in ("stored", "removed", "cleared"))),
        "steady_blocks_per_s": sum(r.n_blocks for r in steady) / max(end - t0 - warmup, 1e-9),
        "bytes": float(size),
        "lost_batches": float(sum(h.counters.get("missed_batches", 0) for h in health
                                  if h.collector == "kv_events"))}


def time_pages_on(url: str, traces: int, runs: int) -> dict[str, tuple[float, float]]:
    from benchmarks import pages_bench

    store = open_store(url)
    try:
        pages_bench.fill_store(store, traces, 0, time.time())
    finally:
        store.close()
    os.environ["MMLENS_DB"] = url
    os.environ.pop("MMLENS_CONFIG", None)
    return pages_bench.time_pages(runs, n_traces=traces)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--pub-processes", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100_000, help="offered blocks/s, all workers")
    ap.add_argument("--blocks", type=int, default=16, help="blocks per BlockStored batch")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=1.0, help="collectors' interval_s")
    ap.add_argument("--traces", type=int, default=10_000, help="traces added for the pages")
    ap.add_argument("--page-runs", type=int, default=3)
    return ap.parse_args()


@contextlib.contextmanager
def store_for(backend: str, work: Path) -> Iterator[str]:
    """A new store: a database on a fresh PostgreSQL server, or a SQLite file."""
    if backend == "sqlite":
        yield str(work / "fleet.db")
        return
    import psycopg

    with postgres_server() as pg:
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE mmlens")
        yield pg.url("mmlens")


def run_load(args: argparse.Namespace, db: str, work: Path,
             ) -> tuple[Totals, dict[str, float], dict[str, dict[str, float]]]:
    fleet = PublisherFleet(args.workers, args.pub_processes, free_port_base(args.workers),
                           args.rate, args.blocks, args.duration)
    config = work / "mmlens.toml"
    config.write_text(f"interval_s = {args.interval}\n" + worker_tables(fleet.endpoints()))
    procs = start_collectors(db, config, args.shards, args.duration + 30, work)
    try:
        wait_for_shards(db, args.shards, procs)
        time.sleep(1.0)  # every SUB socket has subscribed by now
        t0 = time.time()
        fleet.run()
        sent = fleet.totals(args.duration + 60)
        end = time.time()
        for p in procs:  # SIGTERM: each collector drains what it received, then exits
            stop_process(p, timeout=60)
        return sent, kv_figures(db, t0, args.warmup, end), shard_rows(db)
    finally:
        fleet.stop()
        for p in procs:
            stop_process(p)


def main() -> int:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="mmlens-fleet-"))
    try:
        with store_for(args.backend, work) as db:
            sent, figs, shards = run_load(args, db, work)
            report(args, sent, figs, shards)
            if args.page_runs:
                pages = time_pages_on(db, args.traces, args.page_runs)
                print("pages (cold / warm median, ms): " + ", ".join(
                    f"{p} {c * 1000:.0f}/{w * 1000:.0f}" for p, (c, w) in pages.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, sent: Totals, figs: dict[str, float],
           shards: dict[str, dict[str, float]]) -> None:
    print(f"{args.backend}: workers {args.workers}, shards {args.shards}, "
          f"offered {args.rate:.0f} blocks/s for {args.duration:.0f} s "
          f"({args.blocks} blocks a batch, interval {args.interval} s)")
    print(f"sent: {sent}")
    print(f"stored: {figs['stored_blocks']:.0f} of {sent.blocks} blocks announced stored "
          f"({figs['stored_blocks'] / max(sent.blocks, 1):.1%}); {figs['blocks']:.0f} blocks "
          f"with removals, in {figs['events']:.0f} events; batches missed (seq gaps) "
          f"{figs['lost_batches']:.0f}")
    print(f"sustained: {figs['steady_blocks_per_s']:.0f} KV-event blocks/s stored "
          f"(stored + removed, publisher time {args.warmup:.0f} s … end)")
    for label in sorted(shards):
        c = shards[label]
        print(f"shard {label}: {c.get('workers', 0):.0f} workers, "
              f"{c.get('kv_events', 0):.0f} events, lag p50 {c.get('store_lag_p50_s', 0):.2f} s"
              f" p99 {c.get('store_lag_p99_s', 0):.2f} s max {c.get('store_lag_max_s', 0):.2f} s")
    if figs["blocks"]:
        print(f"store: {figs['bytes'] / 1e6:.1f} MB, "
              f"{figs['bytes'] / figs['blocks']:.1f} MB per million blocks")


if __name__ == "__main__":
    sys.exit(main())
