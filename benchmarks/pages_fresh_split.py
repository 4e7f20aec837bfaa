"""Where a fresh load's time goes, per page and beside the bare Streamlit page (the floor).

Each page is opened in a new tab of a browser profile kept on disk (pages_browser.py's
"fresh"), then the floor page the same way, ``--loads`` times in turns. For each load the tab
notes (a script run before any of the page's): the page HTML's arrival, DOMContentLoaded,
the websocket open, its first and last message before drawn, when Streamlit's script state
last turned from running, and drawn (tests/pages/browser_timing.py); the JavaScript files the
tab fetched (HTTP or memory cache) before the websocket opened and after; its main thread's
task and script seconds (CDP Performance metrics); and the server's script seconds of that
page run (``$MMLENS_PAGE_TIMES``). Medians are printed per page, in milliseconds from the
navigation's start.

    python benchmarks/pages_fresh_split.py [--loads 3] [--pages routing,inspector] [--db STORE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pages_browser import (  # noqa: E402
    CHROMIUM,
    FLAGS,
    FLOOR,
    VIEWPORT,
    dashboard,
    floor_app,
    load_average,
    page_url,
    script_runs,
)
from benchmarks.pages_browser_cpu import by_file  # noqa: E402
from tests.pages.browser_timing import PAGES, load_to_drawn  # noqa: E402

MARKS_JS = """(() => {
  const m = window.__mmMarks = {ws: null, first: null, last: null, msgs: 0, bytes: 0,
                                idle: null};
  const Native = window.WebSocket;
  class Noted extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("open", () => { m.ws = m.ws ?? performance.now(); });
      this.addEventListener("message", e => {
        const now = performance.now();
        m.first = m.first ?? now; m.last = now; m.msgs += 1;
        m.bytes += e.data.byteLength ?? e.data.size ?? e.data.length ?? 0;
      });
    }
  }
  window.WebSocket = Noted;
  let running = false;
  const watch = () => {
    const app = document.querySelector("[data-testid='stApp']");
    const now = app && app.getAttribute("data-test-script-state") === "running";
    if (running && !now) m.idle = performance.now();
    running = now;
    requestAnimationFrame(watch);
  };
  requestAnimationFrame(watch);
})();"""

READ_JS = """() => {
  const m = window.__mmMarks || {};
  const nav = performance.getEntriesByType("navigation")[0];
  const js = performance.getEntriesByType("resource").filter(r => /\\.js$/.test(r.name));
  const before = js.filter(r => m.ws === null || r.startTime < m.ws);
  return {html: nav.responseEnd, dcl: nav.domContentLoadedEventEnd, ws: m.ws,
          first: m.first, last: m.last, msgs: m.msgs, kb: m.bytes / 1024, idle: m.idle,
          drawn: performance.now(), js_before: before.length, js_after: js.length - before.length,
          js_after_ms: js.filter(r => !before.includes(r))
                         .reduce((s, r) => Math.max(s, r.responseEnd), 0)};
}"""

TOP_FILES = 12
COLUMNS = ("html", "dcl", "ws", "first", "idle", "last", "drawn")


def main_thread(cdp: Any) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def one_load(ctx: Any, url: str, title: str, texts: tuple[str, ...],
             profile: bool = False) -> dict[str, Any]:
    tab = ctx.new_page()
    cdp = ctx.new_cdp_session(tab)
    cdp.send("Performance.enable")
    if profile:
        cdp.send("Profiler.enable")
        cdp.send("Profiler.setSamplingInterval", {"interval": 500})
        cdp.send("Profiler.start")
    try:
        wall = load_to_drawn(tab, url, title, texts, 90)
        out = tab.evaluate(READ_JS)
        if profile:
            out["files"] = by_file(cdp.send("Profiler.stop")["profile"])
        m = main_thread(cdp)
        out.update(wall=wall * 1000, tasks=m.get("TaskDuration", 0.0) * 1000,
                   script=m.get("ScriptDuration", 0.0) * 1000, end=time.time())
        return out
    finally:
        tab.close()


def med(rows: list[dict[str, Any]], key: str) -> str:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return f"{statistics.median(xs):.0f}" if xs else "—"


def main() -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--pages", help="comma-separated page names (default: all)")
    ap.add_argument("--db", help="a store to show instead of the demo's (no collectors)")
    ap.add_argument("--profile", action="store_true",
                    help="also sample the main thread (CDP) and print ms per script file")
    args = ap.parse_args()
    wanted = [p for p in PAGES if not args.pages or p[0] in args.pages.split(",")]
    rows: dict[str, list[dict[str, Any]]] = {p[0]: [] for p in wanted}
    rows["floor"] = []
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as profile, \
            dashboard(args.db, Path(work), args.db is None) as (url, _), \
            floor_app(Path(work)) as floor_url, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=FLAGS, headless=True, viewport=VIEWPORT)
        ctx.add_init_script(MARKS_JS)
        try:
            for _ in range(2):  # each page's chunks in the HTTP cache, then V8's code cache
                for name, _href, title, texts in wanted:
                    one_load(ctx, page_url(url, name), title, texts)
                one_load(ctx, floor_url, *FLOOR)
            load = load_average()
            for _ in range(args.loads):
                for name, _href, title, texts in wanted:
                    start = time.time()
                    rows[name].append({**one_load(ctx, page_url(url, name), title, texts,
                                                  args.profile), "start": start})
                    rows["floor"].append(one_load(ctx, floor_url, *FLOOR, args.profile))
        finally:
            ctx.close()
        runs = script_runs(Path(work))
    for name, _href, _title, _texts in wanted:
        for r in rows[name]:
            r["server"] = sum(w for p, ts, w, _ in runs
                              if p == name and r["start"] <= ts <= r["end"]) * 1000
    print(f"fresh tabs of the on-disk profile, {args.loads} each in turns with the floor; "
          f"load average {load} at the start, {load_average()} at the end; medians, ms from "
          "the navigation's start (idle: the script state's last turn from running)")
    print("| page | " + " | ".join(COLUMNS) + " | wall | main-thread tasks / script | "
          "server script | ws msgs / kB | JS before ws / after |")
    print("|---" * (len(COLUMNS) + 6) + "|")
    for name in [*(p[0] for p in wanted), "floor"]:
        rs = rows[name]
        print(f"| {name} | " + " | ".join(med(rs, k) for k in COLUMNS)
              + f" | {med(rs, 'wall')} | {med(rs, 'tasks')} / {med(rs, 'script')} | "
              f"{med(rs, 'server') if name != 'floor' else '—'} | {med(rs, 'msgs')} / "
              f"{med(rs, 'kb')} | {med(rs, 'js_before')} / {med(rs, 'js_after')} |")
    if args.profile:
        print(f"main-thread samples per script file, median ms (top {TOP_FILES})")
        for name in [*(p[0] for p in wanted), "floor"]:
            files = [r["files"] for r in rows[name]]
            keys = {k for f in files for k in f}
            per = {k: statistics.median(f.get(k, 0.0) for f in files) for k in keys}
            top = sorted(per.items(), key=lambda kv: -kv[1])[:TOP_FILES]
            print(f"  {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
