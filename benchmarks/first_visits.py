"""A session's first visit to each page in the sidebar's order, server script only (AppTest),
on a given store with every query cache emptied first (a dashboard just started, or a store
that moved), the trace windows shared between pages (``shared.recent_traces``) or each page
reading its own (``--ab``: both, in interleaved rounds), the median per page printed.

    python benchmarks/first_visits.py --db STORE [--rounds 5] [--ab]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ORDER = ("overview", "inspector", "routing", "affinity", "cache", "lab", "targets")


def visit_all(shared_windows: bool) -> dict[str, float]:
    from mmlens.ui import shared
    from streamlit.testing.v1 import AppTest

    real = shared._from_larger_window
    if not shared_windows:
        shared._from_larger_window = lambda *_a: None  # type: ignore[assignment]
    try:
        shared.forget_store_reads()
        out = {}
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
        at.run()
        for page in ORDER:
            at.switch_page(f"pages/{page}.py")
            t = time.perf_counter()
            at.run()
            out[page] = time.perf_counter() - t
            assert not at.exception, (page, [e.value for e in at.exception])
        return out
    finally:
        shared._from_larger_window = real  # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ab", action="store_true", help="also the other way (see above)")
    args = ap.parse_args()
    os.environ["MMLENS_DB"] = args.db
    os.environ.pop("MMLENS_CONFIG", None)
    variants = (True, False) if args.ab else (True,)
    visit_all(True)  # imports, tokenizers
    times: dict[bool, dict[str, list[float]]] = {v: {p: [] for p in ORDER} for v in variants}
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    for _ in range(args.rounds):
        for v in variants:
            for page, s in visit_all(v).items():
                times[v][page].append(s)
    what = ("first visit", "windows shared", "own window")
    print(f"store {Path(args.db).name}, {args.rounds} rounds, load average {load} at the "
          "start, " + " ".join(f"{x:.1f}" for x in os.getloadavg())
          + f" at the end; {what[0]}'s script, median ms")
    print(f"| page | {what[1]} | " + (f"{what[2]} | ratio |" if args.ab else ""))
    print("|---|---|" + ("---|---|" if args.ab else ""))
    for page in ORDER:
        new = statistics.median(times[True][page]) * 1000
        row = f"| {page} | {new:.0f} |"
        if args.ab:
            old = statistics.median(times[False][page]) * 1000
            row += f" {old:.0f} | {new / old:.2f} |"
        print(row)
    total = {v: sum(statistics.median(xs) for xs in times[v].values()) * 1000 for v in variants}
    print("| all | " + " | ".join(f"{total[v]:.0f}" for v in variants) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
