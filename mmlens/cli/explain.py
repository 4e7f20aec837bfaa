"""`mmlens explain --db PATH --request ID [--json]`: classify why a recorded request missed.

The inputs are gathered by ``mmlens.store.explained``; the inspector page uses the same."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from mmlens.analysis.explain import keys_of
from mmlens.analysis.verdicts import Judgement
from mmlens.store.explained import explain_recorded, judge_recorded
from mmlens.store.open import StoreError
from mmlens.store.reader import open_reader


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
