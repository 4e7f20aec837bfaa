"""Where a page's browser time goes: the tab's main-thread CPU per click and per fresh load,
by script file (Chromium's sampling profiler over CDP), on the demo store or a given one.

pages_browser.py times click → drawn on the wall clock, which on a shared, loaded machine
moves with everything else running; the CPU the tab's main thread spent, and which script
spent it (Plotly's chunk, React, Streamlit's own), moves far less. Clicks through every page
for ``--rounds`` rounds in one tab (the first round's are printed too: a session's first
chart page evaluates Plotly's chunk), then each page opened in a new tab ``--fresh`` times.

    python benchmarks/pages_browser_cpu.py [--rounds 3] [--fresh 2] [--pages cache,affinity]
        [--db STORE]  (a store pages_browser.py built, e.g. its 100k-request one; no collectors)
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pages_browser import (  # noqa: E402
    CHROMIUM,
    FLAGS,
    VIEWPORT,
    dashboard,
    load_average,
    page_url,
)
from tests.pages.browser_timing import PAGES, click_to_drawn, load_to_drawn  # noqa: E402

METRICS = ("TaskDuration", "ScriptDuration", "LayoutDuration")
TOP_FILES = 4


def metrics(cdp: Any) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def by_file(profile: dict[str, Any]) -> collections.Counter[str]:
    """Milliseconds of samples per script file (native work under its own name)."""
    nodes = {n["id"]: n["callFrame"] for n in profile["nodes"]}
    out: collections.Counter[str] = collections.Counter()
    for node, us in zip(profile["samples"], profile["timeDeltas"], strict=True):
        frame = nodes[node]
        name = frame["url"].rsplit("/", 1)[-1].split(".")[0] or frame["functionName"]
        out[name] += us / 1000
    return out


def profiled(cdp: Any, step: Any) -> tuple[float, dict[str, float], collections.Counter[str]]:
    """(wall s, main-thread metrics' deltas, ms per script file) of one step."""
    before = metrics(cdp)
    cdp.send("Profiler.start")
    took = float(step())
    files = by_file(cdp.send("Profiler.stop")["profile"])
    after = metrics(cdp)
    return took, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}, files


def line(name: str, what: str, result: tuple[float, dict[str, float],
                                             collections.Counter[str]]) -> str:
    took, m, files = result
    top = ", ".join(f"{f} {ms:.0f}" for f, ms in files.most_common(TOP_FILES + 2)
                    if f not in ("(idle)", "(program)"))
    return (f"| {name} | {what} | {took:.2f} s | {m['TaskDuration'] * 1000:.0f} ms | "
            f"{m['ScriptDuration'] * 1000:.0f} ms | {files.get('PlotlyChart', 0.0):.0f} ms | "
            f"{top} |")


def start_cdp(ctx: Any, tab: Any) -> Any:
    cdp = ctx.new_cdp_session(tab)
    cdp.send("Performance.enable")
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 500})
    return cdp


def main() -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=2)
    ap.add_argument("--pages", help="comma-separated page names (default: all)")
    ap.add_argument("--db", help="a store to show instead of the demo's")
    args = ap.parse_args()
    wanted = set(args.pages.split(",")) if args.pages else {p[0] for p in PAGES}
    with tempfile.TemporaryDirectory() as work, dashboard(
            args.db, Path(work), args.db is None) as (url, _):
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            ctx = browser.new_context(viewport=VIEWPORT)
            tab = ctx.new_page()
            first = PAGES[-1]
            load_to_drawn(tab, page_url(url, first[0]), first[2], first[3], 120)
            cdp = start_cdp(ctx, tab)
            rows = []
            for r in range(args.rounds):
                for name, href, title, texts in PAGES:
                    result = profiled(cdp, lambda: click_to_drawn(
                        tab, href, title, texts, 90))  # noqa: B023
                    if name in wanted:
                        rows.append(line(name, f"click {r + 1}", result))
            tab.close()
            for r in range(args.fresh):
                for name, _href, title, texts in PAGES:
                    if name not in wanted:
                        continue
                    fresh = ctx.new_page()
                    result = profiled(start_cdp(ctx, fresh), lambda: load_to_drawn(
                        fresh, page_url(url, name), title, texts, 90))  # noqa: B023
                    rows.append(line(name, f"fresh {r + 1}", result))
                    fresh.close()
            browser.close()
    print(f"{'demo store' if args.db is None else 'store ' + Path(args.db).name}, load average "
          f"{load_average()} at the end; the tab's main thread "
          "(CDP Performance metrics and sampling profile)")
    print("| page | step | wall | all tasks | script | Plotly's chunk | top scripts (ms) |")
    print("|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda x: [p[0] for p in PAGES].index(x.split(" | ")[0][2:])):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
