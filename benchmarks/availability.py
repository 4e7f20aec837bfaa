"""Available vs achieved: per-request cost against a large fleet, and the aggregates over many
requests (prints figures; not a unit test).

Usage: python benchmarks/availability.py [--workers 64] [--resident 100000] [--requests 100000]

1. 64 workers each holding 100k resident blocks (content keys), a 4-image Qwen3-VL request
   (1280×720 images, about 230 blocks) of which every worker holds a different leading part,
   a recent change log (rewinds to the decision time), engine identifiers learned: the median
   time of one ``AvailabilityTracker.evaluate`` (target ≤ 2 ms).
2. 100k per-request results: columns and every aggregate the Overview and Cache pages draw
   (target: within the 300 ms page budget, store read included when a store is given).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from mmlens.analysis.availability import aggregate as agg
from mmlens.analysis.availability.attribution import CAUSES
from mmlens.analysis.availability.facts import facts_of
from mmlens.analysis.availability.tracker import AvailabilityTracker
from mmlens.layout.composition import ImageInput, compose
from mmlens.layout.expected import ExpectedLayout
from mmlens.layout.families import get_family
from mmlens.layout.report import layout_summary
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.layout.tokenizers import family_tokenizer
from mmlens.records import Availability, RequestTrace, RoutingDecision
from mmlens.store.sqlite import Store


def request_trace() -> RequestTrace:
    family = get_family("qwen3-vl")
    images = [ImageInput(1280, 720, data=synthetic_png("solid", 1280, 720, rgb=(i * 40, 9, 9)))
              for i in range(4)]
    layout = compose(family, ["Compare these four pictures.", *images, "Which differs?"],
                     family_tokenizer("qwen3-vl"))
    summary = layout_summary(layout, family, images)
    return RequestTrace("bench", "router", "smg", "m", 1000.0, False, status=200,
                        worker="w0", prompt_tokens=len(layout.engine), cached_tokens=0,
                        latency_s=1.0, ttft_s=0.5,
                        expected_layout=ExpectedLayout.from_summary(summary),
                        predictions=[RoutingDecision("bench", "smg", "header", worker="w0",
                                                     overlap_blocks=3, request_blocks=230)])


def bench_request(workers: int, resident: int, runs: int = 300) -> None:
    rng = random.Random(5)
    trace = request_trace()
    facts = facts_of(trace)
    assert facts is not None and facts.shapes is not None
    tracker = AvailabilityTracker(horizon_s=0)  # bulk load without a change log
    engine_names = [f"{rng.getrandbits(256):064x}" for _ in facts.content_ids]
    keys = facts.shapes.keys(engine_names)
    for c, e in zip(facts.content_ids, engine_names, strict=True):
        tracker.identities.aliases[c] = [e]
    t0 = time.perf_counter()
    for w in range(workers):
        held = keys[: rng.randrange(len(keys) + 1)]
        tracker.index.add(900.0, f"w{w}", [rng.getrandbits(64) for _ in range(resident)])
        tracker.index.add(900.0, f"w{w}", held)
    build = time.perf_counter() - t0
    tracker.index.horizon_s = 900.0
    for i in range(20_000):  # the last 15 minutes of churn, some of it on the request's keys
        unit = f"w{rng.randrange(workers)}"
        key = keys[rng.randrange(len(keys))] if i % 10 == 0 else rng.getrandbits(64)
        tracker.index.add(950.0 + i * 0.005, unit, [key])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        result = tracker.evaluate(facts)
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"index: {workers} workers × {resident} resident blocks built in {build:.1f} s "
          f"(max RSS {rss:.0f} MB); request of {len(keys)} blocks, {len(engine_names)} images")
    print(f"availability per request: median {statistics.median(times) * 1e3:.3f} ms, "
          f"p95 {sorted(times)[int(0.95 * len(times))] * 1e3:.3f} ms, "
          f"best {min(times) * 1e3:.3f} ms (load average {os.getloadavg()[0]:.1f}) "
          f"(best {result.best_tokens} tokens on {result.best_worker}, "
          f"{len(result.available)} workers holding some)")


def fake_rows(n: int) -> list[Availability]:
    rng = random.Random(9)
    rows = []
    for i in range(n):
        prompt = rng.randrange(100, 4000)
        best = prompt // 16 * 16 * rng.randrange(0, 2)
        realized = best if rng.random() < 0.7 else 0
        causes = {} if realized == best else {rng.choice(CAUSES): best - realized}
        rows.append(Availability(
            f"r{i}", 1_000_000.0 + i * 0.05, f"router{i % 2}", "smg", f"model{i % 3}",
            f"w{i % 64}", 16, prompt, i % 3, "degraded", {}, f"w{i % 64}", best, best,
            realized, best - realized, causes, predicted_tokens=best))
    return rows


def bench_aggregate(n: int, runs: int = 7) -> None:
    """The page path: the store's cells of n requests → every aggregate a page draws."""
    rows = fake_rows(n)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        t = time.perf_counter()
        store.add_availability(rows)
        store.add_cells(agg.cell_sums(rows))
        write = time.perf_counter() - t
        times, reads = [], []
        for _ in range(runs):
            t = time.perf_counter()
            stored = store.cells(0.0)
            reads.append(time.perf_counter() - t)
            cells = agg.Cells.from_rows(stored)
            agg.headline(cells)
            agg.hit_rates(cells, "router", 60.0)
            agg.hit_rates(cells, "worker", 300.0)
            agg.avoidable_per_minute(cells, 60.0)
            agg.headlines(cells, "model")
            times.append(time.perf_counter() - t)
        store.close()
    print(f"aggregates over {n} stored requests ({len(stored)} minute cells; written in "
          f"{write:.1f} s): cells read median {statistics.median(reads) * 1e3:.0f} ms; read + "
          f"headline + hit rates (router per minute, worker per 5 min) + avoidable/min + "
          f"per-model: median {statistics.median(times) * 1e3:.0f} ms, best "
          f"{min(times) * 1e3:.0f} ms (load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--resident", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=100_000)
    args = ap.parse_args()
    bench_request(args.workers, args.resident)
    bench_aggregate(args.requests)


if __name__ == "__main__":
    main()
