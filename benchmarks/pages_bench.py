"""Server-side render time of each dashboard page on a large store.

Fills a store through its own write API with 100k request traces and 10M KV-event blocks
(plus an hour of metric samples, KV state and health), then renders every page through
AppTest several times and prints the median per page: cold (query caches cleared before each
run, as after a ttl expiry) and warm (caches hot). Target: ≤ 300 ms median per page.

``--workers N`` spreads everything over N workers instead of 4: the fleet case is a
1,000-worker store, ``--workers 1000 --traces 10000 --blocks 1000000``. Each worker then has its
prefix-cache counters and two other metrics scraped every 5 s, not 62.
``--backend postgresql`` fills and reads a database on a fresh PostgreSQL server on 127.0.0.1
(stopped at the end) instead of a SQLite file.

    python benchmarks/pages_bench.py [--db PATH] [--traces 100000] [--blocks 10000000] [--runs 7]
                                     [--workers 4] [--backend sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mmlens.collectors.rollup_job import RollupJob  # noqa: E402
from mmlens.collectors.trace_sink import SentRequest, TraceSink  # noqa: E402
from mmlens.collectors.traces import ImagePart  # noqa: E402

from mmlens.analysis.availability.aggregate import cell_sums  # noqa: E402
from mmlens.layout.synthetic_images import synthetic_png  # noqa: E402
from mmlens.records import (  # noqa: E402
    Availability,
    BlockRemoved,
    BlockStored,
    CollectorHealth,
    ImageRef,
    MetricSample,
    RequestTrace,
    RoutingDecision,
    labels_of,
)
from mmlens.store.base import SQLStore  # noqa: E402
from mmlens.store.open import label, open_store  # noqa: E402

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
ROUTER = "http://127.0.0.1:30000"


def worker_urls(n: int) -> list[str]:
    return [f"grpc://127.0.0.1:{50051 + i}" for i in range(n)]


WORKERS = worker_urls(4)
PAGES = ("overview", "inspector", "routing", "affinity", "cache", "lab", "targets")


def template_traces(n_images: int = 24) -> list[RequestTrace]:
    """A few dozen traces with real expected layouts, cloned to make the 100k."""
    sink = TraceSink(layout_model="qwen3-vl", keep_text=True)
    out = []
    sizes = [(64, 64), (224, 224), (640, 480), (1280, 720)]
    for i in range(n_images):
        w, h = sizes[i % len(sizes)]
        data = synthetic_png("solid", w, h, rgb=(i * 10 % 256, 80, 160))
        images = [ImagePart(data)] * (1 + i % 2)
        t = RequestTrace(f"tmpl-{i}", ROUTER, "smg", MODEL, 0.0, False, status=200)
        sink.describe(t, SentRequest("Describe this image in detail please.", images))
        t.prompt_tokens = t.expected_layout.engine_prompt_tokens if t.expected_layout else None
        out.append(t)
    return out


def fill(path: Path | str, n_traces: int, n_blocks: int, now: float,
         workers: list[str] = WORKERS) -> None:
    store = open_store(path)
    try:
        fill_store(store, n_traces, n_blocks, now, workers)
    finally:
        store.close()


def fill_store(store: SQLStore, n_traces: int, n_blocks: int, now: float,
               workers: list[str] = WORKERS) -> None:
    """Traces, KV events, an hour of samples, resident summaries and health into ``store``
    (SQLite or PostgreSQL)."""
    rng = random.Random(7)
    t0 = time.perf_counter()
    _fill_traces(store, rng, n_traces, now, workers)
    _fill_availability(store, rng, n_traces, now, workers)
    t1 = time.perf_counter()
    written, n_events = _fill_kv_events(store, rng, n_blocks, now, workers)
    t2 = time.perf_counter()
    _fill_samples(store, now, workers)
    _fill_state(store, n_blocks, now, workers)
    t3 = time.perf_counter()
    minutes = RollupJob(store).fill(now)  # what the lead collector's rollup job writes
    print(f"rolled up {minutes} worker minutes in {time.perf_counter() - t3:.1f} s", flush=True)
    print(f"filled {label(store.path)}: {len(workers)} workers, {n_traces} traces in "
          f"{t1 - t0:.1f} s, {written} KV blocks ({n_events} events) in {t2 - t1:.1f} s, "
          f"{store.used_bytes() / 1e6:.0f} MB",
          flush=True)


def _fill_traces(store: SQLStore, rng: random.Random, n_traces: int, now: float,
                 workers: list[str]) -> None:
    templates = template_traces()
    batch: list[RequestTrace] = []
    for i in range(n_traces):
        t = copy.copy(templates[i % len(templates)])
        t.request_id = f"bench-{i:06d}"
        t.ts = now - 3600 + 3600 * i / n_traces
        t.worker = workers[rng.randrange(len(workers))]
        prompt = t.prompt_tokens or 0
        t.cached_tokens = rng.choice([0, prompt // 16 * 16])
        t.predictions = [RoutingDecision(t.request_id, "smg", "header:x-smg-cache-trace",
                                         worker=t.worker, branch="event_hit",
                                         overlap_blocks=rng.randrange(prompt // 16 + 1),
                                         request_blocks=prompt // 16, block_size=16)]
        t.latency_s, t.ttft_s, t.completion_tokens = 0.05, 0.02, 8
        batch.append(t)
        if len(batch) == 5000:
            store.add_traces(batch)
            batch = []
    store.add_traces(batch)


def _fill_availability(store: SQLStore, rng: random.Random, n: int, now: float,
                       workers: list[str]) -> None:
    """One evaluated request per trace (what the collector's availability job writes)."""
    causes = ("load_spill", "content_blind", "stale_index", "evicted")
    rows = []
    for i in range(n):
        prompt = rng.randrange(80, 3000)
        best = prompt // 16 * 16 * rng.randrange(2)
        realized = best if rng.random() < 0.7 else 0
        w = workers[rng.randrange(len(workers))]
        rows.append(Availability(
            f"bench-{i:06d}", now - 3600 + 3600 * i / n, ROUTER, "smg", MODEL, w, 16, prompt, 1,
            "degraded", {w: best}, w, best, best, realized, best - realized,
            {} if best == realized else {causes[i % 4]: best - realized},
            predicted_tokens=best))
        if len(rows) == 20_000:
            store.add_availability(rows)
            store.add_cells(cell_sums(rows))
            rows = []
    store.add_availability(rows)
    store.add_cells(cell_sums(rows))


def _fill_kv_events(store: SQLStore, rng: random.Random, n_blocks: int, now: float,
                    workers: list[str]) -> tuple[int, int]:
    """KV events of 64 blocks each, every fifth a removal, every other store with an image
    key, until `n_blocks`; returns (blocks written, events)."""
    per_event = 64
    events: list[BlockStored | BlockRemoved] = []
    seq = {w: 0 for w in workers}
    written = 0
    i = 0
    while written < n_blocks:
        w = workers[i % len(workers)]
        ts = now - 3600 + 3600 * written / n_blocks
        hashes = [rng.getrandbits(64) for _ in range(per_event)]
        if i % 5 == 4:
            events.append(BlockRemoved(w, 0, seq[w], ts, hashes))
        else:
            images = [(ImageRef(f"{i % 500:064x}", 0),)] * per_event if i % 2 else None
            events.append(BlockStored(w, 0, seq[w], ts, hashes, rng.getrandbits(64), [], 16,
                                      images=images))
        seq[w] += 1
        written += per_event
        i += 1
        if len(events) == 10_000:
            store.add_kv_events(events)
            events = []
    store.add_kv_events(events)
    return written, i


def _fill_samples(store: SQLStore, now: float, workers: list[str]) -> None:
    samples: list[MetricSample] = []
    others = 60 if len(workers) <= 4 else 2
    for k in range(720):  # an hour of 5 s scrapes
        ts = now - 3600 + 5 * k
        for j, w in enumerate(workers):
            lb = labels_of({"model_name": MODEL, "engine": "0"})
            scale = float(k * (j + 1))
            samples += [MetricSample(w, "vllm:prefix_cache_hits_total", lb, 300 * scale, ts),
                        MetricSample(w, "vllm:prefix_cache_queries_total", lb, 500 * scale, ts)]
            samples += [MetricSample(w, f"vllm:other_{m}", lb, float(k), ts) for m in range(others)]
        samples += [MetricSample("smg", "smg_mm_processing_total", labels_of(
            {"model": MODEL, "mode": "router", "reason": "auto_mixed"}), 4.0 * k, ts)]
        samples += [MetricSample("smg", "smg_cache_aware_policy_branch_total",
                                 labels_of({"branch": b}), float(k * (n + 1)), ts)
                    for n, b in enumerate(("event_hit", "event_miss", "expected_wait_fallback"))]
        samples += [MetricSample("smg", "smg_worker_requests_total",
                                 labels_of({"worker": w, "model": MODEL}), float(k), ts)
                    for w in workers]
        samples += [MetricSample("smg", "smg_http_requests_total",
                                 labels_of({"route": f"/r{m}", "status": "200"}), float(k), ts)
                    for m in range(150)]
        if len(samples) > 50_000:
            store.add_samples(samples)
            samples = []
    store.add_samples(samples)


def _fill_state(store: SQLStore, n_blocks: int, now: float, workers: list[str]) -> None:
    store.set_kv_state({w: {"worker": w, "rank": 0, "resident_blocks": n_blocks // 8,
                            "images": {f"{m:064x}": 40 for m in range(120)}}
                        for w in workers}, now)
    store.set_health([CollectorHealth("metrics", w, last_success=now) for w in workers]
                     + [CollectorHealth("kv_events", f"{w}#0", last_success=now,
                                        counters={"batches": 1000.0}) for w in workers], now)
    store.set_meta("targets", {"routers": [{"name": "smg", "kind": "smg", "url": ROUTER,
                                            "metrics_url": None, "api_key_env": None}],
                               "workers": [], "prometheus": None})
    store.set_meta("router_state", [{"router": "smg", "url": ROUTER, "kind": "smg",
                                     "models": [MODEL], "workers": [
        {"url": w, "model": MODEL, "healthy": True, "status": "ready", "load": 0,
         "kv_block_size": 16, "mm_processor": None} for w in workers]}])


def time_pages(runs: int, pages: tuple[str, ...] = PAGES, n_traces: int = 100_000,
               ) -> dict[str, tuple[float, float]]:
    from mmlens.ui import shared
    from streamlit.testing.v1 import AppTest

    out = {}
    for page in pages:
        cold, warm = [], []
        for i in range(runs + 1):
            at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
            if page == "inspector":
                at.query_params["request"] = f"bench-{n_traces // 2:06d}"  # a stored one
            at.run()
            at.switch_page(f"pages/{page}.py")
            shared.forget_store_reads()  # as after a change in the store
            t = time.perf_counter()
            at.run()
            c = time.perf_counter() - t
            assert not at.exception, (page, [e.value for e in at.exception])
            t = time.perf_counter()
            at.run()
            w = time.perf_counter() - t
            if i:  # the first round loads tokenizers and imports
                cold.append(c)
                warm.append(w)
        out[page] = (statistics.median(cold), statistics.median(warm))
        print(f"{page:<10} cold median {out[page][0] * 1000:6.0f} ms   "
              f"warm median {out[page][1] * 1000:6.0f} ms", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="reuse or create the SQLite store here (default: a temp file)")
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--traces", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--pages", default=",".join(PAGES), help="comma-separated subset")
    args = ap.parse_args()
    pages = tuple(args.pages.split(","))
    workers = worker_urls(args.workers)
    if args.backend == "postgresql":
        with postgres_db() as url:
            fill(url, args.traces, args.blocks, time.time(), workers)
            results = time_on(url, args.runs, pages, args.traces)
    else:
        path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "bench.db"
        if not path.exists():
            fill(path, args.traces, args.blocks, time.time(), workers)
        results = time_on(str(path), args.runs, pages, args.traces)
    worst = max(c for c, _ in results.values())
    print(f"worst cold median {worst * 1000:.0f} ms (target 300 ms)")
    return 0 if worst <= 0.3 else 1


@contextlib.contextmanager
def postgres_db() -> Iterator[str]:
    """A database on a fresh PostgreSQL server (as the tests start one), stopped on exit."""
    import psycopg

    from tests.servers import postgres_server

    with postgres_server() as pg:
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE mmlens")
        yield pg.url("mmlens")


def time_on(db: str, runs: int, pages: tuple[str, ...], n_traces: int,
            ) -> dict[str, tuple[float, float]]:
    os.environ["MMLENS_DB"] = db
    os.environ.pop("MMLENS_CONFIG", None)
    return time_pages(runs, pages, n_traces)


if __name__ == "__main__":
    sys.exit(main())
