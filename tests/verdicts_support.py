"""Verdicts for views under test, judged by the one judgement exactly as the verdict job
does (``JudgeState``), so a view's test feeds it what the store would hold."""

from __future__ import annotations

from collections.abc import Sequence

from mmlens.analysis.judgement.batch import JudgeState
from mmlens.records import RequestTrace, Verdict


def judged(traces: Sequence[RequestTrace]) -> dict[str, Verdict]:
    return {v.request_id: v for v in JudgeState().judge(
        list(traces), [t.request_id for t in traces])}
