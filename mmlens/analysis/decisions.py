"""Everything the router said about one request, folded into one view: the Routing page's
rows and the inspector's candidate, score and gate tables read it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mmlens.records import RoutingCandidate, RoutingDecision, RoutingScore, SpillGate

_SCALARS = ("router", "worker", "branch", "overlap_blocks", "request_blocks", "block_size",
            "matched_ratio", "matched_units", "input_units", "kv_hit_rate", "policy", "origin",
            "prediction_source", "original_tokens", "expanded_tokens")


@dataclass(slots=True)
class DecisionView:
    """Everything the router said about one request, folded: scalar fields from the first
    decision that has them (the one counting blocks first), candidates by worker (later
    detail wins), scores and gates from every decision without repeats."""

    router: str | None = None
    worker: str | None = None
    branch: str | None = None
    overlap_blocks: int | None = None
    request_blocks: int | None = None
    block_size: int | None = None
    matched_ratio: float | None = None
    matched_units: int | None = None
    input_units: int | None = None
    kv_hit_rate: float | None = None
    policy: str | None = None
    origin: str | None = None
    prediction_source: str | None = None
    original_tokens: int | None = None
    expanded_tokens: int | None = None
    candidates: list[RoutingCandidate] = field(default_factory=list)
    scores: list[RoutingScore] = field(default_factory=list)
    gates: list[SpillGate] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def _first(preds: Sequence[RoutingDecision], name: str) -> Any:
    return next((v for v in (getattr(p, name) for p in preds) if v is not None), None)


def _overlay(old: RoutingCandidate, new: RoutingCandidate) -> RoutingCandidate:
    return replace(old, **{f.name: getattr(new, f.name) for f in fields(new)
                           if getattr(new, f.name) is not None})


def merged(preds: Sequence[RoutingDecision]) -> DecisionView:
    ordered = sorted(preds, key=lambda p: (p.overlap_blocks is None, not p.candidates))
    view = DecisionView(**{k: _first(ordered, k) for k in _SCALARS})
    candidates: dict[str, RoutingCandidate] = {}
    for p in preds:
        for c in p.candidates:
            key = c.worker or ""
            candidates[key] = _overlay(candidates[key], c) if key in candidates else c
        view.scores += [s for s in p.scores if s not in view.scores]
        view.gates += [g for g in p.gates if g not in view.gates]
        view.warnings += [w for w in p.warnings if w not in view.warnings]
    view.candidates = list(candidates.values())
    view.sources = sorted({p.source for p in preds if p.source})
    return view
