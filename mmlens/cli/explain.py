"""`mmlens explain --db PATH --request ID [--json]`: classify why a recorded request missed.

`explain_recorded` gathers from a store what the pure explainer needs (the trace, the traces
before it, KV removals, workers the router gets no events from); pages reuse it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from mmlens.analysis.explain import Explanation, explain, keys_of
from mmlens.analysis.verdicts import Judgement
from mmlens.cli.observed_explain import judge_recorded
from mmlens.records import RequestTrace
from mmlens.store.open import StoreError
from mmlens.store.reader import StoreReader, open_reader

HISTORY = 5000


def block_size_of(trace: RequestTrace, default: int = 16) -> int:
    lay = trace.expected_layout
    return lay.block_size if lay is not None and lay.block_size else default


def events_unavailable(reader: StoreReader, until: float) -> set[str]:
    """Workers SMG marks `smg_kv_events_unavailable` (the router is blind to them)."""
    rows = reader.samples(until - 600, ["smg_kv_events_unavailable"])
    return {s.label("worker") for s in rows if s.value > 0 and s.ts <= until + 60}


def explain_recorded(reader: StoreReader, request_id: str,
                     history_limit: int = HISTORY) -> Explanation | None:
    trace = reader.trace(request_id)
    if trace is None:
        return None
    ts = trace.ts or time.time()
    history = reader.traces_before(ts, history_limit)
    since = min((t.ts or ts for t in history), default=ts)
    return explain(trace, history, block_size_of(trace),
                   removed_events=reader.removals(since, ts),
                   events_unavailable=events_unavailable(reader, ts))


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="mmlens explain", description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("--request", required=True, help="request id (x-request-id / trace id)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(list(argv))
    try:
        reader = open_reader(args.db)
    except StoreError as exc:
        print(f"mmlens explain: {exc}", file=sys.stderr)
        return 2
    try:
        trace = reader.trace(args.request)
        if trace is not None and keys_of(trace) is None:
            # No expected layout (a request mmlens did not send): judged on the router's
            # prediction against what the engine realized.
            return _print_judgement(judge_recorded(reader, args.request), args.json)
        result = explain_recorded(reader, args.request)
    finally:
        reader.close()
    if result is None:
        print(f"mmlens explain: no trace {args.request!r} in {args.db}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_json(), default=str))
    else:
        print(f"{result.category}: {result.headline}")
        for key, value in result.evidence.items():
            if value not in (None, [], {}):
                print(f"  {key}: {value}")
    return 0


def _print_judgement(j: Judgement | None, as_json: bool) -> int:
    if j is None:
        return 2
    if as_json:
        print(json.dumps(j.as_json(), default=str))
        return 0
    print(f"{j.category}: {j.headline}")
    for key, value in j.evidence.items():
        if value not in (None, [], {}):
            print(f"  {key}: {value}")
    print("  sources: " + ", ".join(f"{k} ← {v}" for k, v in sorted(j.sources.items())))
    if j.unknown:
        print("  unknown: " + ", ".join(j.unknown))
    return 0
