"""Click → drawn per page in a real browser (Playwright driving the system Chromium, 1600 px).

Starts the dashboard on a store, clicks through every page in a fixed order for several
rounds (so each page is revisited), waits ``--idle`` seconds (longer than any query cache's
lifetime) before the last round, and opens each page fresh in a new tab (a link from a chat
message: a new Streamlit session; the browser keeps Streamlit's own scripts cached) and in a
new browser profile (a first-ever visit: nothing cached). Prints
p50/p95 per page, and with ``--apptest`` the AppTest cold/warm script time beside it
(benchmarks/pages_bench.py).

Stores (``--store``, repeatable):
- ``demo``: ``mmlens dashboard --demo`` (real SMG router, simulated workers, collectors writing);
- ``bench``: the 100k-request / 1M-KV-block SQLite store of pages_bench (built once, reused);
- ``fleet``: 1,000 workers, 10k requests, 1M blocks on a fresh PostgreSQL server with its
  default durability (fsync on), with a writer adding every worker's scrapes, KV events and
  requests each second while the pages are read (as the collectors would).

``--busy`` keeps one core busy with a second process for the whole run.

    python benchmarks/pages_browser.py [--store demo --store bench --store fleet]
        [--rounds 4] [--idle 65] [--busy] [--apptest] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import pages_bench  # noqa: E402
from tests.live_support import free_port, free_port_base, stop_process  # noqa: E402
from tests.pages.browser_timing import PAGES, click_to_drawn, load_to_drawn  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}
GOALS = {"demo": 1.0, "bench": 1.0, "fleet": 1.5}
FRESH_GOAL = 2.0


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        stop_process(proc, signal.SIGTERM, 5)


@contextlib.contextmanager
def dashboard(db: str | None, work: Path, demo: bool) -> Iterator[tuple[str, str]]:
    """(url, store) of a running `mmlens dashboard` (the demo, or the pages on ``db`` with no
    collectors), stopped on exit."""
    ready = work / "dash-ready.json"
    port = free_port()
    cmd = [sys.executable, "-m", "mmlens", "dashboard", "--port", str(port),
           "--ready-file", str(ready), "--ready-timeout", "120"]
    if demo:
        db = str(work / "demo.db")
        cmd += ["--demo", "--port-base", str(free_port_base(50)), "--db", db]
    else:
        cmd += ["--db", str(db), "--no-collect"]
    env = dict(os.environ)
    env.pop("MMLENS_CONFIG", None)
    env["MMLENS_PAGE_TIMES"] = str(work / SCRIPT_TIMES)
    log = (work / "dashboard.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 180
        while not (ready.exists() and ready.stat().st_size):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dashboard did not start:\n"
                                   + (work / "dashboard.log").read_text()[-2000:])
            time.sleep(0.3)
        if demo:  # the warm-up workload fills every page
            while "warm-up: " not in (work / "dashboard.log").read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("demo warm-up did not finish")
                time.sleep(0.5)
        yield json.loads(ready.read_text())["dashboard"], str(db)
    finally:
        stop_process(proc, signal.SIGTERM, 45)
        log.close()


TIMEOUT_S = 90.0
SCRIPT_TIMES = "script-times.jsonl"  # each page run's script seconds, as the app noted them


Interval = tuple[float, float]  # wall-clock start and end of one click or load


def script_runs(work: Path) -> list[tuple[str, float, float, float]]:
    """Every page run the app noted: (page, end time, wall s, CPU s)."""
    path = work / SCRIPT_TIMES
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        r = json.loads(line)
        out.append(("overview" if r["page"] == "index" else r["page"], r["ts"], r["wall_s"],
                    r["cpu_s"]))
    return out


def script_times(runs: list[tuple[str, float, float, float]]) -> dict[str, tuple[float, float]]:
    """Per page, the median (wall, CPU) seconds of its script runs on the server."""
    by_page: dict[str, list[tuple[float, float]]] = {}
    for page, _ts, wall, cpu in runs:
        by_page.setdefault(page, []).append((wall, cpu))
    return {p: (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs))
            for p, xs in by_page.items()}


def server_share(runs: list[tuple[str, float, float, float]], page: str,
                 span: Interval) -> float:
    """Wall seconds of ``page``'s script runs that ended within ``span``."""
    return sum(wall for p, ts, wall, _ in runs if p == page and span[0] <= ts <= span[1])


def timed(step: Any, name: str) -> tuple[float, Interval]:
    """A step's seconds and wall-clock span; one not drawn within ``TIMEOUT_S`` counts as
    that (and says so)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    start = time.time()
    try:
        took = float(step())
    except PlaywrightTimeout:
        print(f"{name}: not drawn within {TIMEOUT_S:.0f} s", flush=True)
        took = TIMEOUT_S
    return took, (start, time.time())


class Timings:
    """Per page: click → drawn (round by round), fresh loads in a new tab of the same
    browser (a returning user: its HTTP cache holds Streamlit's scripts) and first visits
    (a new browser profile each: nothing cached), each with its wall-clock span."""

    def __init__(self) -> None:
        self.clicks: dict[str, list[float]] = {p[0]: [] for p in PAGES}
        self.fresh: dict[str, list[float]] = {p[0]: [] for p in PAGES}
        self.first: dict[str, list[float]] = {p[0]: [] for p in PAGES}
        self.spans: dict[str, list[Interval]] = {p[0]: [] for p in PAGES}

    def add(self, kind: dict[str, list[float]], name: str, result: tuple[float, Interval],
            ) -> None:
        kind[name].append(result[0])
        if kind is self.clicks:
            self.spans[name].append(result[1])


def measure(url: str, rounds: int, idle_s: float) -> Timings:
    """Click → drawn per page over ``rounds`` rounds (the last after ``idle_s`` idle), then
    fresh loads (a new tab per load, twice per page) and first visits (a new browser
    context per load, twice per page)."""
    from playwright.sync_api import sync_playwright

    out = Timings()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            ctx = browser.new_context(viewport=VIEWPORT)
            page = ctx.new_page()
            first = PAGES[-1]
            load_to_drawn(page, f"{url}/{first[0]}", first[2], first[3], 120)  # session start
            for r in range(rounds):
                if r == rounds - 1 and idle_s:
                    time.sleep(idle_s)
                for name, href, title, texts in PAGES:
                    out.add(out.clicks, name, timed(lambda: click_to_drawn(
                        page, href, title, texts, TIMEOUT_S), name))  # noqa: B023
            page.close()
            for _ in range(2):  # a new tab of the same browser: a new session, cached assets
                for name, _href, title, texts in PAGES:
                    tab = ctx.new_page()
                    out.add(out.fresh, name, timed(lambda: load_to_drawn(
                        tab, page_url(url, name), title, texts, TIMEOUT_S), name))  # noqa: B023
                    tab.close()
            ctx.close()
            for _ in range(2):  # a first-ever visit: a new profile, its HTTP cache empty
                for name, _href, title, texts in PAGES:
                    fresh_ctx = browser.new_context(viewport=VIEWPORT)
                    tab = fresh_ctx.new_page()
                    out.add(out.first, name, timed(lambda: load_to_drawn(
                        tab, page_url(url, name), title, texts, TIMEOUT_S), name))  # noqa: B023
                    fresh_ctx.close()
        finally:
            browser.close()
    return out


def page_url(url: str, name: str) -> str:
    return f"{url}/{'' if name == 'overview' else name}"


def apptest_figures(db: str, n_traces: int) -> dict[str, tuple[float, float]]:
    """pages_bench's AppTest cold/warm medians, in a child process (its own Streamlit)."""
    out = subprocess.run([sys.executable, "-c", (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks import pages_bench as b;"
        "print('RESULT', json.dumps(b.time_on(sys.argv[2], 3, b.PAGES, int(sys.argv[3]))))"),
        str(REPO), db, str(n_traces)], capture_output=True, text=True, cwd=REPO)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {k: tuple(v) for k, v in json.loads(line[7:]).items()}
    print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
    return {}


def report(store: str, t: Timings, apptest: dict[str, tuple[float, float]], load: str,
           runs: list[tuple[str, float, float, float]]) -> bool:
    goal = GOALS[store]
    script = script_times(runs)
    print(f"\n{store} store (load average {load}; goal click p95 ≤ {goal} s, fresh ≤ "
          f"{FRESH_GOAL} s; fresh: a new tab, Streamlit's scripts in the browser's cache; "
          "first: a new browser profile, nothing cached; script: the server's run of the "
          "page, median wall / CPU)")
    print("| page | click p50 | click p95 | clicks | fresh p50 | fresh max | first p50 | "
          "first max | script | AppTest cold / warm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for name, *_ in PAGES:
        c, f, v = t.clicks[name], t.fresh[name], t.first[name]
        at = apptest.get(name)
        at_txt = f"{at[0] * 1000:.0f} / {at[1] * 1000:.0f} ms" if at else "—"
        sc = script.get(name)
        sc_txt = f"{sc[0] * 1000:.0f} / {sc[1] * 1000:.0f} ms" if sc else "—"
        ok &= p95(c) <= goal and max(f) <= FRESH_GOAL
        print(f"| {name} | {statistics.median(c):.2f} s | {p95(c):.2f} s | {len(c)} | "
              f"{statistics.median(f):.2f} s | {max(f):.2f} s | {statistics.median(v):.2f} s | "
              f"{max(v):.2f} s | {sc_txt} | {at_txt} |", flush=True)
    print("each click in order (the last round after the idle wait), browser s (the server "
          "script's ms) · fresh loads · first visits:")
    for name, *_ in PAGES:
        clicks = " ".join(f"{x:.2f} ({server_share(runs, name, span) * 1000:.0f})"
                          for x, span in zip(t.clicks[name], t.spans[name], strict=True))
        print(f"  {name}: {clicks} · " + " ".join(f"{x:.2f}" for x in t.fresh[name]) + " · "
              + " ".join(f"{x:.2f}" for x in t.first[name]))
    print("goal met" if ok else "goal NOT met")
    return ok


# --- the fleet store's writer: what 1,000 workers' collectors add each second ---------------

def write_forever(db: str, n_workers: int) -> None:
    from mmlens.collectors.rollup_job import RollupJob

    from mmlens.records import BlockStored, MetricSample, RequestTrace, labels_of
    from mmlens.store.open import open_store

    store = open_store(db)
    rollups = RollupJob(store)  # the lead collector's job, on its schedule
    workers = pages_bench.worker_urls(n_workers)
    rng = random.Random(11)
    lb = labels_of({"model_name": pages_bench.MODEL, "engine": "0"})
    seq, tick = 1_000_000, 0
    while True:
        now = time.time()
        if tick % 5 == 0:  # every worker scraped every 5 s
            k = 720 + tick // 5
            store.add_samples([MetricSample(w, name, lb, per * k * (j + 1), now)
                               for j, w in enumerate(workers)
                               for name, per in (("vllm:prefix_cache_hits_total", 300.0),
                                                 ("vllm:prefix_cache_queries_total", 500.0))])
        events = []
        for w in rng.sample(workers, 50):
            seq += 1
            events.append(BlockStored(w, 0, seq, now, [rng.getrandbits(63) for _ in range(16)],
                                      None, [], 16))
        store.add_kv_events(events)
        store.add_traces([RequestTrace(f"live-{tick}-{i}", pages_bench.ROUTER, "smg",
                                       pages_bench.MODEL, now, False, status=200,
                                       worker=rng.choice(workers), prompt_tokens=400,
                                       cached_tokens=rng.choice([0, 384]))
                          for i in range(5)])
        rollups.run(now)
        tick += 1
        time.sleep(max(0.0, 1.0 - (time.time() - now)))


@contextlib.contextmanager
def writer(db: str, n_workers: int) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, __file__, "--write-forever", db,
                             "--workers", str(n_workers)], cwd=REPO)
    try:
        yield
    finally:
        stop_process(proc, signal.SIGTERM, 10)


@contextlib.contextmanager
def store_for(kind: str, keep: Path) -> Iterator[tuple[str | None, int]]:
    """(store, traces in it) for a kind; the demo's store is made by the dashboard."""
    if kind == "demo":
        yield None, 0
        return
    if kind == "bench":
        path = keep / "bench-100k-1m.db"
        if not path.exists():
            pages_bench.fill(path, 100_000, 1_000_000, time.time())
        yield str(path), 100_000
        return
    import psycopg

    from tests.servers import postgres_server

    with postgres_server(durable=True) as pg:
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE mmlens")
        url = pg.url("mmlens")
        pages_bench.fill(url, 10_000, 1_000_000, time.time(), pages_bench.worker_urls(1000))
        with writer(url, 1000):
            yield url, 10_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", action="append", choices=("demo", "bench", "fleet"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--idle", type=float, default=65.0,
                    help="seconds idle before the last round (0: none)")
    ap.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    ap.add_argument("--apptest", action="store_true", help="also time AppTest renders")
    ap.add_argument("--keep", default=str(REPO / "artifacts" / "bench-stores"),
                    help="folder for the reusable 100k-request SQLite store")
    ap.add_argument("--write-forever", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1000, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_forever:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        write_forever(args.write_forever, args.workers)
        return 0
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    ok = True
    with busy_core() if args.busy else contextlib.nullcontext():
        for kind in args.store or ["demo"]:
            with store_for(kind, keep) as (db, n_traces):
                for attempt in (1, 2):  # the demo cluster may fail to start on a busy machine
                    try:
                        with tempfile.TemporaryDirectory() as work, \
                                dashboard(db, Path(work), kind == "demo") as (url, store):
                            timings = measure(url, args.rounds, args.idle)
                            load = load_average()
                            apptest = apptest_figures(store, n_traces or 1) if args.apptest \
                                else {}
                            ok &= report(kind, timings, apptest, load, script_runs(Path(work)))
                        break
                    except RuntimeError as exc:
                        print(f"{kind}: {exc}"[-600:], flush=True)
                        if attempt == 2:
                            raise
    print(f"busy core: {'yes' if args.busy else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
