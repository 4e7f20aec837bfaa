"""`mmlens whatif` replay speed: recorded requests through each policy model over a fleet of
engine caches, in CPU seconds per scenario (prints figures; not a unit test).

Usage: python benchmarks/whatif_bench.py [--requests 100000] [--workers 64]
                                         [--capacity 100000] [--json] [--quick]

The workload is built like a recorded one: a few hundred distinct prompts laid out by the
real Qwen3-VL layout (system prompts × images of five sizes, repeated images and same-size
different images, text only), each request one of them (Zipf-popular) with a tail of its own
(the user's question: blocks no other request has), Poisson arrivals keeping ~4 requests in
flight per worker. The floor is a bare loop over the same requests' block keys (one dict
probe and one insert per block): what any replay must at least touch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmlens.whatif.blocks import prompt
from mmlens.whatif.replay import run
from mmlens.whatif.scenario import Scenario
from mmlens.whatif.workload import BlockKeys, RecordedRequest
from tests.whatif.support import T0, png, request

SYSTEMS = ["You are a careful visual assistant. Describe what you see.",
           "Answer briefly: what is the main object in this picture and its colour?",
           "You are a radiologist's assistant. List every abnormal finding in the image, "
           "with its location, and say how sure you are of each one.",
           "Caption this image for a screen reader in one sentence."]
SIZES = [(64, 64), (224, 224), (640, 480), (1280, 720), (512, 512)]


def templates(n_images: int, seed: int) -> list[RecordedRequest]:
    rnd = random.Random(seed)
    out = [request(f"text-{i}", T0, [], text) for i, text in enumerate(SYSTEMS)]
    for i in range(n_images):
        w, h = SIZES[i % len(SIZES)]
        image = png(rnd.choice(("solid", "gradient")), w, h, seed=i)  # same size, new image
        out.append(request(f"img-{i}", T0, [image], SYSTEMS[i % len(SYSTEMS)]))
    return out


def workload(n: int, workers: int, seed: int = 0, n_images: int = 120,
             ) -> list[RecordedRequest]:
    rnd = random.Random(seed)
    base = templates(n_images, seed)
    weights = [1 / (rank + 1) for rank in range(len(base))]  # Zipf: popular images repeat
    latency = 2.0
    rate = 4 * workers / latency  # ~4 in flight per worker
    ts = T0
    out = []
    for i in range(n):
        t = rnd.choices(base, weights)[0]
        assert t.keys is not None
        tail = rnd.randint(1, 6)  # the user's own question: blocks nobody else has
        uniq = tuple(rnd.getrandbits(64) for _ in range(tail))
        keys = BlockKeys(t.keys.block_size, t.keys.content + uniq, t.keys.shapes + uniq,
                         t.keys.first_image_block)
        ts += rnd.expovariate(rate)
        out.append(RecordedRequest(
            request_id=f"r{i}", ts=ts, model=t.model, router=t.router, router_kind="smg",
            mode="router", origin="mmlens", ok=True,
            prompt_tokens=(t.prompt_tokens or 0) + 16 * tail + 5,
            rendered_tokens=None, output_tokens=rnd.randint(8, 200), segments=t.segments,
            text_chars=None, images=t.images, keys=keys, worker=None, cached_tokens=None,
            verdict=None, branch=None, latency_s=rnd.lognormvariate(0.5, 0.5),
            ttft_s=rnd.uniform(0.05, 0.4)))
    return out


def floor(reqs: list[RecordedRequest]) -> float:
    """CPU seconds of one probe and one insert per block key of every request."""
    prompts = [prompt(r, 16) for r in reqs]
    seen: dict[int, int] = {}
    t0 = time.process_time()
    for i, p in enumerate(prompts):
        assert p is not None
        for key in p.content:
            if key not in seen:
                seen[key] = i
    return time.process_time() - t0


SCENARIOS = {
    "smg cache_aware router": "cache_aware:router",
    "smg cache_aware worker": "cache_aware:worker",
    "dynamo kv exact": "dynamo_kv:exact",
    "round_robin": "round_robin:",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="10k requests: a smoke run")
    args = ap.parse_args()
    n = 10_000 if args.quick else args.requests
    load0 = os.getloadavg()[0]
    reqs = workload(n, args.workers)
    blocks = sum(len(r.keys.content) for r in reqs if r.keys is not None)
    floor_s = floor(reqs)
    results: dict[str, dict[str, float]] = {}
    for label, spec in SCENARIOS.items():
        policy, mode = spec.split(":")
        sc = Scenario(policy, mode or None, 16, args.workers, args.capacity)
        t0 = time.process_time()
        out = run(reqs, sc)
        cpu = time.process_time() - t0
        hit = sum(out.hit) * 16 / sum(p.tokens for p in out.prompts)
        results[label] = {"cpu_s": cpu, "hit_rate": hit, "evictions": out.evictions}
        print(f"{label:<24} {cpu:6.2f} CPU-s  hit rate {100 * hit:5.1f}%  "
              f"evictions {out.evictions:,}  ({cpu / floor_s:.1f}× the floor)")
    load1 = os.getloadavg()[0]
    print(f"{n:,} requests, {blocks:,} blocks, {args.workers} workers × {args.capacity:,} "
          f"blocks; floor (a bare loop over the block keys) {floor_s:.2f} CPU-s; load "
          f"average {load0:.1f} → {load1:.1f}")
    if args.json:
        print(json.dumps({"whatif": {"requests": n, "workers": args.workers,
                                     "capacity": args.capacity, "blocks": blocks,
                                     "floor_s": floor_s, "scenarios": results,
                                     "load": [load0, load1]}}))


if __name__ == "__main__":
    main()
