"""Per-worker minutes: the rollup job's rows equal the raw rows summed by hand, a rewrite keeps
the resident count it does not know, and a fleet read names the busiest workers and sums the
rest, on both backends."""

from __future__ import annotations

import pytest
from mmlens.collectors.rollup_job import RollupJob

from mmlens.analysis.rollups import hit_lines_of, timeline_of
from mmlens.records import BlockRemoved, BlockStored, MetricSample, WorkerMinute, labels_of
from mmlens.store.open import open_store
from mmlens.store.reader import StoreReader

T0 = 1_700_000_040.0  # a minute's start
LB = labels_of({"model_name": "m", "engine": "0"})
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def worker_urls(n: int) -> list[str]:
    return [f"grpc://10.0.0.{i}:50051" for i in range(n)]


def fill(db: str, workers: int, minutes: int, density: int = 1) -> dict[str, dict[str, float]]:
    """Worker ``i`` stores ``(i + 1) * 16`` blocks and removes 16 a minute, in ``density``
    times as many events; its counters rise by 100 (hits) and 400 (queries) tokens a minute,
    scraped ``density`` times every 5 s. Returns each worker's totals."""
    store = open_store(db)
    totals: dict[str, dict[str, float]] = {}
    try:
        events: list[BlockStored | BlockRemoved] = []
        samples = []
        for i, w in enumerate(worker_urls(workers)):
            seq = 0
            for m in range(minutes):
                for k in range((i + 1) * density):
                    ts = T0 + 60 * m + 50 * k / ((i + 1) * density)
                    seq += 1
                    events.append(BlockStored(w, 0, seq, ts, list(range(16 // density or 1)),
                                              None, [], 16))
                seq += 1
                events.append(BlockRemoved(w, 0, seq, T0 + 60 * m + 55, [1] * 16))
            step = 5.0 / density
            for k in range(int(60 * minutes / step) + 1):
                ts = T0 + k * step
                samples += [MetricSample(w, HITS, LB, 100 * (ts - T0) / 60, ts),
                            MetricSample(w, QUERIES, LB, 400 * (ts - T0) / 60, ts)]
            stored = sum(len(e.block_hashes) for e in events
                         if e.worker == w and isinstance(e, BlockStored))
            totals[w] = {"stored": stored, "removed": 16.0 * minutes}
        store.add_kv_events(events)
        store.add_samples(samples)
        RollupJob(store).fill(T0 + 60 * minutes - 1)
    finally:
        store.close()
    return totals


def test_minutes_sum_the_raw_rows(store_db: str) -> None:
    totals = fill(store_db, 3, 4)
    store = open_store(store_db, readonly=True)
    try:
        rows = store.worker_minutes(T0 - 600)
    finally:
        store.close()
    assert {r.ts for r in rows} == {T0 + 60 * m for m in range(4)}
    for w, want in totals.items():
        mine = [r for r in rows if r.worker == w]
        assert sum(r.kv_stored for r in mine) == want["stored"]
        assert sum(r.kv_removed for r in mine) == want["removed"]
        # 400 queried tokens a minute, from the first scrape (T0) to the last before the
        # job's minute ended (T0 + 235 s)
        assert sum(r.query_tokens for r in mine) == pytest.approx(400 * 235 / 60)
        assert sum(r.hit_tokens for r in mine) == pytest.approx(100 * 235 / 60)


def test_a_rewrite_without_resident_blocks_keeps_the_stored_count(store_db: str) -> None:
    store = open_store(store_db)
    try:
        store.set_worker_minutes([WorkerMinute(T0, "w", 5, 1, 900, 1.0, 2.0)])
        store.set_worker_minutes([WorkerMinute(T0, "w", 7, 2, None, 3.0, 4.0)])
        assert store.worker_minutes(T0) == [WorkerMinute(T0, "w", 7, 2, 900, 3.0, 4.0)]
    finally:
        store.close()


def test_a_fleet_read_names_the_busiest_and_sums_the_rest(store_db: str) -> None:
    totals = fill(store_db, 20, 3)
    reader = StoreReader(store_db)
    try:
        folded = reader.folded_minutes(600.0, "kv", 3)
    finally:
        reader.close()
    assert folded is not None
    rows, n = folded
    assert n == 20
    busiest = sorted(totals, key=lambda w: totals[w]["stored"], reverse=True)[:3]
    assert {r.worker for r in rows if r.worker is not None} == set(busiest)
    rest = sum(t["stored"] for w, t in totals.items() if w not in busiest)
    assert sum(r.kv_stored for r in rows if r.worker is None) == rest
    timeline = timeline_of(rows, n)
    assert {w for _, w, _, _ in timeline} == {*busiest, "17 other workers"}
    lines = hit_lines_of(rows, n)
    assert all(abs(v - 0.25) < 1e-9 for points in lines.values() for _, v in points)
