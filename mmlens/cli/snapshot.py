"""``mmlens snapshot``: print the current normalized state of a store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mmlens.analysis.availability.view import AvailabilityView, view_model
from mmlens.analysis.judgement.shown import brief, tally
from mmlens.analysis.observed_fields import by_origin
from mmlens.records import RequestTrace, Verdict
from mmlens.state import Snapshot
from mmlens.store.open import StoreError
from mmlens.store.reader import StoreReader
from mmlens.store.snapshot import build_snapshot


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mmlens snapshot", description=__doc__)
    ap.add_argument("--db", required=True)
    ap.add_argument("--json", action="store_true", help="print JSON (default: a summary)")
    ap.add_argument("--window", type=float, default=300.0,
                    help="seconds of samples for rates and of requests for `observed`")
    ap.add_argument("--traces", type=int, default=20, help="last N traces")
    ap.add_argument("--availability-window", type=float, default=3600.0,
                    help="seconds of evaluated requests for available vs achieved")
    return ap.parse_args(list(argv))


def summary_text(snap: Snapshot, observed: dict[str, Any] | None = None) -> str:
    lines = [f"schema {snap.schema_version}, latest sample {snap.latest_sample_ts}"]
    for h in snap.health:
        errs = ", ".join(f"{k}={v}" for k, v in h.errors.items()) or "no errors"
        lines.append(f"  [{h.collector}] {h.target}: last ok {h.last_success}; {errs}")
    for hr in snap.metrics.hit_rates:
        rate = "n/a" if hr.hit_rate is None else f"{hr.hit_rate:.3f}"
        lines.append(f"hit rate {hr.worker} ({hr.source}, {hr.model}): {rate}")
    for row in snap.metrics.mm_processing:
        lines.append(f"mm processing {row['model']} {row['mode']}/{row['reason']}: {row['count']}")
    for r in snap.resident:
        lines.append(f"resident {r.worker}#{r.rank}: {r.resident_blocks} blocks, "
                     f"{len(r.images)} images")
    lines.append(f"traces: {len(snap.traces)}")
    if observed:
        verdicts = ", ".join(f"{k} {v}" for k, v in observed["verdicts"].items() if v)
        origins = ", ".join(f"{k} {v}" for k, v in observed["by_origin"].items())
        lines.append(f"requests by origin: {origins or 'none'}; verdicts: {verdicts or 'none'}")
    return "\n".join(lines)


def availability_text(view: AvailabilityView) -> str:
    h = view.headline
    if not h.requests:
        return "available vs achieved: no evaluated request yet"
    causes = ", ".join(f"{c} {n}" for c, n in h.causes.items()) or "none"
    return (f"available vs achieved over {h.requests} requests: achieved "
            f"{h.achieved or 0:.1%} of {h.prompt_tokens} prompt tokens, available "
            f"{h.available or 0:.1%}; avoidable {h.avoidable_tokens} tokens ({causes}); "
            f"content-blind or stale false hits {h.false_hit_tokens} tokens")


def with_verdicts(snap: Snapshot, verdicts: dict[str, Verdict],
                  window: Sequence[RequestTrace] | None = None) -> dict[str, Any]:
    """The snapshot's JSON with each listed trace's stored verdict (null: not judged yet)
    and, under ``observed``, a summary by origin, source and stored verdict of every request
    of the window (``window``; the listed traces without one)."""
    doc = snap.to_json()
    for t, rec in zip(doc["traces"], snap.traces, strict=True):
        t["verdict"] = brief(verdicts.get(rec.request_id))
    counted = snap.traces if window is None else window
    doc["observed"] = by_origin(counted) | {"verdicts": tally(counted, verdicts)}
    doc["observed"]["window_s"] = snap.window_s if window is not None else None
    return doc


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        reader = StoreReader(args.db)
    except (StoreError, OSError) as exc:
        print(f"mmlens snapshot: {exc}", file=sys.stderr)
        return 2
    try:
        snap = build_snapshot(reader, window_s=args.window, n_traces=args.traces)
        # The window ends at the newest request: a store read after the traffic still counts it.
        end = max((t.ts for t in snap.traces), default=snap.generated_at)
        window = reader.window_traces(end - args.window, end)
        avail = view_model(*reader.availability_window(args.availability_window),
                           args.availability_window)
        verdicts = reader.verdicts_for([*snap.traces, *window])
    finally:
        reader.close()
    doc = with_verdicts(snap, verdicts, window)
    doc["availability"] = avail.to_json()
    print(json.dumps(doc, default=str) if args.json else
          summary_text(snap, doc["observed"]) + "\n" + availability_text(avail))
    return 0
