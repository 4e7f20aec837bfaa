"""The tap recorder's CPU per exchange, by stage, without the network: exchanges as the proxy
hands them over (``tap_bench``'s 64² PNG chat requests, its upstream's answer and SMG's
worker header) framed as on the pipe, read back, recorded and written to a fresh SQLite
store through the outage buffer, in batches as the recorder writes them.

Prints CPU µs per exchange (process time) of: reading frames, parse (``exchange_trace``),
store (readability check and write); ``--profile`` adds cProfile's top functions.

Usage: python benchmarks/tap_recorder_cpu.py [--n 6000] [--batch 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mmlens.collectors.store_buffer import BufferedStore
from mmlens.collectors.tap_frames import EXCHANGE, _exchange, exchange_frame
from mmlens.collectors.tap_frames import HEAD as FRAME_HEAD
from mmlens.collectors.tap_record import Recorder

from mmlens.cli.gc_tuning import tune_gc
from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth
from mmlens.store.open import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tap_bench as tb


def exchanges(n: int, start: int) -> list[Exchange]:
    out = []
    for i, body in enumerate(tb.bodies(64, "PNG", n, start=start)):
        answer = tb.ANSWER.replace(b"chatcmpl-1", f"chatcmpl-{start + i:012d}".encode())
        ex = Exchange(time.time(), time.perf_counter(), body, None, 200,
                      {"x-smg-routed-worker-id": "grpc://127.0.0.1:50051",
                       "x-request-id": f"chatcmpl-{start + i:012d}"})
        ex.add(0.0004, answer, 8 << 20, 0)
        ex.latency_s = 0.0005
        out.append(ex)
    return out


def framed(exs: list[Exchange]) -> bytes:
    return b"".join(b for ex in exs for b in exchange_frame(ex))


def read_frames(buf: bytes) -> list[Exchange]:
    view, at, out = memoryview(buf), 0, []
    while at < len(buf):
        kind, meta_n, data_n = FRAME_HEAD.unpack_from(buf, at)
        at += FRAME_HEAD.size
        if kind == EXCHANGE:
            out.append(_exchange(view[at:at + meta_n], view[at + meta_n:at + meta_n + data_n],
                                 borrow=True))
        at += meta_n + data_n
    return out


def one_round(n: int, batch_n: int, start: int, tmp: Path) -> dict[str, float]:
    buf = framed(exchanges(n, start))
    health = CollectorHealth("tap", "bench")
    store = BufferedStore(open_store(str(tmp / f"r{start}.db")), str(tmp / f"spill{start}"))
    rec = Recorder(store.add_traces, health, router="http://bench", buffer=store,
                   thread=False)
    spent = {"frames": 0.0, "parse": 0.0, "store": 0.0}
    c0 = time.process_time()
    exs = read_frames(buf)
    spent["frames"] = time.process_time() - c0
    for i in range(0, n, batch_n):
        batch: list = []
        c0 = time.process_time()
        for ex in exs[i:i + batch_n]:
            rec._take(ex, batch)
        c1 = time.process_time()
        rec._store(batch)
        spent["parse"] += c1 - c0
        spent["store"] += time.process_time() - c1
    assert health.counters.get("recorded") == n, health.counters
    store.close()
    return {k: v / n * 1e6 for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.n} exchanges "
          f"(64² PNG) per round, batches of {args.batch}")
    gc_s, since = [0.0], [0.0]

    def timed_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            since[0] = time.process_time()
        else:
            gc_s[0] += time.process_time() - since[0]

    tune_gc()  # as the recorder process runs
    gc.callbacks.append(timed_gc)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = []
        for r in range(args.rounds):
            if args.profile and r == args.rounds - 1:
                prof = cProfile.Profile()
                prof.enable()
            gc_s[0] = 0.0
            rounds.append(one_round(args.n, args.batch, r * args.n, Path(tmp)))
            rounds[-1]["of which gc"] = gc_s[0] / args.n * 1e6
            print("  round " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()) +
                  " µs", flush=True)
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("median: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) +
          f" µs per exchange (total {sum(med.values()) - med['of which gc']:.1f}); load average "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
