"""Scrape 64 ``/metrics`` targets served on loopback (prints figures; not a unit test).

Usage: python benchmarks/scrape64.py [--targets 64] [--rounds 5]

A child process serves the targets (16 router-like: SMG 1.13.0 HTTP-mode metrics, 741 lines;
48 worker-like: the Dynamo 1.6.1 mocker's vLLM-style metrics, 233 lines), each on its own
port, from the recorded captures in tests/fixtures. The parent runs ``MetricsScraper``:
concurrent GETs on a thread pool, parsing on the caller. The first round parses every series
with prometheus_client (cold); later rounds reuse the per-series cache (steady state).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from threading import Thread

import httpx
from mmlens.collectors.metrics_scrape import MetricsScraper

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "captures"


def serve(bodies: list[bytes], ports: Queue[int], stop: Event) -> None:
    servers = []
    for body in bodies:
        class Handler(BaseHTTPRequestHandler):
            payload = body
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(self.payload)))
                self.end_headers()
                self.wfile.write(self.payload)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        ports.put(srv.server_address[1])
    stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    router = (CAPTURES / "smg_http_metrics.txt").read_bytes()
    worker = (CAPTURES / "dyn_mocker_metrics.txt").read_bytes()
    n_router = args.targets // 4
    # Every target gets its own label values (as real fleets do), so the cold round really
    # parses every series once.
    bodies = [router.replace(b"127.0.0.1:180", f"10.0.{i}.1:180".encode())
              for i in range(n_router)]
    bodies += [worker.replace(b'model_name="', f'pod="w{i}",model_name="'.encode())
               for i in range(args.targets - n_router)]
    ports: Queue[int] = mp.Queue()
    stop = mp.Event()
    child = mp.Process(target=serve, args=(bodies, ports, stop), daemon=True)
    child.start()
    try:
        targets = [(f"t{i}", f"http://127.0.0.1:{ports.get(timeout=30)}/metrics")
                   for i in range(len(bodies))]
        limits = httpx.Limits(max_connections=args.targets, max_keepalive_connections=args.targets)
        with httpx.Client(limits=limits) as client:
            scraper = MetricsScraper(client, timeout_s=2.0, max_workers=32)
            times, counts = [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                samples = scraper.scrape_all(targets)
                times.append(time.perf_counter() - t0)
                counts.append(len(samples))
            scraper.close()
        errors = {t: h.errors for t, h in scraper.health.items() if h.errors}
        print(f"{len(targets)} targets ({n_router} router-like, {len(targets) - n_router} "
              f"worker-like), {counts[0]} samples per round, "
              f"{sum(map(len, bodies)) / 1e6:.2f} MB per round")
        print(f"cold round (empty series cache): {times[0]:.3f} s")
        warm = times[1:] or times
        print(f"steady rounds: median {statistics.median(warm):.3f} s, max {max(warm):.3f} s")
        print(f"errors: {errors or 'none'}")
    finally:
        stop.set()
        child.join(timeout=5)
        if child.is_alive():
            child.kill()


if __name__ == "__main__":
    main()
