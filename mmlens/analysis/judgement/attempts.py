"""Which dispatch attempt served a request, and which failed before it.

A router that loses a worker mid-request retries on another (SMG's cache trace numbers them
``attempt`` 0, 1, …). The verdict judges the attempt that served — the last one with a
response, i.e. on the serving worker — and names the others: attempt 0 predicting 13 blocks
on a worker that died says nothing about attempt 1 on the worker that answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.analysis.judgement.vocabulary import SPILL_BRANCHES
from mmlens.records import RequestTrace, RoutingDecision


@dataclass(slots=True)
class Prediction:
    """What the router said for one attempt, merged over the sources that told it."""

    attempt: int | None
    worker: str | None
    predicted_blocks: int | None
    request_blocks: int | None
    block_size: int
    branch: str | None
    expanded_tokens: int | None
    spill: bool
    spill_from: str | None  # the preferred worker whose spill gate fired
    warnings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "worker": self.worker,
                "predicted_blocks": self.predicted_blocks, "branch": self.branch}


def merged(preds: Sequence[RoutingDecision], attempt: int | None) -> Prediction:
    """Each field from the first decision that told it, those with an overlap first."""
    if len(preds) == 1:
        return _one(preds[0], attempt)
    return _merged(preds, attempt)


def _one(p: RoutingDecision, attempt: int | None) -> Prediction:
    """``_merged`` of one decision (most requests have one), without the merging."""
    bs = p.block_size or 16
    predicted = p.overlap_blocks
    if predicted is None and p.credited_units is not None:
        predicted = p.credited_units // bs
    fired = [g for g in p.gates if g.spill] if p.gates else []
    return Prediction(
        attempt, p.worker, predicted, p.request_blocks, bs, p.branch, p.expanded_tokens,
        bool(fired) or p.branch in SPILL_BRANCHES, next((g.worker for g in fired if g.worker),
                                                         None) if fired else None,
        [str(w) for w in p.warnings] if p.warnings else [], [p.source])


def _merged(preds: Sequence[RoutingDecision], attempt: int | None) -> Prediction:
    ordered = sorted(preds, key=lambda p: p.overlap_blocks is None) if len(preds) > 1 \
        else preds
    got: dict[str, Any] = {}
    for p in ordered:
        for name in ("worker", "overlap_blocks", "request_blocks", "block_size", "branch",
                     "expanded_tokens", "credited_units"):
            if name not in got and (value := getattr(p, name)) is not None:
                got[name] = value
    fired = [g for p in preds for g in p.gates if g.spill]
    branch = got.get("branch")
    bs = got.get("block_size") or 16
    predicted = got.get("overlap_blocks")
    if predicted is None and (units := got.get("credited_units")) is not None:
        predicted = units // bs  # SMG's approximate tree credits tokens, not blocks
    return Prediction(
        attempt, got.get("worker"), predicted, got.get("request_blocks"), bs, branch,
        got.get("expanded_tokens"), bool(fired) or branch in SPILL_BRANCHES,
        next((g.worker for g in fired if g.worker), None),
        [str(w) for p in preds for w in p.warnings], sorted({p.source for p in preds}))


def _is_url(worker: str | None) -> bool:
    return bool(worker) and "://" in str(worker)


def attempts(t: RequestTrace) -> tuple[Prediction, list[Prediction]]:
    """The serving attempt's prediction and the failed attempts' (oldest first).

    Decisions carrying ``attempt`` are grouped by it; one without joins the attempt on its
    worker. With no attempt numbers at all, decisions naming another worker URL than the one
    that answered, logged before the serving worker's, are a failed attempt (SMG logs one
    routing line per dispatch)."""
    preds = t.predictions
    if len(preds) == 1 and preds[0].attempt is None:
        return _one(preds[0], None), []  # one dispatch (most requests)
    preds = list(preds)
    if all(p.attempt is None for p in preds) and len({p.worker for p in preds}) <= 1:
        return merged(preds, None), []  # one dispatch: nothing to tell apart
    groups: dict[int, list[RoutingDecision]] = {}
    by_worker: dict[str | None, int] = {}
    for p in preds:
        if p.attempt is not None:
            groups.setdefault(p.attempt, []).append(p)
            by_worker.setdefault(p.worker, p.attempt)
    loose = [p for p in preds if p.attempt is None]
    if not groups and t.worker and len({p.worker for p in loose if _is_url(p.worker)}) > 1 \
            and _is_url(t.worker) and any(p.worker == t.worker for p in loose):
        served_ts = max((p.ts or 0.0) for p in loose if p.worker == t.worker)
        for p in sorted(loose, key=lambda p: p.ts or 0.0):
            if p.worker != t.worker and _is_url(p.worker) and (p.ts or 0.0) < served_ts:
                by_worker.setdefault(p.worker, len(by_worker))
        by_worker.setdefault(t.worker, len(by_worker))
        for p in loose:
            groups.setdefault(by_worker.get(p.worker, by_worker[t.worker]), []).append(p)
    else:
        for p in loose:
            n = by_worker.get(p.worker)
            groups.setdefault(-1 if n is None else n, []).append(p)
    numbered = sorted(n for n in groups if n >= 0)
    if not numbered:
        return merged(groups.get(-1, []), None), []
    on_worker = [n for n in numbered if t.worker and by_worker.get(t.worker) == n] or \
        [n for n in numbered if any(p.worker == t.worker for p in groups[n])]
    serving = on_worker[-1] if on_worker else numbered[-1]
    serving_preds = groups[serving] + groups.get(-1, [])
    failed = [merged(groups[n], n) for n in numbered if n < serving]
    return merged(serving_preds, serving), failed


def _started(preds: Sequence[RoutingDecision]) -> float | None:
    """An attempt's dispatch: its cache trace's time (nanoseconds) before a log line's."""
    exact = [p.ts for p in preds if p.ts is not None and p.source.endswith("cache_trace")]
    told = exact or [p.ts for p in preds if p.ts is not None]
    return min(told) if told else None


def failed_runs(t: RequestTrace, end: float) -> list[tuple[str, float, float]]:
    """(worker, dispatch, end) of each failed attempt on a worker other than the one that
    served: its engine may have computed and stored its prompt's blocks before the worker
    died, so those blocks are no other request's. It ended by the next attempt's dispatch
    (``end``, the request's own, for the last). A request that failed outright ran its last
    attempt on ``t.worker`` until ``end``."""
    numbered: dict[int, list[RoutingDecision]] = {}
    for p in t.predictions:
        if p.attempt is not None:
            numbered.setdefault(p.attempt, []).append(p)
    starts = {n: s for n, preds in numbered.items() if (s := _started(preds)) is not None}
    out: list[tuple[str, float, float]] = []
    for n in sorted(starts):
        worker = next((p.worker for p in numbered[n] if _is_url(p.worker)), None)
        if worker is None or (worker == t.worker and not t.failed):
            continue
        later = [s for m, s in starts.items() if m > n]
        stop = min(later) if later else end
        if not t.failed and not later:
            continue  # the serving attempt
        out.append((worker, starts[n], max(starts[n], stop)))
    return out
