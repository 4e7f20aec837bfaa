"""KV-event ingest throughput and resident-index memory (prints figures; not a unit test).

Usage: python benchmarks/kv_ingest.py [--batches N] [--resident N]

1. A realistic batch mix is encoded once: per engine step one batch of 1–4 events; stores of
   1–32 blocks of 16 tokens (a quarter of them image blocks with vLLM-main ``extra_keys``),
   lazy removals of older blocks, rare clears; 70 % map-encoded events (vLLM ≥ #42892),
   30 % array-encoded (legacy / SGLang with signed hashes).
2. ``msgspec`` decode-only throughput on the same payloads, then the full ingest
   (decode + normalize + resident index) on one core.
3. 1M resident blocks: RSS growth and tracemalloc peak of the index.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import time
import tracemalloc

import msgspec

from mmlens.ingest.kv_index import KVIngest, ResidentIndex
from mmlens.records import BlockStored, ImageRef

BLOCK = 16


def make_payloads(n_batches: int, seed: int = 7) -> tuple[list[bytes], int]:
    rng = random.Random(seed)
    enc = msgspec.msgpack.Encoder()
    live: list[int] = []
    payloads: list[bytes] = []
    blocks_total = 0
    prev: int | None = None
    for step in range(n_batches):
        events: list[object] = []
        as_map = rng.random() < 0.7
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.68:
                n = rng.randint(1, 32)
                hashes = [rng.getrandbits(64) for _ in range(n)]
                tokens = [rng.randrange(151000) for _ in range(n * BLOCK)]
                image = rng.random() < 0.25
                ident = f"{rng.getrandbits(256):064x}"
                extra = ([[[ident, 4 - 16 * i]] for i in range(n)] if image else [None] * n)
                parent = prev if rng.random() < 0.5 else None
                if not as_map:
                    hashes = [h - (1 << 64) if h >= 1 << 63 else h for h in hashes]  # SGLang
                    events.append(["BlockStored", hashes, parent if parent is None or
                                   parent < 1 << 63 else parent - (1 << 64), tokens, BLOCK,
                                   None, "GPU", None, extra if image else None])
                else:
                    ev = {"type": "BlockStored", "block_hashes": hashes,
                          "parent_block_hash": parent, "token_ids": tokens,
                          "block_size": BLOCK, "lora_id": None, "medium": "GPU",
                          "lora_name": None, "extra_keys": extra, "group_idx": 0,
                          "kv_cache_spec_kind": "full_attention"}
                    events.append(ev)
                live.extend(h & ((1 << 64) - 1) for h in hashes)
                prev = hashes[-1] & ((1 << 64) - 1)
                blocks_total += n
            elif r < 0.995 and live:
                k = min(len(live), rng.randint(1, 16))
                gone, live[:k] = live[:k], []
                events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"}
                              if as_map else ["BlockRemoved", gone, "GPU", None])
                blocks_total += k
            else:
                events.append({"type": "AllBlocksCleared"} if as_map else ["AllBlocksCleared"])
                live.clear()
        payloads.append(enc.encode([1_800_000_000.0 + step * 0.01, events, 0]))
    return payloads, blocks_total


def _timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds; CPU time stays meaningful on a shared, loaded machine."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def bench_ingest(payloads: list[bytes], blocks: int) -> None:
    dec = msgspec.msgpack.Decoder()
    nbytes = sum(map(len, payloads))

    def decode_all() -> None:
        for p in payloads:
            dec.decode(p)

    ingest = KVIngest()

    def ingest_all() -> None:
        for seq, p in enumerate(payloads):
            ingest.ingest("w0", seq, p)

    w_dec, c_dec = _timed(decode_all)
    w_all, c_all = _timed(ingest_all)
    print(f"payloads: {len(payloads)} batches, {blocks} blocks (stored+removed), "
          f"{nbytes / 1e6:.1f} MB msgpack")
    print(f"msgspec decode only : {blocks / c_dec / 1e6:5.2f} M blocks/s per CPU-second "
          f"(wall {blocks / w_dec / 1e6:.2f})")
    print(f"full ingest         : {blocks / c_all / 1e6:5.2f} M blocks/s per CPU-second "
          f"(wall {blocks / w_all / 1e6:.2f}; decode share {c_dec / c_all:.0%})")
    print(f"errors: {ingest.errors or 'none'}; resident now: "
          f"{sum(len(r.blocks) for r in ingest.index.workers.values())}")


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_memory(n_blocks: int) -> None:
    rng = random.Random(3)
    gc.collect()
    base = rss_mb()
    tracemalloc.start()
    index = ResidentIndex()
    # The index keeps hashes and content states, never token ids.
    tokens = [rng.randrange(151000) for _ in range(32 * BLOCK)]
    done = 0
    parent: int | None = None
    while done < n_blocks:
        n = min(32, n_blocks - done)
        hashes = [rng.getrandbits(64) for _ in range(n)]
        images = None
        if done % 128 == 0:  # a quarter of the events carry one image over all their blocks
            ident = f"{rng.getrandbits(256):064x}"
            images = [(ImageRef(ident, 4 - 16 * i),) for i in range(n)]
        index.apply([BlockStored("w0", 0, 0, 0.0, hashes, parent, tokens[:n * BLOCK], BLOCK,
                                 images=images)])
        parent = hashes[-1]
        done += n
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    resident = sum(len(r.blocks) for r in index.workers.values())
    imaged = sum(len(r.block_images) for r in index.workers.values())
    print(f"resident index: {resident} blocks ({imaged} with an image); "
          f"RSS growth {rss_mb() - base:.0f} MB; "
          f"tracemalloc peak {peak / 1e6:.0f} MB ({peak / resident:.0f} B/block)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60_000)
    ap.add_argument("--resident", type=int, default=1_000_000)
    args = ap.parse_args()
    payloads, blocks = make_payloads(args.batches)
    bench_ingest(payloads, blocks)
    bench_memory(args.resident)


if __name__ == "__main__":
    main()
