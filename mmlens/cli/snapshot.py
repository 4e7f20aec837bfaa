"""``mmlens snapshot``: print the current normalized state of a store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mmlens.analysis.verdicts import judge_all, summary
from mmlens.store.snapshot import build_snapshot
from mmlens.store.sqlite import Store, StoreError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mmlens snapshot", description=__doc__)
    ap.add_argument("--db", required=True)
    ap.add_argument("--json", action="store_true", help="print JSON (default: a summary)")
    ap.add_argument("--window", type=float, default=300.0, help="seconds of samples for rates")
    ap.add_argument("--traces", type=int, default=20, help="last N traces")
    return ap.parse_args(list(argv))


def summary_text(snap: dict[str, Any]) -> str:
    lines = [f"schema {snap['schema_version']}, latest sample {snap['latest_sample_ts']}"]
    for h in snap["health"]:
        errs = ", ".join(f"{k}={v}" for k, v in h["errors"].items()) or "no errors"
        lines.append(f"  [{h['collector']}] {h['target']}: last ok {h['last_success']}; {errs}")
    for hr in snap["hit_rates"]:
        rate = "n/a" if hr["hit_rate"] is None else f"{hr['hit_rate']:.3f}"
        lines.append(f"hit rate {hr['worker']} ({hr['source']}, {hr['model']}): {rate}")
    for row in snap["mm_processing"]:
        lines.append(f"mm processing {row['model']} {row['mode']}/{row['reason']}: {row['count']}")
    for key, r in snap["resident_blocks"].items():
        lines.append(f"resident {key}: {r['blocks']} blocks, {len(r['images'])} images")
    lines.append(f"traces: {len(snap['traces'])}")
    obs = snap.get("observed")
    if obs:
        verdicts = ", ".join(f"{k} {v}" for k, v in obs["verdicts"].items() if v)
        origins = ", ".join(f"{k} {v}" for k, v in obs["by_origin"].items())
        lines.append(f"requests by origin: {origins or 'none'}; verdicts: {verdicts or 'none'}")
    return "\n".join(lines)


def with_verdicts(snap: dict[str, Any]) -> dict[str, Any]:
    """Each trace (any origin: mmlens' own and observed traffic) with its miss verdict, and a
    summary by origin, source and verdict under ``observed`` (keys added, none renamed)."""
    traces = snap.get("traces") or []
    for t, j in zip(traces, judge_all(traces), strict=True):
        t["verdict"] = {"category": j.category, "headline": j.headline, "unknown": j.unknown}
    snap["observed"] = summary(traces)
    return snap


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        store = Store(args.db, readonly=True)
    except (StoreError, OSError) as exc:
        print(f"mmlens snapshot: {exc}", file=sys.stderr)
        return 2
    try:
        snap = with_verdicts(build_snapshot(store, window_s=args.window, n_traces=args.traces))
    finally:
        store.close()
    print(json.dumps(snap, default=str) if args.json else summary_text(snap))
    return 0
