"""Click → drawn per page in a real browser (Playwright driving the system Chromium, 1600 px).

Starts the dashboard on a store, clicks through every page in a fixed order for several
rounds (so each page is revisited), waits ``--idle`` seconds (longer than any query cache's
lifetime) before the last round, then opens each page as a new Streamlit session four ways:
- fresh: a new tab of the browser profile the clicks ran in, kept on disk as a user's is (a
  link from a chat message: its HTTP cache and V8's code cache hold Streamlit's scripts);
- reload: that tab reloaded;
- private: a new tab of a private (in-memory) profile that loaded the dashboard once: its HTTP
  cache holds the scripts, but no code cache is kept (the "fresh" of earlier runs);
- first: a new private profile each time (a first-ever visit: nothing cached).
Beside each such load, the same load of a bare Streamlit page (benchmarks/floor_app.py, a
title and a line, its own server) is the floor: Streamlit's frontend alone, at that moment.
Prints p50/p95 per page, and with ``--apptest`` the AppTest cold/warm script time beside it
(benchmarks/pages_bench.py).

Stores (``--store``, repeatable):
- ``demo``: ``mmlens dashboard --demo`` (real SMG router, simulated workers, collectors writing);
- ``bench``: the 100k-request / 1M-KV-block SQLite store of pages_bench (built once, reused);
- ``fleet``: 1,000 workers, 10k requests, 1M blocks on a fresh PostgreSQL server with its
  default durability (fsync on), with a writer adding every worker's scrapes, KV events and
  requests each second while the pages are read (as the collectors would).

``--busy`` keeps one core busy with a second process for the whole run.

    python benchmarks/pages_browser.py [--store demo --store bench --store fleet]
        [--rounds 4] [--loads 2] [--idle 65] [--busy] [--apptest] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
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
from tests.pages.browser_timing import (  # noqa: E402
    PAGES,
    click_to_drawn,
    load_to_drawn,
    wait_drawn,
)

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


# how a page is opened as a new session; the goal is judged on the first two (the issue's "a
# link, a reload, a new tab" in a user's browser), the others are printed beside
LOADS = ("fresh", "reload", "private", "first")
FLOOR = ("Floor", ("Ready",))  # benchmarks/floor_app.py's title and text


class Timings:
    """Per page: click → drawn (round by round, each with its wall-clock span) and each kind
    of load in ``LOADS``; per kind, the floor page's loads made beside them."""

    def __init__(self) -> None:
        self.clicks: dict[str, list[float]] = {p[0]: [] for p in PAGES}
        self.spans: dict[str, list[Interval]] = {p[0]: [] for p in PAGES}
        self.loads: dict[str, dict[str, list[float]]] = {k: {p[0]: [] for p in PAGES}
                                                         for k in LOADS}
        self.floor: dict[str, list[float]] = {k: [] for k in LOADS}


def opened(tab: Any, url: str, title: str, texts: tuple[str, ...], name: str,
           reload: bool = False) -> tuple[float, float | None]:
    """Seconds to ``url`` drawn in ``tab``, and with ``reload`` to it drawn again after a
    reload of the tab."""
    took = timed(lambda: load_to_drawn(tab, url, title, texts, TIMEOUT_S), name)[0]
    if not reload:
        return took, None

    def again() -> float:
        t = time.perf_counter()
        tab.reload(wait_until="commit")
        wait_drawn(tab, title, texts, TIMEOUT_S)
        return time.perf_counter() - t

    return took, timed(again, f"{name} (reload)")[0]


def open_each_way(user: Any, private: Any, browser: Any, url: str, title: str,
                  texts: tuple[str, ...], name: str) -> Iterator[tuple[str, float]]:
    """(kind of ``LOADS``, seconds) of ``url`` opened as a new session each way."""
    tab = user.new_page()
    fresh, reload = opened(tab, url, title, texts, name, reload=True)
    tab.close()
    yield "fresh", fresh
    if reload is not None:
        yield "reload", reload
    tab = private.new_page()
    yield "private", opened(tab, url, title, texts, name)[0]
    tab.close()
    cold = browser.new_context(viewport=VIEWPORT)
    yield "first", opened(cold.new_page(), url, title, texts, name)[0]
    cold.close()


def measure(url: str, floor_url: str, rounds: int, idle_s: float, loads: int = 2) -> Timings:
    """Click → drawn per page over ``rounds`` rounds (the last after ``idle_s`` idle) in a
    browser profile on disk, then each page opened as a new session each way of ``LOADS``,
    ``loads`` times, each followed by the floor page opened the same way."""
    from playwright.sync_api import sync_playwright

    out = Timings()
    first = PAGES[-1]
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile_dir:
        user = pw.chromium.launch_persistent_context(
            profile_dir, executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport=VIEWPORT)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            private = browser.new_context(viewport=VIEWPORT)
            for ctx in (user, private):  # each profile has loaded both apps before
                tab = ctx.new_page()
                for u, (title, texts) in ((f"{url}/{first[0]}", first[2:]),
                                          (floor_url, FLOOR)):
                    load_to_drawn(tab, u, title, texts, 120)
                tab.close()
            page = user.new_page()
            load_to_drawn(page, f"{url}/{first[0]}", first[2], first[3], 120)  # session start
            for r in range(rounds):
                if r == rounds - 1 and idle_s:
                    time.sleep(idle_s)
                for name, href, title, texts in PAGES:
                    took, span = timed(lambda: click_to_drawn(
                        page, href, title, texts, TIMEOUT_S), name)  # noqa: B023
                    out.clicks[name].append(took)
                    out.spans[name].append(span)
            page.close()
            for _ in range(loads):
                for name, _href, title, texts in PAGES:
                    for kind, took in open_each_way(user, private, browser,
                                                    page_url(url, name), title, texts, name):
                        out.loads[kind][name].append(took)
                    for kind, took in open_each_way(user, private, browser, floor_url,
                                                    *FLOOR, "floor"):
                        out.floor[kind].append(took)
            private.close()
        finally:
            user.close()
            browser.close()
    return out


@contextlib.contextmanager
def floor_app(work: Path) -> Iterator[str]:
    """The URL of benchmarks/floor_app.py served by its own Streamlit, stopped on exit."""
    import urllib.request

    port = free_port()
    log = (work / "floor.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(REPO / "benchmarks" / "floor_app.py"),
         "--server.address", "127.0.0.1", "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the floor app did not start:\n"
                                       + (work / "floor.log").read_text()[-2000:]) from None
                time.sleep(0.3)
        yield url + "/"
    finally:
        stop_process(proc, signal.SIGTERM, 15)
        log.close()


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


def p50_max(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} / {max(xs):.2f} s" if xs else "—"


def report(store: str, t: Timings, apptest: dict[str, tuple[float, float]], load: str,
           runs: list[tuple[str, float, float, float]]) -> bool:
    goal = GOALS[store]
    script = script_times(runs)
    floor = {k: statistics.median(xs) for k, xs in t.floor.items() if xs}
    print(f"\n{store} store (load average {load}; goal click p95 ≤ {goal} s, fresh and reload "
          f"≤ {FRESH_GOAL} s; fresh: a new tab of the browser profile on disk the clicks ran "
          "in, reload: that tab reloaded, private: a new tab of a private profile (HTTP cache, "
          "no code cache), first: a new private profile, nothing cached; ×floor: the page's "
          "p50 over the bare Streamlit page's loaded the same way beside it; script: the "
          "server's run of the page, median wall / CPU)")
    print("| page | click p50 | click p95 | clicks | fresh p50 / max | reload p50 / max | "
          "private p50 / max | first p50 / max | fresh · reload · private · first ×floor | "
          "script | AppTest cold / warm |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for name, *_ in PAGES:
        c = t.clicks[name]
        loads = {k: t.loads[k][name] for k in LOADS}
        at = apptest.get(name)
        at_txt = f"{at[0] * 1000:.0f} / {at[1] * 1000:.0f} ms" if at else "—"
        sc = script.get(name)
        sc_txt = f"{sc[0] * 1000:.0f} / {sc[1] * 1000:.0f} ms" if sc else "—"
        ratios = " · ".join(f"{statistics.median(loads[k]) / floor[k]:.2f}"
                            if loads[k] and floor.get(k) else "—" for k in LOADS)
        ok &= p95(c) <= goal and all(loads[k] and max(loads[k]) <= FRESH_GOAL
                                     for k in ("fresh", "reload"))
        print(f"| {name} | {statistics.median(c):.2f} s | {p95(c):.2f} s | {len(c)} | "
              + " | ".join(p50_max(loads[k]) for k in LOADS)
              + f" | {ratios} | {sc_txt} | {at_txt} |", flush=True)
    print("| floor (bare page) | | | | " + " | ".join(p50_max(t.floor[k]) for k in LOADS)
          + " | 1 | | |")
    print("each click in order (the last round after the idle wait), browser s (the server "
          "script's ms) · fresh · reload · private · first loads:")
    for name, *_ in PAGES:
        clicks = " ".join(f"{x:.2f} ({server_share(runs, name, span) * 1000:.0f})"
                          for x, span in zip(t.clicks[name], t.spans[name], strict=True))
        print(f"  {name}: {clicks} · " + " · ".join(
            " ".join(f"{x:.2f}" for x in t.loads[k][name]) for k in LOADS))
    print("  floor: " + " · ".join(" ".join(f"{x:.2f}" for x in t.floor[k]) for k in LOADS))
    print("goal met" if ok else "goal NOT met")
    return ok


# --- the fleet store's writer: what 1,000 workers' collectors add each second ---------------

def write_forever(db: str, n_workers: int) -> None:
    from mmlens.collectors.rollup_job import RollupJob

    from mmlens.records import BlockStored, MetricSample, labels_of
    from mmlens.store.open import open_store

    store = open_store(db)
    rollups = RollupJob(store)  # the lead collector's job, on its schedule
    workers = pages_bench.worker_urls(n_workers)
    rng = random.Random(11)
    lb = labels_of({"model_name": pages_bench.MODEL, "engine": "0"})
    templates = pages_bench.template_traces()
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
        # image requests as the fill's (a run outlasting 1,000 text-only ones would leave the
        # Affinity page with no image in its window)
        live = []
        for i in range(5):
            t = copy.copy(templates[(tick * 5 + i) % len(templates)])
            t.request_id, t.ts, t.worker = f"live-{tick}-{i}", now, rng.choice(workers)
            t.cached_tokens = rng.choice([0, (t.prompt_tokens or 0) // 16 * 16])
            live.append(t)
        store.add_traces(live)
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
    ap.add_argument("--loads", type=int, default=2,
                    help="times each page is opened as a new session each way")
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
    # stopped by SIGTERM, it still stops the servers and the writer it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    ok = True
    with busy_core() if args.busy else contextlib.nullcontext():
        for kind in args.store or ["demo"]:
            with store_for(kind, keep) as (db, n_traces):
                for attempt in (1, 2):  # the demo cluster may fail to start on a busy machine
                    try:
                        with tempfile.TemporaryDirectory() as work, \
                                dashboard(db, Path(work), kind == "demo") as (url, store), \
                                floor_app(Path(work)) as floor_url:
                            timings = measure(url, floor_url, args.rounds, args.idle, args.loads)
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
