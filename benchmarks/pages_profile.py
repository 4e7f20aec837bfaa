"""Where a page's script time goes: each page rendered cold under AppTest (query caches
cleared, as on a store change) inside cProfile, on a given store; prints the script's CPU
seconds and the functions with the most cumulative time (mmlens' own, and the libraries').

    python benchmarks/pages_profile.py --db STORE [--pages overview,cache] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pages_bench import PAGES  # noqa: E402


def clear_caches() -> None:
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


def script_profiled() -> tuple[cProfile.Profile, list[tuple[float, float]]]:
    """A profiler that records the next script run (AppTest runs it on a thread of its own),
    and where that run's (wall, thread CPU) seconds are appended."""
    from streamlit.runtime.scriptrunner import script_runner

    prof, times = cProfile.Profile(), []
    original = script_runner.ScriptRunner._run_script

    def run(self, rerun_data):  # type: ignore[no-untyped-def]
        script_runner.ScriptRunner._run_script = original
        wall, cpu = time.perf_counter(), time.thread_time()
        prof.enable()
        try:
            return original(self, rerun_data)
        finally:
            prof.disable()
            times.append((time.perf_counter() - wall, time.thread_time() - cpu))

    script_runner.ScriptRunner._run_script = run
    return prof, times


def profile_page(page: str, top: int, request: str | None) -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    if page == "inspector" and request:
        at.query_params["request"] = request
    at.run()
    at.switch_page(f"pages/{page}.py")
    at.run()  # imports and tokenizers loaded once, as in a running dashboard
    clear_caches()
    prof, times = script_profiled()
    at.run()
    assert not at.exception, (page, [e.value for e in at.exception])
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("cumulative")
    stats.print_stats(top)
    wall, cpu = times[-1]
    print(f"\n=== {page}: cold script {wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU "
          f"(profiled; load average {os.getloadavg()[0]:.1f})")
    print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--pages", default=",".join(PAGES))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--request", help="the Inspector's request id (default: the newest)")
    args = ap.parse_args()
    os.environ["MMLENS_DB"] = args.db
    os.environ.pop("MMLENS_CONFIG", None)
    for page in args.pages.split(","):
        profile_page(page, args.top, args.request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
