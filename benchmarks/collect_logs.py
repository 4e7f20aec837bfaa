"""`mmlens collect` following an SMG debug log as a user runs it (prints figures; not a unit
test): the real CLI in its own process on core 0, a log file another process appends to, and
the collector's own health row and store read from outside.

Usage: python benchmarks/collect_logs.py [--requests N] [--rate R] [--seconds T]
    [--interval S] [--json]

The corpus is the real SMG 1.13 capture (tests/fixtures/captures/) replayed under fresh
request and trace ids (``observed_ingest.log_lines``). Two runs, each on a fresh store:

- backlog: N requests' lines appended at once to the followed file; the collector's CPU
  seconds (utime + stime of its process, every thread) and wall seconds from the append until
  its health row counts every decision, and the decisions its store then holds. Beside it,
  in this process, the parse-and-store loop alone (``read_lines`` into a ``Store``, what
  ``observed_ingest.py`` times) on the same lines: the ratio is what the collector around it
  costs.
- sustained: lines appended at R requests/s for T s in 0.1 s slices; the collector's unread
  backlog (its health row's ``backlog_bytes``) sampled each second, the most it reached, how
  long after the last append every decision was counted, and its CPU over that whole time
  (the verdict and availability jobs judging the requests included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from mmlens.collectors.observed_sink import ObservedSink
from observed_ingest import log_lines, store_lines

from mmlens.cli.gc_tuning import tune_gc
from mmlens.ingest.observed_logs import read_lines
from mmlens.store.sqlite import Store

ROOT = Path(__file__).resolve().parents[1]
CLK = os.sysconf("SC_CLK_TCK")


def stamper(sample: str):
    """A function putting a time into the capture's lines: SMG's whole-second ``timestamp``
    and the cache trace's ``dispatch_timestamp_ns`` (the capture is from one second), so the
    collector reads a live log, not one a week old (its verdicts would take every line for
    a late one)."""
    m = re.search(r'"timestamp":"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"', sample)
    assert m is not None, "no SMG timestamp in the capture"
    at = m.group(1)
    secs = str(int(datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp()))
    ts_from, ns_from = f'"timestamp":"{at}"', f'dispatch_timestamp_ns\\":{secs}'
    assert sample.count(ts_from) == sample.count('"timestamp":"') and ns_from in sample

    def stamp(text: str, now: float) -> str:
        wall = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
        return text.replace(ts_from, f'"timestamp":"{wall}"').replace(
            ns_from, f'dispatch_timestamp_ns\\":{int(now)}')
    return stamp


def config(tmp: Path, log: Path, interval: float) -> Path:
    # The store's bounds out of the way (pruning is not what is measured); the router's
    # address answers nothing (its /workers poll fails fast, as with a router down).
    path = tmp / "mmlens.toml"
    path.write_text(f'interval_s = {interval}\n[store]\nretention_s = 1e9\nmax_mb = 1e6\n'
                    f'[[router]]\nname = "smg"\nkind = "smg"\nurl = "http://127.0.0.1:9"\n'
                    f'log_file = "{log}"\n')
    return path


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def counters(db: Path) -> dict | None:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            row = con.execute("SELECT counters FROM health WHERE collector = 'router_logs'"
                              ).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return json.loads(row[0]) if row else None


def stored_decisions(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT coalesce(sum(json_array_length(body)), 0) "
                               "FROM decisions").fetchone()[0])
    finally:
        con.close()


class Collector:
    """``mmlens collect`` on a fresh store following ``log`` (empty until the run appends)."""

    def __init__(self, tmp: Path, interval: float) -> None:
        self.log, self.db = tmp / "smg.log", tmp / "store.db"
        self.log.touch()
        cmd = [sys.executable, "-c", "import sys; from mmlens.cli import main; sys.exit(main())",
               "collect", "--config",
               str(config(tmp, self.log, interval)), "--db", str(self.db)]
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", "0", *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=open(tmp / "collect.err", "w"))
        deadline = time.monotonic() + 60
        while counters(self.db) is None:  # its first tick wrote its health rows
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mmlens collect did not start: "
                                   + (tmp / "collect.err").read_text()[-2000:])
            time.sleep(0.1)

    def wait_counted(self, decisions: int, timeout: float) -> float:
        """Monotonic time at which its health row counted ``decisions``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = counters(self.db)
            if c and c.get("decisions", 0) >= decisions and not c.get("backlog_bytes"):
                return time.monotonic()
            time.sleep(0.05)
        raise RuntimeError(f"the collector did not count {decisions} decisions in {timeout} s: "
                           f"{counters(self.db)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def in_process(lines: list[str], tmp: Path) -> tuple[int, float]:
    """(decisions, CPU seconds) of the parse-and-store loop alone (``observed_ingest``'s)."""
    store = Store(tmp / "floor.db")
    sink = ObservedSink(store.add_traces, store.add_decisions, hold_s=0.0)
    tune_gc()
    t0 = time.process_time()
    n, _ = store_lines(lines, store, sink)
    s = time.process_time() - t0
    store.close()
    return n, s


def backlog_run(requests: int, interval: float) -> dict:
    chunks = [c for _, c in log_lines("smg_1.13", max(1, requests // 5))]
    stamp = stamper("\n".join(chunks[0]))
    text = stamp("".join(line + "\n" for c in chunks for line in c), time.time())
    lines = text.splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        expected, floor_s = in_process(lines, Path(tmp))
        col = Collector(Path(tmp), interval)
        try:
            c0, w0 = cpu_s(col.proc.pid), time.monotonic()
            with open(col.log, "a") as fh:
                fh.write(text)
            w1 = col.wait_counted(expected, timeout=600)
            c1 = cpu_s(col.proc.pid)
            stored = stored_decisions(col.db)
        finally:
            col.stop()
    return {"requests": len(chunks) * 5, "lines": len(lines), "mb": len(text) / 1e6,
            "decisions": expected, "stored": stored, "cpu_s": c1 - c0, "wall_s": w1 - w0,
            "floor_s": floor_s, "interval_s": interval}


def sustained_run(rate: float, seconds: float, interval: float) -> dict:
    copies = max(1, int(rate * seconds / 5))
    per_copy = ["".join(line + "\n" for line in c) for _, c in log_lines("smg_1.13", copies)]
    stamp = stamper(per_copy[0])
    with tempfile.TemporaryDirectory() as tmp:
        expected = sum(len(read_lines(c.splitlines())[0]) for c in per_copy)
        col = Collector(Path(tmp), interval)
        samples: list[int] = []
        try:
            c0, start = cpu_s(col.proc.pid), time.monotonic()
            slice_s, written, next_sample = 0.1, 0, start + 1.0
            with open(col.log, "a") as fh:
                while written < len(per_copy):
                    due = min(len(per_copy), int((time.monotonic() - start) * rate / 5) + 1)
                    if due > written:
                        fh.write(stamp("".join(per_copy[written:due]), time.time()))
                        fh.flush()
                        written = due
                    now = time.monotonic()
                    if now >= next_sample:
                        samples.append(int((counters(col.db) or {}).get("backlog_bytes", 0)))
                        next_sample += 1.0
                    time.sleep(max(0.0, slice_s - (time.monotonic() - now)))
            wrote_s = time.monotonic() - start
            done = col.wait_counted(expected, timeout=600)
            cpu = cpu_s(col.proc.pid) - c0
            stored = stored_decisions(col.db)
        finally:
            col.stop()
    return {"rate": rate, "requests": len(per_copy) * 5, "seconds": wrote_s,
            "decisions": expected, "stored": stored, "max_backlog_mb": max(samples or [0]) / 1e6,
            "drain_s": done - start - wrote_s, "cpu_s": cpu, "interval_s": interval}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20_000, help="backlog run's requests")
    ap.add_argument("--rate", type=float, default=2_000, help="sustained run's requests/s")
    ap.add_argument("--seconds", type=float, default=20, help="sustained run's length")
    ap.add_argument("--interval", type=float, default=5.0,
                    help="the collector's interval_s (mmlens' default: 5)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) > 1 or (os.cpu_count() or 1) > 1:
        # This process (the writer) off the collector's core where there is another.
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))
    b = backlog_run(args.requests, args.interval)
    rate, floor = b["decisions"] / b["cpu_s"], b["decisions"] / b["floor_s"]
    print(f"backlog: {b['requests']} requests ({b['lines']} lines, {b['mb']:.0f} MB) appended "
          f"at once; `mmlens collect` (interval {b['interval_s']:g} s) counted "
          f"{b['decisions']} decisions in {b['wall_s']:.2f} s wall, {b['cpu_s']:.2f} CPU-s → "
          f"{rate:,.0f} decisions/CPU-s, {b['decisions'] / b['wall_s']:,.0f}/s wall; store "
          f"holds {b['stored']}; the parse-and-store loop alone {floor:,.0f} decisions/CPU-s "
          f"(ratio {rate / floor:.2f}x)")
    s = sustained_run(args.rate, args.seconds, args.interval)
    print(f"sustained: {s['rate']:,.0f} requests/s for {s['seconds']:.1f} s "
          f"({s['requests']} requests, {s['decisions']} decisions); most unread "
          f"{s['max_backlog_mb']:.1f} MB; every decision counted {s['drain_s']:.2f} s after "
          f"the last append; store holds {s['stored']}; collector {s['cpu_s']:.1f} CPU-s "
          f"({s['cpu_s'] / (s['seconds'] + s['drain_s']):.0%} of a core from the first "
          "append to the last decision counted)")
    if args.json:
        print(json.dumps({"collect_logs": {"backlog": b, "sustained": s}}))


if __name__ == "__main__":
    main()
