"""KV-event ingest throughput at a steady-state resident index, the collector path with its
store, and the index's memory (prints figures; not a unit test).

Usage: python benchmarks/kv_ingest.py [--batches N] [--resident N] [--store sqlite|postgresql]
    [--memory N] [--json]

1. A realistic batch mix is encoded once: per engine step one batch of 1–4 events; stores of
   1–32 blocks of 16 tokens (a quarter of them one image from the fifth token on: its run is
   the placeholder id, vLLM-main ``extra_keys`` name it per block), removals of the oldest
   blocks that keep the worker at ``--resident`` blocks (no clear ever empties the index); 70 %
   map-encoded events (vLLM ≥ #42892), 30 % array-encoded (legacy / SGLang, signed hashes).
   A fill phase, not timed, first brings the index to ``--resident`` blocks.
2. On one core, CPU time of this process: ``msgspec`` decode of the same payloads (the
   floor), then ``KVIngest`` (decode + normalize + content keys + resident index).
3. The collector path: ``KVIngest`` plus ``add_kv_events`` (events and content keys) into a
   fresh store, one transaction per 200 batches, beside a minimal recorder of the same events
   (decode, one row per event: its kind and msgpack'd hashes) into the same backend. SQLite:
   WAL, synchronous=NORMAL (the store's own settings); PostgreSQL: a fresh server on
   127.0.0.1 with default durability (fsync, synchronous_commit, full_page_writes on); the
   server's CPU is reported apart.
4. ``--memory`` resident blocks: RSS growth of the index per million blocks.

Every phase runs under the collector's garbage-collector settings (``mmlens.cli.gc_tuning``,
as ``mmlens collect`` runs): with CPython's defaults, full collections walking the resident
index's image tuples were ~6 % of the collector path's CPU samples (perf, 20,000 batches).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from mmlens.cli.gc_tuning import tune_gc
from mmlens.ingest.kv_index import KVIngest, ResidentIndex
from mmlens.records import BlockStored, ImageRef

BLOCK = 16
IMAGE_PAD = 151655  # Qwen's <|image_pad|>: vLLM keeps the placeholder id over an image's run
COMMIT_EVERY = 200  # batches per store transaction (a collector tick's worth at 200 steps/s)


class Mix:
    """The event generator: one worker's stream, resident blocks kept at ``resident``."""

    def __init__(self, resident: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.resident = resident
        self.live: deque[int] = deque()
        self.prev: int | None = None
        self.step = 0
        self.enc = msgspec.msgpack.Encoder()

    def stored(self, as_map: bool) -> tuple[object, int]:
        rng = self.rng
        n = rng.randint(1, 32)
        hashes = [rng.getrandbits(64) for _ in range(n)]
        tokens = [rng.randrange(151000) for _ in range(n * BLOCK)]
        image = rng.random() < 0.25
        extra: list[object] | None = None
        if image:
            tokens[4:] = [IMAGE_PAD] * (n * BLOCK - 4)
            ident = f"{rng.getrandbits(256):064x}"
            extra = [[[ident, 4 - BLOCK * i]] for i in range(n)]
        parent = self.prev if rng.random() < 0.5 else None
        self.live.extend(hashes)
        self.prev = hashes[-1]
        if as_map:
            return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                    "token_ids": tokens, "block_size": BLOCK, "lora_id": None,
                    "medium": "GPU", "lora_name": None, "extra_keys": extra or [None] * n,
                    "group_idx": 0, "kv_cache_spec_kind": "full_attention"}, n

        def signed(h: int) -> int:  # SGLang's int64
            return h - (1 << 64) if h >= 1 << 63 else h

        return ["BlockStored", [signed(h) for h in hashes],
                None if parent is None else signed(parent), tokens, BLOCK, None, "GPU", None,
                extra], n

    def removed(self, as_map: bool) -> tuple[object, int]:
        k = min(len(self.live) - self.resident, self.rng.randint(1, 16))
        gone = [self.live.popleft() for _ in range(k)]
        return ({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"} if as_map
                else ["BlockRemoved", gone, "GPU", None]), k

    def batch(self, fill: bool) -> tuple[bytes, int]:
        rng = self.rng
        as_map = rng.random() < 0.7
        events, blocks = [], 0
        for _ in range(rng.randint(1, 4)):
            if not fill and len(self.live) > self.resident + 16:
                ev, n = self.removed(as_map)
            else:
                ev, n = self.stored(as_map)
            events.append(ev)
            blocks += n
        self.step += 1
        return self.enc.encode([1_800_000_000.0 + self.step * 0.01, events, 0]), blocks

    def payloads(self, n_batches: int) -> tuple[list[bytes], list[bytes], int]:
        """(fill payloads, timed payloads, blocks stored + removed in the timed ones)."""
        fill = []
        while len(self.live) < self.resident:
            fill.append(self.batch(True)[0])
        timed, blocks = [], 0
        for _ in range(n_batches):
            p, n = self.batch(False)
            timed.append(p)
            blocks += n
        return fill, timed, blocks


def cpu_time(fn: Callable[[], object]) -> float:
    """CPU seconds of this process (meaningful on a shared, loaded machine)."""
    gc.collect()
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def decode_floor(timed: list[bytes]) -> Callable[[], None]:
    dec = msgspec.msgpack.Decoder()

    def run() -> None:
        for p in timed:
            dec.decode(p)
    return run


def filled_ingest(fill: list[bytes]) -> KVIngest:
    ingest = KVIngest()
    for seq, p in enumerate(fill):
        ingest.ingest("w0", seq, p)
    return ingest


def bench_ingest(fill: list[bytes], timed: list[bytes], blocks: int) -> dict[str, float]:
    ingest = filled_ingest(fill)
    start = len(fill)

    def run() -> None:
        for seq, p in enumerate(timed, start):
            ingest.ingest("w0", seq, p)

    c_dec = cpu_time(decode_floor(timed))
    c_all = cpu_time(run)
    resident = sum(len(r.blocks) for r in ingest.index.workers.values())
    assert not ingest.errors, ingest.errors
    out = {"ingest_mblocks": blocks / c_all / 1e6, "decode_mblocks": blocks / c_dec / 1e6,
           "resident": resident}
    print(f"timed: {len(timed)} batches, {blocks} blocks (stored + removed), "
          f"{sum(map(len, timed)) / 1e6:.1f} MB msgpack; resident index {resident} blocks")
    print(f"msgspec decode only : {out['decode_mblocks']:5.2f} M blocks per CPU-second")
    print(f"KVIngest            : {out['ingest_mblocks']:5.2f} M blocks per CPU-second "
          f"(ratio to decode {out['ingest_mblocks'] / out['decode_mblocks']:.2f}x)")
    return out


@contextlib.contextmanager
def store_url(backend: str) -> Iterator[tuple[Callable[[], str], Callable[[], float]]]:
    """A factory of fresh store locations and the server's CPU seconds so far."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            names = iter(range(100))
            yield (lambda: str(Path(tmp) / f"kv{next(names)}.db")), (lambda: 0.0)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.servers import postgres_server

    with postgres_server(durable=True) as pg:
        import psycopg

        names = iter(range(100))

        def fresh() -> str:
            name = f"kv{next(names)}"
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            return pg.url(name)

        yield fresh, lambda: server_cpu(pg.pid)


def server_cpu(pid: int) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster and its backends (children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(stat[1]) == pid:
            total += (int(stat[11]) + int(stat[12])) / ticks
    return total


def bench_store(fill: list[bytes], timed: list[bytes], blocks: int, backend: str,
                ) -> dict[str, float]:
    from mmlens.store.open import open_store

    out: dict[str, float] = {}
    with store_url(backend) as (fresh, server):
        store = open_store(fresh())
        ingest = filled_ingest(fill)
        start = len(fill)

        def collector() -> None:
            pending: list = []
            for seq, p in enumerate(timed, start):
                pending.extend(ingest.ingest("w0", seq, p))
                if seq % COMMIT_EVERY == 0:
                    store.add_kv_events(pending)
                    pending = []
            store.add_kv_events(pending)

        s0 = server()
        c_col = cpu_time(collector)
        s_col = server() - s0
        store.close()

        floor_store = open_store(fresh())
        dec = msgspec.msgpack.Decoder()
        enc = msgspec.msgpack.Encoder()

        def recorder() -> None:
            rows: list[tuple] = []
            for seq, p in enumerate(timed, start):
                ts, events, _ = dec.decode(p)
                for idx, ev in enumerate(events):
                    kind, hashes = ((ev["type"], ev.get("block_hashes")) if type(ev) is dict
                                    else (ev[0], ev[1]))
                    rows.append((ts, "w0", 0, seq, idx, kind, enc.encode(hashes)))
                if seq % COMMIT_EVERY == 0:
                    record(rows)
                    rows = []
            record(rows)

        def record(rows: list[tuple]) -> None:
            floor_store._before_append("kv_content", (r[0] for r in rows))  # partitions
            with floor_store._tx():
                floor_store._many("INSERT INTO kv_content (ts, worker, rank, seq, idx, kind, "
                                  "content) VALUES (?,?,?,?,?,?,?)", rows)

        s0 = server()
        c_rec = cpu_time(recorder)
        s_rec = server() - s0
        floor_store.close()
    out = {"collector_mblocks": blocks / c_col / 1e6, "recorder_mblocks": blocks / c_rec / 1e6,
           "server_cpu_s": s_col, "recorder_server_cpu_s": s_rec}
    print(f"collector path ({backend}): {out['collector_mblocks']:5.2f} M blocks per CPU-second "
          f"of the collector (server CPU {s_col:.2f} s)")
    print(f"minimal recorder ({backend}): {out['recorder_mblocks']:5.2f} M blocks per "
          f"CPU-second (server CPU {s_rec:.2f} s); ratio "
          f"{out['collector_mblocks'] / out['recorder_mblocks']:.2f}x")
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def bench_memory(n_blocks: int) -> dict[str, float]:
    """RSS growth of an index of ``n_blocks`` (a quarter of them image blocks)."""
    rng = random.Random(3)
    text = [rng.randrange(151000) for _ in range(32 * BLOCK)]
    imaged = text[:4] + [IMAGE_PAD] * (32 * BLOCK - 4)
    gc.collect()
    base = rss_mb()
    index = ResidentIndex()
    done = 0
    parent: int | None = None
    while done < n_blocks:
        n = min(32, n_blocks - done)
        hashes = [rng.getrandbits(64) for _ in range(n)]
        images = None
        image = (done // 32) % 4 == 0
        if image:
            ident = f"{rng.getrandbits(256):064x}"
            images = [(ImageRef(ident, 4 - BLOCK * i),) for i in range(n)]
        ev = BlockStored("w0", 0, 0, 0.0, hashes, parent, (imaged if image else text)[
            :n * BLOCK], BLOCK, images=images)
        index.apply([ev])
        parent = hashes[-1]
        done += n
    del ev, hashes
    gc.collect()
    grown = rss_mb() - base
    resident = sum(len(r.blocks) for r in index.workers.values())
    per_m = grown / resident * 1e6
    print(f"resident index: {resident} blocks; RSS growth {grown:.0f} MB = {per_m:.0f} MB per "
          f"million resident blocks")
    return {"rss_mb_per_mblocks": per_m}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60_000)
    ap.add_argument("--resident", type=int, default=400_000)
    ap.add_argument("--store", choices=("none", "sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--memory", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    tune_gc()  # the collector's settings
    figures: dict[str, object] = {}
    if args.batches:
        fill, timed, blocks = Mix(args.resident).payloads(args.batches)
        figures["ingest"] = bench_ingest(fill, timed, blocks)
        for backend in ("sqlite", "postgresql"):
            if args.store in (backend, "both"):
                figures[backend] = bench_store(fill, timed, blocks, backend)
    if args.memory:
        figures["memory"] = bench_memory(args.memory)
    print(f"(load average {os.getloadavg()[0]:.1f})")
    if args.json:
        print(json.dumps({"kv": figures}))


if __name__ == "__main__":
    main()
