"""`mmlens explain --db PATH --request ID [--json]`: why a recorded request hit or missed.

Prints the request's stored verdict (the lead collector's verdict job judged it, with the
evidence it used); a request not judged yet is "pending" (category null in JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from mmlens.analysis.judgement.shown import PENDING_HEADLINE
from mmlens.analysis.views.cause import cause_sentence
from mmlens.analysis.views.common import named_text, worker_label, worker_names
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
        verdict = None if trace is None else reader.verdict(trace.request_id)
        names = worker_names(reader.meta("targets"))
    finally:
        reader.close()
    if trace is None:
        print(f"mmlens explain: no trace {args.request!r} in {args.db}", file=sys.stderr)
        return 2
    if verdict is None:
        print(json.dumps({"request_id": trace.request_id, "category": None,
                          "headline": PENDING_HEADLINE}) if args.json else PENDING_HEADLINE)
        return 0
    if args.json:
        print(json.dumps(verdict.as_json(), default=str))
        return 0
    # Workers by their config names (w1, w2), as on every page; the JSON keeps addresses.
    headline = named_text(verdict.headline, names)
    # Most headlines open with their category's words ("hit: 15 blocks ..."): not twice.
    print(headline if headline.startswith(verdict.category.replace("_", " ")) else
          f"{verdict.category}: {headline}")
    print(f"  {cause_sentence(verdict, names)}")
    for key, value in verdict.evidence.items():
        if value not in (None, [], {}):
            print(f"  {key}: {named_text(str(value), names)}")
    if verdict.better_worker:
        print(f"  better worker: {worker_label(verdict.better_worker, names)} held "
              f"{verdict.better_blocks} blocks")
    for failed in verdict.failed_attempts:
        print(f"  failed attempt {failed['attempt']}: {worker_label(failed['worker'], names)} "
              f"predicted {failed['predicted_blocks']} blocks")
    print("  sources: " + ", ".join(f"{k} ← {v}" for k, v in sorted(verdict.sources.items())))
    if verdict.unknown:
        print("  unknown: " + ", ".join(verdict.unknown))
    return 0
