"""The fuzz suite's nightly-style run, one parser (one test of tests/fuzz) at a time: fresh random
examples in chunks (``MMLENS_FUZZ_EXAMPLES=chunk MMLENS_FUZZ_RANDOM=1``) until each has been
given ``--target`` inputs, counting what Hypothesis says it ran (passing + invalid) and the
CPU-seconds it took. Chunks rather than one long run so that what a long night managed is
counted even when it is stopped, and a failing chunk names its falsifying example at once.

Usage: python benchmarks/fuzz_inputs.py [--target 100000] [--chunk 10000] [--only kv,tap]
       [--out fuzz_inputs.json] [--budget-s 0]

Appends one JSON line per chunk to ``--out`` (the running totals are re-read from it, so a
second run continues the first) and prints the table of inputs tried per parser at the end.
Each round gives every unfinished parser one chunk (in ``--only``'s order when given);
``--budget-s`` stops starting new chunks after that many seconds (0: no limit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATS = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")
# The share of a phase's inputs a test noted as refused or set aside by its parser
# (``tests.fuzz.strategies.QUARANTINED``).
QUARANTINED = re.compile(r"([\d.]+)%, quarantined")


def quarantined(stdout: str) -> int | None:
    """Inputs of the generate phase the parser refused or set aside (from the share Hypothesis
    prints, so to within 0.005 % of the phase); None when the test notes none."""
    phase = stdout.split("during generate phase", 1)[-1].split("during ", 1)[0]
    found, stats = QUARANTINED.search(phase), STATS.search(phase)
    if found is None or stats is None:
        return None
    return round(float(found.group(1)) / 100 * int(stats.group(1)))


def parsers() -> list[str]:
    """Every fuzz test's node id, as pytest collects them."""
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/fuzz", "-q", "--co",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [ln.strip() for ln in out.splitlines() if "::" in ln]


def short(node: str) -> str:
    return node.split("::", 1)[1]


def run_chunk(node: str, examples: int) -> dict[str, object]:
    env = {**os.environ, "MMLENS_FUZZ_EXAMPLES": str(examples), "MMLENS_FUZZ_RANDOM": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider",
                           "--hypothesis-show-statistics", "-x"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = STATS.findall(proc.stdout)
    passing, failing, invalid = (sum(int(f[i]) for f in found) for i in range(3))
    row: dict[str, object] = {
        "parser": short(node), "asked": examples, "passing": passing, "invalid": invalid,
        "failing": failing, "quarantined": quarantined(proc.stdout), "rc": proc.returncode,
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "wall_s": round(time.monotonic() - started, 1), "load": round(os.getloadavg()[0], 1)}
    if proc.returncode != 0:
        row["output"] = (proc.stdout + proc.stderr)[-6000:]
    return row


def totals(rows: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        t = out.setdefault(row["parser"], {"inputs": 0, "passing": 0, "failing_chunks": 0,
                                           "cpu_s": 0.0, "chunks": 0, "quarantined": 0,
                                           "counted": 0})
        if row.get("quarantined") is not None:  # of the inputs of chunks that noted it
            t["quarantined"] += row["quarantined"]
            t["counted"] += row["passing"]
        t["inputs"] += row["passing"] + row["invalid"]
        t["passing"] += row["passing"]
        t["failing_chunks"] += row["rc"] != 0
        t["cpu_s"] += row["cpu_s"]
        t["chunks"] += 1
    return out


def finished(done: dict[str, dict[str, float]], node: str, target: int) -> bool:
    got = done.get(short(node))
    return got is not None and (got["passing"] >= target or bool(got["failing_chunks"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=10_000)
    ap.add_argument("--only", default="", help="comma-separated parts of test names")
    ap.add_argument("--out", type=Path, default=Path("fuzz_inputs.json"))
    ap.add_argument("--budget-s", type=float, default=0.0)
    args = ap.parse_args()
    rows = [json.loads(ln) for ln in args.out.read_text().splitlines()] if args.out.exists() \
        else []
    nodes = [n for n in parsers()
             if not args.only or any(part in n for part in args.only.split(","))]
    if args.only:  # in the order asked for
        nodes.sort(key=lambda n: next(i for i, part in enumerate(args.only.split(","))
                                      if part in n))
    started = time.monotonic()
    while True:  # one chunk of each parser a round, so a budget cut shares out evenly
        todo = [n for n in nodes if not finished(totals(rows), n, args.target)]
        if not todo or (args.budget_s and time.monotonic() - started > args.budget_s):
            break
        for node in todo:
            done = totals(rows).get(short(node), {"passing": 0})
            row = run_chunk(node, min(args.chunk, args.target - int(done["passing"])))
            rows.append(row)
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "output"}), flush=True)
            if args.budget_s and time.monotonic() - started > args.budget_s:
                break
    print("\n| parser | inputs tried | of which passing | failing chunks | quarantined "
          "(of inputs counted) | CPU s |\n|---|---:|---:|---:|---:|---:|")
    for name, t in totals(rows).items():
        q = (f"{int(t['quarantined']):,} of {int(t['counted']):,}" if t["counted"]
             else "not noted")
        print(f"| {name} | {int(t['inputs']):,} | {int(t['passing']):,} | "
              f"{int(t['failing_chunks'])} | {q} | {t['cpu_s']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
