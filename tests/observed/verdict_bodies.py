"""Every verdict's whole body, to tell whether a change to the judgement changed any: kept
runs re-judged offline (``rejudge``: a copy of each store) and the judge benchmark's busy
workload judged in batches, each verdict dumped as sorted-key JSON without ``judged_at``.
Two dumps of the same inputs compare byte for byte (``cmp``).

Usage: python -m tests.observed.verdict_bodies OUT RUN_DIR [RUN_DIR ...] [--store logs+kv]
    [--requests 20000] [--batch 512]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from benchmarks.judge_bench import judge_all
from tests.busy_workers import workload
from tests.observed.rejudge import rejudge


def _line(body: dict) -> str:
    body.pop("judged_at", None)
    return json.dumps(body, sort_keys=True)


def bodies(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT body FROM verdicts ORDER BY request_id").fetchall()
    finally:
        con.close()
    return [_line(json.loads(body)) for (body,) in rows]


def bench_bodies(requests: int, batch: int) -> list[str]:
    w = workload(requests, 2, t0=1_700_000_000.0)
    _, verdicts = judge_all(w.traces, w.rows, batch)
    return [_line(v.as_json()) for v in verdicts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("runs", nargs="*", type=Path)
    p.add_argument("--store", default="logs+kv")
    p.add_argument("--requests", type=int, default=20_000, help="0: no benchmark workload")
    p.add_argument("--batch", type=int, default=512)
    args = p.parse_args(argv)
    with args.out.open("w") as out:
        for run in args.runs:
            lines = rejudge(run / f"{args.store}.db", read=bodies)
            out.write(f"# {run.parent.name}/{run.name} {len(lines)}\n")
            out.writelines(line + "\n" for line in lines)
            print(f"{run.parent.name}/{run.name}: {len(lines)} verdicts")
        if args.requests:
            lines = bench_bodies(args.requests, args.batch)
            out.write(f"# bench {args.requests} {len(lines)}\n")
            out.writelines(line + "\n" for line in lines)
            print(f"bench: {len(lines)} verdicts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
