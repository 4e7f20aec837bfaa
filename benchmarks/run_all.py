"""Every performance target of the README in one fresh run, each benchmark beside its peer or
floor, printed as the README's performance table (prints figures; not a unit test).

Usage: python benchmarks/run_all.py [--quick] [--skip tap,kv,...]

Each benchmark runs in a process of its own pinned to core 0 (``taskset -c 0`` when there is
one) and ends with one JSON line of figures, read here; ``benchmarks/tap_bench.py`` (no JSON
line) is run in a short mode and its summary lines quoted under the table. ``--quick`` runs
smaller inputs (a smoke run: its figures are not the README's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

FULL = {
    "kv": ["kv_ingest.py", "--memory", "0"],
    "memory": ["kv_ingest.py", "--batches", "0", "--store", "none"],
    "availability": ["availability.py", "--requests", "0"],
    "logs": ["observed_ingest.py", "--routers", "smg_1.13"],
    "collect": ["collect_logs.py"],
    "layout": ["layout_cli.py"],
    "tap": ["tap_bench.py", "--sizes", "64,1024", "--overhead", "1000", "--requests", "3000"],
    "whatif": ["whatif_bench.py"],
}
QUICK = {
    "kv": ["kv_ingest.py", "--memory", "0", "--batches", "3000", "--resident", "40000",
           "--store", "sqlite"],
    "memory": ["kv_ingest.py", "--batches", "0", "--store", "none", "--memory", "100000"],
    "availability": ["availability.py", "--requests", "0", "--resident", "5000",
                     "--distinct", "40", "--workers", "16"],
    "logs": ["observed_ingest.py", "--routers", "smg_1.13", "--requests", "500"],
    "collect": ["collect_logs.py", "--requests", "1000", "--rate", "200", "--seconds", "3"],
    "layout": ["layout_cli.py", "--runs", "1"],
    "tap": ["tap_bench.py", "--sizes", "64", "--overhead", "50", "--requests", "300"],
    "whatif": ["whatif_bench.py", "--quick"],
}


@dataclass
class Row:
    path: str
    mmlens: str
    peer: str
    ratio: str
    goal: str
    met: bool | None


def run_one(args: list[str]) -> tuple[dict, str]:
    """(the JSON line's figures, the whole output) of one benchmark."""
    cmd = [sys.executable, str(HERE / args[0]), *args[1:]]
    if args[0] != "tap_bench.py":
        cmd.append("--json")
        # The tap and collect benchmarks pin their own processes.
        if shutil.which("taskset") and args[0] != "collect_logs.py":
            cmd = ["taskset", "-c", "0", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    out = done.stdout
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    figures: dict = {}
    for line in out.splitlines():
        if line.startswith("{"):
            figures.update(json.loads(line))
    return figures, out


def kv_rows(f: dict) -> list[Row]:
    kv = f["kv"]
    ing = kv["ingest"]
    rows = [Row(f"KV ingest (`KVIngest`), {ing['resident'] / 1000:.0f}k-block resident index",
                f"{ing['ingest_mblocks']:.2f} M blocks/CPU-s",
                f"msgspec decode {ing['decode_mblocks']:.2f} M",
                f"{ing['ingest_mblocks'] / ing['decode_mblocks']:.2f}×", "≥ 1.5 M",
                ing["ingest_mblocks"] >= 1.5)]
    for backend, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL, default "
                                                   "durability")):
        if backend in kv:
            s = kv[backend]
            rows.append(Row(f"KV collector path + store ({label})",
                            f"{s['collector_mblocks']:.2f} M blocks/CPU-s"
                            + (f" (+ server {s['server_cpu_s']:.1f} CPU-s)"
                               if backend == "postgresql" else ""),
                            f"minimal recorder {s['recorder_mblocks']:.2f} M",
                            f"{s['collector_mblocks'] / s['recorder_mblocks']:.2f}×",
                            "≥ 0.8 M", s["collector_mblocks"] >= 0.8))
    return rows


def memory_rows(f: dict) -> list[Row]:
    mb = f["kv"]["memory"]["rss_mb_per_mblocks"]
    return [Row("KV resident index RSS per million resident blocks", f"{mb:.0f} MB", "—", "—",
                "≤ 200 MB", mb <= 200)]


def availability_rows(f: dict) -> list[Row]:
    a = f["availability"]
    return [Row(f"availability per distinct request ({a['distinct']}), {a['workers']} "
                f"workers × {a['resident'] / 1000:.0f}k blocks",
                f"{a['median_ms']:.2f} ms (p95 {a['p95_ms']:.2f})",
                f"bare scan of the workers' key sets {a['floor_ms']:.2f} ms",
                f"{a['median_ms'] / a['floor_ms']:.2f}×", "≤ 1 ms", a["median_ms"] <= 1.0)]


def log_rows(f: dict) -> list[Row]:
    r = f["observed"]["smg_1.13"]
    rate = r["log_decisions"] / r["log_s"]
    return [Row("SMG router-log ingest (to rows in SQLite)",
                f"{rate:,.0f} decisions/s ({r['lines'] / r['log_s']:,.0f} lines/s)",
                f"msgspec decode {r['lines'] / r['decode_s']:,.0f} lines/s",
                f"{r['decode_s'] / r['log_s']:.2f}× (lines)", "≥ 50k decisions/s",
                rate >= 50_000)]


def collect_rows(f: dict) -> list[Row]:
    b, s = f["collect_logs"]["backlog"], f["collect_logs"]["sustained"]
    rate, floor = b["decisions"] / b["cpu_s"], b["decisions"] / b["floor_s"]
    return [Row(f"`mmlens collect` following an SMG log, {b['requests'] / 1000:.0f}k requests "
                "appended at once (the whole process)",
                f"{rate:,.0f} decisions/CPU-s ({b['decisions'] / b['wall_s']:,.0f}/s wall, "
                f"interval {b['interval_s']:g} s); {b['stored']:,} of {b['decisions']:,} "
                "stored",
                f"the parse-and-store loop alone {floor:,.0f}", f"{rate / floor:.2f}×",
                "every decision stored", b["stored"] == b["decisions"]),
            Row(f"`mmlens collect` at {s['rate']:,.0f} SMG requests/s for {s['seconds']:.0f} s",
                f"{s['cpu_s'] / (s['seconds'] + s['drain_s']):.0%} of a core; most unread "
                f"{s['max_backlog_mb']:.1f} MB; caught up {s['drain_s']:.1f} s after the "
                f"last line; {s['stored']:,} of {s['decisions']:,} stored", "—", "—",
                "keeps up: caught up within one interval, every decision stored",
                s["stored"] == s["decisions"] and s["drain_s"] <= s["interval_s"])]


def layout_rows(f: dict) -> list[Row]:
    med = f["layout_cli"]["median_s"]
    cpu = f["layout_cli"]["median_cpu_s"]
    quiet = not f["layout_cli"]["stderr"]
    peer = "qwen3-vl family name"
    return [Row(f"`mmlens layout --model DIR --image 640x480`, {name} (whole CLI call)",
                f"{cpu[name]:.2f} CPU-s ({med[name]:.2f} s wall)"
                + ("" if quiet else " (stderr not empty)"),
                f"`--model qwen3-vl` {cpu[peer]:.2f} CPU-s", f"{cpu[name] / cpu[peer]:.2f}×",
                "≤ 1 s, nothing on stderr", cpu[name] <= 1.0 and quiet)
            for name in ("qwen3-vl dir", "kimi-k3 dir")]


def whatif_rows(f: dict) -> list[Row]:
    w = f["whatif"]
    floor = w["floor_s"]
    return [Row(f"`mmlens whatif` replay, {w['requests'] / 1000:.0f}k requests over "
                f"{w['workers']} workers × {w['capacity'] / 1000:.0f}k blocks: {name}",
                f"{s['cpu_s']:.1f} CPU-s", f"bare loop over the block keys {floor:.2f} s",
                f"{s['cpu_s'] / floor:.0f}×", "≤ 10 s per scenario", s["cpu_s"] <= 10.0)
            for name, s in w["scenarios"].items()]


TABLES: dict[str, Callable[[dict], list[Row]]] = {
    "kv": kv_rows, "memory": memory_rows, "availability": availability_rows,
    "logs": log_rows, "collect": collect_rows, "layout": layout_rows, "whatif": whatif_rows}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: list[Row]) -> str:
    out = ["| path | mmlens | peer / floor (same run) | ratio | goal | met |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        met = "—" if r.met is None else ("yes" if r.met else "no")
        out.append(f"| {r.path} | {r.mmlens} | {r.peer} | {r.ratio} | {r.goal} | {met} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small inputs: a smoke run")
    ap.add_argument("--skip", default="", help="comma-separated: kv,memory,availability,"
                                               "logs,collect,layout,tap,whatif")
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    skip = set(filter(None, args.skip.split(",")))
    load0 = os.getloadavg()
    started = time.time()
    rows: list[Row] = []
    quoted: list[str] = []
    for name, bench in plan.items():
        if name in skip:
            continue
        print(f"running {' '.join(bench)} ...", file=sys.stderr, flush=True)
        figures, out = run_one(bench)
        if name == "tap":
            quoted = [line for line in out.splitlines() if line.strip()][-12:]
        else:
            rows.extend(TABLES[name](figures))
    load1 = os.getloadavg()
    print(f"Machine: {machine()}; load average (1 min) {load0[0]:.1f} at the start, "
          f"{load1[0]:.1f} at the end; {time.time() - started:.0f} s"
          + (" (--quick: smoke-run inputs)" if args.quick else ""))
    print()
    print(table(rows))
    if quoted:
        print()
        print("`benchmarks/tap_bench.py` (" + " ".join(plan["tap"][1:]) + "):")
        print()
        print("\n".join(f"    {line}" for line in quoted))


if __name__ == "__main__":
    main()
