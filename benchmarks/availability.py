"""Available vs achieved: per-request cost against a large fleet, and the aggregates over many
requests (prints figures; not a unit test).

Usage: python benchmarks/availability.py [--workers 64] [--resident 100000] [--distinct 300]
    [--requests 100000] [--json]

1. 64 workers each holding 100k resident blocks (content keys), 300 distinct 4-image Qwen3-VL
   requests (about 230 blocks each) of which every worker holds a different leading part, a
   recent change log (rewinds to the decision time), engine identifiers learned: the median
   time of one ``AvailabilityTracker.evaluate`` per request, each request once (target ≤ 1 ms),
   beside a bare scan of the 64 workers' key sets for the same keys.
2. 100k per-request results: columns and every aggregate the Overview and Cache pages draw
   (target: within the 300 ms page budget, store read included when a store is given).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from itertools import takewhile
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


def request_trace(n: int) -> RequestTrace:
    """Request ``n``: its own opening line and four images of its own colours (1280×720, one
    in three 960×540), so no two requests share a key past their first blocks."""
    family = get_family("qwen3-vl")
    w, h = (960, 540) if n % 3 == 0 else (1280, 720)
    images = [ImageInput(w, h, data=synthetic_png("solid", w, h, rgb=(i * 40, n % 256, n // 256)))
              for i in range(4)]
    layout = compose(family, [f"Request {n}: compare these four pictures.", *images,
                              "Which differs?"], family_tokenizer("qwen3-vl"))
    summary = layout_summary(layout, family, images)
    return RequestTrace(f"bench{n}", "router", "smg", "m", 1000.0, False, status=200,
                        worker="w0", prompt_tokens=len(layout.engine), cached_tokens=0,
                        latency_s=1.0, ttft_s=0.5,
                        expected_layout=ExpectedLayout.from_summary(summary),
                        predictions=[RoutingDecision(f"bench{n}", "smg", "header", worker="w0",
                                                     overlap_blocks=3, request_blocks=230)])


def _bare_scan(sets: list[set[int]], keys: Sequence[int]) -> int:
    """The floor: each worker's key set probed for the request's leading keys."""
    best = 0
    for held in sets:
        best = max(best, len(list(takewhile(held.__contains__, keys))))
    return best


def bench_request(workers: int, resident: int, distinct: int) -> dict[str, float]:
    """Each of ``distinct`` requests evaluated once, against workers that each hold their own
    leading part of every request, beside a bare scan of the workers' key sets."""
    rng = random.Random(5)
    tracker = AvailabilityTracker(horizon_s=0)  # bulk load without a change log
    requests = []
    for n in range(distinct):
        facts = facts_of(request_trace(n))
        assert facts is not None and facts.shapes is not None
        names = [f"{rng.getrandbits(256):064x}" for _ in facts.content_ids]
        for c, e in zip(facts.content_ids, names, strict=True):
            tracker.identities.aliases[c] = [e]
        requests.append((facts, facts.shapes.keys(names)))
    t0 = time.perf_counter()
    for w in range(workers):
        tracker.index.add(900.0, f"w{w}", [rng.getrandbits(64) for _ in range(resident)])
        for _, keys in requests:
            tracker.index.add(900.0, f"w{w}", keys[: rng.randrange(len(keys) + 1)])
    build = time.perf_counter() - t0
    tracker.index.horizon_s = 900.0
    for i in range(20_000):  # the last 15 minutes of churn, some of it on the requests' keys
        unit = f"w{rng.randrange(workers)}"
        keys = requests[rng.randrange(distinct)][1]
        key = keys[rng.randrange(len(keys))] if i % 10 == 0 else rng.getrandbits(64)
        tracker.index.add(950.0 + i * 0.005, unit, [key])
    sets = list(tracker.index.units.values())
    order = list(range(distinct))
    rng.shuffle(order)
    times, floor = [], []
    for n in order:  # interleaved, each request once per side
        facts, keys = requests[n]
        t = time.perf_counter()
        result = tracker.evaluate(facts)
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        _bare_scan(sets, keys)
        floor.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    med, fmed = statistics.median(times) * 1e3, statistics.median(floor) * 1e3
    print(f"index: {workers} workers × {resident} resident blocks (+ each request's leading "
          f"part) built in {build:.1f} s (max RSS {rss:.0f} MB); {distinct} distinct requests "
          f"of {len(requests[0][1])} blocks, {len(requests[0][0].content_ids)} images")
    print(f"availability per distinct request: median {med:.3f} ms, "
          f"p95 {sorted(times)[int(0.95 * len(times))] * 1e3:.3f} ms "
          f"(last: best {result.best_tokens} tokens on {result.best_worker}, "
          f"{len(result.available)} workers holding some)")
    print(f"bare scan of the {workers} workers' key sets: median {fmed:.3f} ms; "
          f"ratio {med / fmed:.2f}x (load average {os.getloadavg()[0]:.1f})")
    return {"median_ms": med, "p95_ms": sorted(times)[int(0.95 * len(times))] * 1e3,
            "floor_ms": fmed, "workers": workers, "resident": resident, "distinct": distinct}


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
    ap.add_argument("--distinct", type=int, default=300)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    figures = bench_request(args.workers, args.resident, args.distinct)
    if args.requests:
        bench_aggregate(args.requests)
    if args.json:
        print(json.dumps({"availability": figures}))


if __name__ == "__main__":
    main()
