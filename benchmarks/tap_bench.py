"""`mmlens tap` beside nginx: added latency per image size (idle and under load), requests per
CPU-second with every request recorded, and memory (prints figures; not a unit test).

Usage: python benchmarks/tap_bench.py [--sizes 64:PNG,256:JPEG,...] [--overhead 400]
       [--requests 6000] [--passes 3] [--load-rps 300] [--no-nginx]

Processes, all on 127.0.0.1: a minimal OpenAI-compatible upstream (aiohttp; answers at once
with usage and SMG's worker header; core 1), `mmlens tap` recording into a fresh SQLite store
(its proxy and its recorder process both on core 0: one core) and nginx from Debian as a
plain reverse proxy (its own config in a temporary folder, one process, `proxy_buffering
off` like the tap's streaming, keep-alive to the upstream; core 0), started and stopped here
by PID; the clients run on core 1.

Images are photo-like (smooth structure, edges and sensor noise; PNG and JPEG), 64² to 2048²
as data URLs, each request its own image bytes (so no cache flatters the tap).

1. Added latency: sequential requests rotating direct / tap / nginx; per proxy the median and
   p99 of (via) minus those of (direct). Idle, then under load: a second client sends
   `--load-rps` requests per second (64² images) through the proxy being measured.
2. Throughput: `--requests` requests with 32 in flight through each proxy, `--passes` times
   in turns (tap, nginx, tap, ...), the medians printed; requests per CPU-second of the
   proxy's processes (the tap's recorder process included: its CPU is read once every
   request is in the store), the tap's split between its proxy and its recorder.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import shutil
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
from PIL import Image, ImageDraw, ImageFilter

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
ANSWER = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "A photo."}}],
    "usage": {"prompt_tokens": 81, "completion_tokens": 4, "total_tokens": 85,
              "prompt_tokens_details": {"cached_tokens": 64}}}).encode()
TEXT = "Describe this image in detail please."


def photo(size: int, fmt: str, seed: int) -> bytes:
    """A photo-like image: a blurred random field (sky, land), shapes with edges, and
    per-pixel noise, so it compresses like a photograph rather than a flat colour."""
    rng = random.Random(seed)
    low = Image.new("RGB", (8, 8))
    low.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(64)])
    img = low.resize((size, size), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = rng.randrange(size), rng.randrange(size)
        r = rng.randrange(max(2, size // 16), max(3, size // 4))
        draw.ellipse((x - r, y - r, x + r, y + r),
                     fill=tuple(rng.randrange(256) for _ in range(3)))
    img = img.filter(ImageFilter.GaussianBlur(max(1, size // 256)))
    noise = Image.effect_noise((size, size), 24).convert("RGB")
    img = Image.blend(img, noise, 0.12)
    out = io.BytesIO()
    if fmt == "JPEG":
        img.save(out, "JPEG", quality=90)
    else:
        img.save(out, "PNG")
    return out.getvalue()


def chat_body(image: bytes, fmt: str) -> bytes:
    url = f"data:image/{fmt.lower()};base64," + base64.b64encode(image).decode()
    return json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": TEXT}]}]}).encode()


def bodies(size: int, fmt: str, n: int, start: int = 0) -> list[bytes]:
    """``n`` distinct requests of one image size (a few images, a salt byte changed; those
    from another ``start`` distinct from these)."""
    base = [photo(size, fmt, seed) for seed in range(3)]
    return [chat_body(base[i % 3], fmt).replace(b'"m"', f'"m{i}"'.encode(), 1)
            for i in range(start, start + n)]


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

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host=HOST, port=port, print=None, access_log=None)


NGINX_CONF = """
worker_processes 1;
master_process off;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 64m;
    upstream router {{ server {upstream}; keepalive 64; }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://router;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def spawn(cmd: list[str], core: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["taskset", "-c", str(core), *cmd], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_parts(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` itself and of its children (the tap's recorder process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    return own, sum(cpu_s(int(c)) for c in (kids.read_text().split() if kids.exists()
                                            else []))


def cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (the tap's recorder process included)."""
    return sum(cpu_parts(pid))


async def wait_up(url: str, body: bytes) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            try:
                async with s.post(url + "/v1/chat/completions", data=body) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not up")


HEADERS = {"content-type": "application/json"}


async def timed(s: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with s.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as r:
        await r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t0


async def overhead(urls: dict[str, str], reqs: list[bytes]) -> dict[str, list[float]]:
    """Sequential requests, the targets in a rotating order; one keep-alive session each."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    sessions = {name: aiohttp.ClientSession() for name in urls}
    names = list(urls)
    try:
        for i, body in enumerate(reqs):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                out[name].append(await timed(sessions[name], urls[name], body))
    finally:
        for s in sessions.values():
            await s.close()
    return out


async def background(url: str, body: bytes, rps: float, stop: asyncio.Event) -> int:
    """``rps`` requests per second through ``url`` until ``stop``."""
    sent = 0
    async with aiohttp.ClientSession() as s:
        pending: set[asyncio.Task[float]] = set()
        t0 = time.perf_counter()
        while not stop.is_set():
            due = t0 + sent / rps
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            task = asyncio.create_task(timed(s, url, body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return sent


async def overhead_loaded(urls: dict[str, str], reqs: list[bytes], load_body: bytes,
                          rps: float) -> dict[str, list[float]]:
    """Per proxy: the same sequential pairs (direct, via) while load runs through it."""
    out: dict[str, list[float]] = {}
    for name in (n for n in urls if n != "direct"):
        stop = asyncio.Event()
        load = asyncio.create_task(background(urls[name], load_body, rps, stop))
        await asyncio.sleep(0.3)
        got = await overhead({"direct": urls["direct"], name: urls[name]}, reqs)
        stop.set()
        await load
        out.setdefault("direct:" + name, got["direct"])
        out[name] = got[name]
    return out


async def throughput(url: str, reqs: list[bytes], concurrency: int) -> float:
    it = iter(reqs)

    async def worker(s: aiohttp.ClientSession) -> None:
        for body in it:
            async with s.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as r:
                await r.read()
                assert r.status == 200

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1]


def added(direct: list[float], via: list[float]) -> tuple[float, float]:
    return (statistics.median(via) - statistics.median(direct),
            pct(via, 99) - pct(direct, 99))


def stored(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT count(*) FROM traces").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def wait_stored(db: Path, n: int, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (got := stored(db)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def settled(db: Path) -> int:
    """The stored count once it stopped growing for a second (the recorder caught up)."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 1.0:
        got = stored(db)
        if got != last:
            last, since = got, time.monotonic()
        time.sleep(0.1)
    return last


def stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGINT)
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64:PNG,256:JPEG,512:PNG,768:PNG,1024:PNG,2048:JPEG",
                    help="side:format of the images (a 768² or 1024² PNG is about 1 MB)")
    ap.add_argument("--overhead", type=int, default=400, help="sequential requests per size")
    ap.add_argument("--requests", type=int, default=6000, help="throughput requests (64²)")
    ap.add_argument("--load-rps", type=float, default=300.0)
    ap.add_argument("--passes", type=int, default=3,
                    help="throughput passes, tap and nginx in turns (this machine's speed "
                    "drifts between minutes: the median is reported)")
    ap.add_argument("--no-nginx", action="store_true")
    args = ap.parse_args()
    nginx = None if args.no_nginx else shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None and not args.no_nginx:
        print("nginx not installed (apt-get install nginx-light): the peer column is empty")
    sizes = [(int(x.split(":")[0]), [*x.split(":"), "PNG"][1].upper())
             for x in args.sizes.split(",")]
    print(f"machine: {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at start")
    up_port, tap_port, ngx_port = free_port(), free_port(), free_port()
    urls = {"direct": f"http://{HOST}:{up_port}", "tap": f"http://{HOST}:{tap_port}"}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "tap.db"
        procs = [spawn([sys.executable, __file__, "--serve-upstream", str(up_port)], 1)]
        tapp = spawn([sys.executable, "-m", "mmlens", "tap", "--listen", f"{HOST}:{tap_port}",
                      "--upstream", urls["direct"], "--db", str(db)], 0)
        procs.append(tapp)
        ngx = None
        if nginx is not None:
            conf = Path(tmp) / "nginx.conf"
            conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=f"{HOST}:{up_port}",
                                              listen=f"{HOST}:{ngx_port}"))
            ngx = spawn([nginx, "-p", tmp, "-e", f"{tmp}/nginx-error.log", "-c", str(conf)], 0)
            procs.append(ngx)
            urls["nginx"] = f"http://{HOST}:{ngx_port}"
        try:
            warm = chat_body(photo(64, "PNG", 0), "PNG")
            for url in urls.values():
                asyncio.run(wait_up(url, warm))
            run(args, sizes, urls, db, tapp, ngx)
        finally:
            for p in reversed(procs):
                stop(p)


def run(args: argparse.Namespace, sizes: list[tuple[int, str]], urls: dict[str, str], db: Path,
        tapp: subprocess.Popen[bytes], ngx: subprocess.Popen[bytes] | None) -> None:
    proxies = [n for n in urls if n != "direct"]
    print("\nadded latency (via − direct; median / p99 in ms), sequential requests:")
    print(f"{'image':>16} {'bytes':>9} | " + " | ".join(
        f"{n + ' idle':>17} {n + ' loaded':>17}" for n in proxies) + " | tap/nginx median")
    for size, fmt in sizes:
        reqs = bodies(size, fmt, args.overhead)
        image_bytes = len(base64.b64decode(json.loads(reqs[0])["messages"][0]["content"][0][
            "image_url"]["url"].split(",", 1)[1]))
        idle = asyncio.run(overhead(urls, reqs))
        load_body = chat_body(photo(64, "PNG", 7), "PNG")
        loaded = asyncio.run(overhead_loaded(urls, reqs[: max(100, len(reqs) // 2)],
                                             load_body, args.load_rps))
        cells, meds = [], {}
        for n in proxies:
            mi, pi = added(idle["direct"], idle[n])
            ml, pl = added(loaded["direct:" + n], loaded[n])
            meds[n] = (mi, ml)
            cells.append(f"{mi * 1e3:7.3f} / {pi * 1e3:6.2f}  {ml * 1e3:7.3f} / {pl * 1e3:6.2f}")
        ratio = ""
        if "nginx" in meds:
            ratio = " | ".join(f"{meds['tap'][k] / max(meds['nginx'][k], 1e-6):5.1f}×"
                               for k in (0, 1)) + " (idle | loaded)"
        print(f"{f'{size}² {fmt}':>16} {image_bytes:>9} | " + " | ".join(cells) + " | " + ratio)
    before = settled(db)
    print(f"\nthroughput: {args.requests} requests (64² PNG, distinct) per pass, 32 in flight, "
          f"{args.passes} pass(es), tap and nginx in turns (medians):")
    runs: dict[str, list[tuple[float, float, float, int]]] = {}  # wall, proxy, recorder CPU, RSS
    recorded = 0
    for p in range(args.passes):
        reqs = bodies(64, "PNG", args.requests, start=p * args.requests)
        for n, proc in (("tap", tapp), ("nginx", ngx)):
            if proc is None:
                continue
            parts0 = cpu_parts(proc.pid)
            runs.setdefault(n + ":rss0", []).append((0, 0, 0, rss_kb(proc.pid)))
            wall = asyncio.run(throughput(urls[n], reqs, 32))
            if n == "tap":
                recorded = wait_stored(db, before + (p + 1) * args.requests) - before
            own, kids = (b - a for a, b in zip(parts0, cpu_parts(proc.pid), strict=True))
            runs.setdefault(n, []).append((wall, own, kids, rss_kb(proc.pid)))
    per_cpu: dict[str, float] = {}
    for n in ("tap", "nginx"):
        if n not in runs:
            continue
        got = runs[n]
        wall = statistics.median(r[0] for r in got)
        rates = [args.requests / max(r[1] + r[2], 1e-9) for r in got]
        per_cpu[n] = statistics.median(rates)
        note = ""
        if n == "tap":
            note = (f", {recorded} of {args.passes * args.requests} recorded (CPU read after "
                    f"the last was stored); per request "
                    f"{statistics.median(r[1] for r in got) / args.requests * 1e6:.0f} µs in "
                    f"the proxy, {statistics.median(r[2] for r in got) / args.requests * 1e6:.0f}"
                    f" µs in the recorder")
        print(f"  {n:>5}: {args.requests / wall:8,.0f} req/s wall, {per_cpu[n]:8,.0f} req per "
              f"CPU-second (passes: {' / '.join(f'{x:,.0f}' for x in rates)}); RSS "
              f"{runs[n + ':rss0'][0][3] / 1024:.1f} → {got[-1][3] / 1024:.1f} MiB" + note)
    if len(per_cpu) == 2:
        print(f"  tap/nginx requests per CPU-second: {per_cpu['tap'] / per_cpu['nginx']:.2f}×")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-upstream":
        upstream_main(int(sys.argv[2]))
    else:
        main()
