"""`mmlens tap` overhead, throughput and memory on loopback (prints figures; not a unit test).

Usage: python benchmarks/tap_bench.py [--requests 10000] [--overhead 1000]

Processes, all on 127.0.0.1: a minimal OpenAI-compatible upstream (aiohttp, answers at once
with usage and SMG's worker header; pinned to core 1), `mmlens tap` in front of it recording
into a fresh store (pinned to core 0, so it has one core), and this client (core 1).
Requests are small image requests (a 64×64 PNG as a data URL and a short text).

1. Overhead: sequential requests alternating direct and through the tap; the tap's added
   median and p99 latency (via − direct, percentiles of each).
2. Throughput: `--requests` requests with 32 in flight through the tap; requests per second
   (wall) and per CPU-second of the tap process; the tap's RSS after 1,000 requests and at
   the end (memory flat: no growth with the number of requests).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from mmlens.layout.synthetic_images import synthetic_png

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
BODY = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(
        synthetic_png("solid", 64, 64)).decode()}},
    {"type": "text", "text": "Describe this image in detail please."}]}]}).encode()
ANSWER = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "A red square."}}],
    "usage": {"prompt_tokens": 81, "completion_tokens": 4, "total_tokens": 85,
              "prompt_tokens_details": {"cached_tokens": 64}}}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def upstream_main(port: int) -> None:
    seq = iter(range(1 << 62))

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        rid = f"chatcmpl-{next(seq):012d}"  # every answer its own id, as a router's
        return web.Response(body=ANSWER.replace(b"chatcmpl-1", rid.encode()),
                            content_type="application/json", headers={
                                "x-smg-routed-worker-id": "grpc://127.0.0.1:50051",
                                "x-request-id": request.headers.get("x-request-id", rid)})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host=HOST, port=port, print=None, access_log=None)


def spawn(cmd: list[str], core: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["taskset", "-c", str(core), *cmd], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.post(url + "/v1/chat/completions", data=BODY) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not up")


async def overhead(direct: str, tap: str, n: int) -> tuple[list[float], list[float]]:
    d, v = [], []
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            for url, out in ((direct, d), (tap, v)) if i % 2 else ((tap, v), (direct, d)):
                t0 = time.perf_counter()
                async with s.post(url + "/v1/chat/completions", data=BODY,
                                  headers=headers) as r:
                    await r.read()
                out.append(time.perf_counter() - t0)
    return d, v


async def load(tap: str, n: int, concurrency: int, tap_pid: int,
               ) -> tuple[float, float, list[tuple[int, int]]]:
    sent = 0
    rss: list[tuple[int, int]] = []
    headers = {"content-type": "application/json"}

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < n:
            sent += 1
            if sent in (1000, n // 2, n):
                rss.append((sent, rss_kb(tap_pid)))
            async with s.post(tap + "/v1/chat/completions", data=BODY, headers=headers) as r:
                await r.read()
                assert r.status == 200

    cpu0, t0 = cpu_s(tap_pid), time.perf_counter()
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return n / wall, n / max(cpu_s(tap_pid) - cpu0, 1e-9), rss


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--overhead", type=int, default=1000)
    args = ap.parse_args()
    if len(sys.argv) > 1 and sys.argv[1] == "--upstream-child":
        return
    up_port, tap_port = free_port(), free_port()
    direct, tap = f"http://{HOST}:{up_port}", f"http://{HOST}:{tap_port}"
    with tempfile.TemporaryDirectory() as tmp:
        up = spawn([sys.executable, __file__, "--serve-upstream", str(up_port)], 1)
        tapp = spawn([sys.executable, "-m", "mmlens", "tap", "--listen", f"{HOST}:{tap_port}",
                      "--upstream", direct, "--db", str(Path(tmp) / "tap.db")], 0)
        try:
            asyncio.run(wait_up(direct))
            asyncio.run(wait_up(tap))
            d, v = asyncio.run(overhead(direct, tap, args.overhead))
            med = statistics.median(v) - statistics.median(d)
            p99 = pct(v, 99) - pct(d, 99)
            print(f"overhead over {args.overhead} sequential requests: direct median "
                  f"{statistics.median(d) * 1e3:.2f} ms p99 {pct(d, 99) * 1e3:.2f} ms; "
                  f"via tap median {statistics.median(v) * 1e3:.2f} ms p99 "
                  f"{pct(v, 99) * 1e3:.2f} ms; added median {med * 1e3:.2f} ms, "
                  f"p99 {p99 * 1e3:.2f} ms")
            rate, per_cpu, rss = asyncio.run(load(tap, args.requests, 32, tapp.pid))
            print(f"throughput: {args.requests} requests, 32 in flight: {rate:,.0f} req/s "
                  f"wall, {per_cpu:,.0f} req per CPU-second of the tap (one core)")
            print("tap RSS: " + ", ".join(f"after {n:,} requests {kb / 1024:.1f} MiB"
                                          for n, kb in rss))
            time.sleep(1.0)  # the writer's last batch
            db = sqlite3.connect(f"file:{Path(tmp) / 'tap.db'}?mode=ro", uri=True)
            rows = db.execute("SELECT count(*) FROM traces").fetchone()[0]
            db.close()
            print(f"records stored: {rows} (every request recorded)")
        finally:
            for p in (tapp, up):
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-upstream":
        upstream_main(int(sys.argv[2]))
    else:
        main()
