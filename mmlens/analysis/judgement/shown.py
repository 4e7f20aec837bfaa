"""How every view shows a stored verdict, and a request not judged yet ("pending")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.judgement.vocabulary import counts
from mmlens.records import RequestTrace, Verdict

PENDING = "pending"
PENDING_HEADLINE = ("pending: not judged yet (the lead collector judges a request once it "
                    "has settled)")


def category(v: Verdict | None) -> str:
    return PENDING if v is None else v.category


def headline(v: Verdict | None) -> str:
    return PENDING_HEADLINE if v is None else v.headline


def brief(v: Verdict | None) -> dict[str, Any] | None:
    """A verdict in a request's JSON (null: pending)."""
    if v is None:
        return None
    return {k: getattr(v, k) for k in (
        "category", "headline", "reason", "unknown", "worker", "attempt", "failed_attempts",
        "predicted_blocks", "realized_blocks", "better_worker", "better_blocks", "version",
        "judged_at")}


def tally(traces: Sequence[RequestTrace], verdicts: Mapping[str, Verdict]) -> dict[str, int]:
    """Requests per stored category, and those pending."""
    out = counts([verdicts[t.request_id].category for t in traces if t.request_id in verdicts])
    out[PENDING] = sum(1 for t in traces if t.request_id not in verdicts)
    return out
