"""Judging requests: the verdict job's pure pass (KV-chain attribution on busy workers, 16
requests in flight each, then the one judgement) per request, beside a floor that touches
the same records without judging; and re-judging when late KV events arrive, against the
number of requests they affect (prints figures; not a unit test).

Usage: taskset -c 0 python benchmarks/judge_bench.py [--requests 20000] [--workers 2]
    [--batch 512] [--json]

The workload: each worker runs the demo's vLLM-like prefix cache (demo/prefix_cache.py) at 16
in flight (16 allocated before any commits, so some compute blocks another is computing),
with 20 decode tokens each; requests are logged SMG records (worker, prompt tokens, latency,
a predicted overlap) without cached tokens, so every realized hit comes from attribution.
Judged in batches of ``--batch`` (the job judges a run's settled requests against the window
around them). The floor decodes the same records: for each request its prediction fields,
for each KV row one depth-index update per block (the index the attribution needs).
Re-judging: late KV rows for 1, 4 and 16 time ranges are applied and only the requests on
those workers in those ranges re-judged (the job's index of judged requests by worker and
time), beside one full re-judge of every request.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter

from mmlens.collectors.verdict_job import _Judged
from mmlens.demo.prefix_cache import MediaSpan, PrefixCache, StoredBlocks

from mmlens.analysis.judgement.batch import JudgeState, span_of, unit_of
from mmlens.records import RequestTrace, RoutingDecision

BS = 16
IN_FLIGHT = 16
LOGGED = {"worker": "router_log:smg", "prompt_tokens": "router_log:smg",
          "status": "router_log:smg", "latency_s": "router_log:smg"}


def workload(n: int, workers: int, seed: int = 7) -> tuple[list[RequestTrace], list[tuple],
                                                             dict[str, int]]:
    """Traces (logged SMG records), KV rows (ts, unit, kind, parent, hashes), and each
    request's true hit in blocks (the prefix cache's own count)."""
    rng = random.Random(seed)
    traces, rows, truth = [], [], {}
    for w in range(workers):
        unit = f"grpc://127.0.0.1:{50051 + w}"
        cache = PrefixCache(block_size=BS, num_blocks=400_000)
        prefixes = [[rng.randrange(1000, 5000) for _ in range(rng.choice((40, 90, 170, 330)))]
                    for _ in range(12)]
        t = 0.0
        for wave in range(n // workers // IN_FLIGHT):
            live = []
            for i in range(IN_FLIGHT):
                rid = f"{w}-{wave}-{i}"
                tokens = rng.choice(prefixes) + [rng.randrange(5000, 9000)
                                                 for _ in range(rng.randrange(1, 80))]
                media = [MediaSpan(f"img{rng.randrange(4)}", 5, 30)] if rng.random() < .5 else []
                events: list = []
                alloc = cache.allocate(tokens, media, events)
                truth[rid] = alloc.hit_blocks
                live.append((rid, t + i * 0.01, tokens, alloc, events))
            for k, (rid, start, tokens, alloc, events) in enumerate(live):
                commit = t + 0.2 + k * 0.02
                cache.commit(alloc, events)
                stamped = [(commit, e) for e in events]
                more: list = []
                cache.extend(alloc, [rng.randrange(9000, 9999) for _ in range(20)], more)
                stamped += [(commit + 0.3, e) for e in more]
                for ts, e in stamped:
                    if isinstance(e, StoredBlocks):
                        rows.append((ts, unit, "stored", None if e.parent_block_hash is None
                                     else str(e.parent_block_hash),
                                     [str(h) for h in e.block_hashes]))
                cache.release(alloc)
                predicted = min(len(tokens) // BS, alloc.hit_blocks + rng.choice((0, 0, 0, 3)))
                traces.append(RequestTrace(
                    rid, "smg", "smg", "m", start, False, worker=unit, status=200,
                    prompt_tokens=len(tokens), latency_s=commit + 0.4 - start,
                    origin="observed", sources=["router_log"], provenance=dict(LOGGED),
                    predictions=[RoutingDecision(rid, "smg", "router_log:smg", worker=unit,
                                                 branch="event_hit" if predicted else
                                                 "event_miss", overlap_blocks=predicted,
                                                 request_blocks=len(tokens) // BS,
                                                 block_size=BS, ts=start)]))
            t += 2.0
    rows.sort(key=lambda r: r[0])
    traces.sort(key=lambda t: t.ts)
    return traces, rows, truth


def judge_all(traces: list[RequestTrace], rows: list[tuple], batch: int,
              ) -> tuple[float, JudgeState, list]:
    """The job's pure work over the workload: every KV row applied, every request judged in
    batches (each against the batch and the 64 requests before it, as a run's window)."""
    started = time.perf_counter()
    state = JudgeState(horizon_s=1e9)
    state.apply_kv(rows)
    verdicts = []
    for i in range(0, len(traces), batch):
        context = traces[max(0, i - 64):i + batch]
        verdicts += state.judge(context, [t.request_id for t in traces[i:i + batch]],
                                judged_at=0.0)
    return time.perf_counter() - started, state, verdicts


def floor(traces: list[RequestTrace], rows: list[tuple]) -> float:
    """The same records read without judging: each request's prediction fields, each KV
    row's blocks into a depth index."""
    started = time.perf_counter()
    depth: dict[str, dict[str, int]] = {}
    for _, unit, _, parent, hashes in rows:
        d = depth.setdefault(unit, {})
        base = 0 if parent is None else d.get(parent, 0)
        for i, h in enumerate(hashes, start=base + 1):
            d[h] = i
    seen = 0
    for t in traces:
        p = t.predictions[0]
        seen += (p.overlap_blocks or 0) + (t.prompt_tokens or 0) // BS + (t.worker is not None)
    assert seen
    return time.perf_counter() - started


def rejudge(traces: list[RequestTrace], state: JudgeState, ranges: int, rng: random.Random,
            ) -> tuple[float, int]:
    """Late rows for ``ranges`` random (worker, time) ranges: apply them, find the requests
    judged there and re-judge only those (against their neighbours)."""
    judged = _Judged()
    by_id = {t.request_id: t for t in traces}
    longest = 0.0
    for t in traces:
        start, end = span_of(t)
        longest = max(longest, end - start)
        judged.add(unit_of(t) or "", start, end, t.request_id)
    picks = rng.sample(traces, ranges)
    late = [(span_of(t)[0] + 0.25, unit_of(t) or "", "stored", None,
             [f"late-{t.request_id}-{i}" for i in range(3)]) for t in picks]
    started = time.perf_counter()
    touched = state.apply_kv(late)
    again: set[str] = set()
    for unit, ranges in touched.items():
        for lo, hi in ranges:
            again.update(judged.touched(unit, lo, hi, longest))
    context_ids = set(again)
    for rid in again:  # the requests that ran beside them compete for the same chains
        start, end = span_of(by_id[rid])
        context_ids.update(judged.touched(unit_of(by_id[rid]) or "", start, end, longest))
    context = sorted((by_id[r] for r in context_ids), key=lambda t: t.ts)
    state.judge(context, sorted(again), judged_at=0.0)
    return time.perf_counter() - started, len(again)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    traces, rows, truth = workload(args.requests, args.workers)
    n = len(traces)
    spent, state, verdicts = judge_all(traces, rows, args.batch)
    bare = floor(traces, rows)
    by_id = {v.request_id: v for v in verdicts}
    definite = [v for v in verdicts if v.realized_blocks is not None
                and not v.evidence.get("realized_alternatives")]
    right = sum(1 for v in definite if v.realized_blocks == truth[v.request_id])
    rng = random.Random(1)
    late = {k: rejudge(traces, state, k, rng) for k in (1, 4, 16)}
    full, _, _ = judge_all(traces, rows, args.batch)
    out = {
        "requests": n, "kv_rows": len(rows), "workers": args.workers, "in_flight": IN_FLIGHT,
        "cpu_affinity": sorted(os.sched_getaffinity(0)), "load": os.getloadavg(),
        "judge_s": spent, "judge_per_s": n / spent, "floor_s": bare, "floor_per_s": n / bare,
        "ratio": spent / bare,
        "categories": dict(Counter(v.category for v in by_id.values()).most_common()),
        "realized_definite": len(definite), "realized_right": right,
        "rejudge": {k: {"s": s, "requests": m, "per_request_ms": 1e3 * s / max(m, 1)}
                    for k, (s, m) in late.items()},
        "full_rejudge_s": full,
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{n} requests on {args.workers} workers at {IN_FLIGHT} in flight, {len(rows)} KV "
          f"rows; CPUs {out['cpu_affinity']}, load {out['load'][0]:.2f}")
    print(f"judge (attribution + judgement): {spent:.3f} s = {n / spent:,.0f} requests/s")
    print(f"floor (same records, no judging): {bare:.3f} s = {n / bare:,.0f} requests/s; "
          f"ratio {spent / bare:.1f}x")
    print(f"realized hit definite on {len(definite)}/{n}, right on {right}/{len(definite)}; "
          f"categories {out['categories']}")
    for k, r in out["rejudge"].items():
        print(f"late KV rows in {k:>2} range(s): {r['requests']:>4} requests re-judged in "
              f"{r['s'] * 1e3:.1f} ms ({r['per_request_ms']:.3f} ms each)")
    print(f"full re-judge of all {n} requests: {full:.3f} s")


if __name__ == "__main__":
    main()
