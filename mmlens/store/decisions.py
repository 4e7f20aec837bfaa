"""Routing decisions as the pages read them: joined to stored traces by request id at read
time, and folded into one view per request.

Decisions come from the trace itself (``x-smg-cache-trace`` header, Dynamo's ``nvext``) and
from router logs, which the collector stores on their own; any trace — Lab, warm-up,
``mmlens check``, ``mmlens collect`` — meets its logged decisions here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mmlens.ingest.router_logs import request_keys


def trace_keys(trace: Mapping[str, Any]) -> set[str]:
    keys = request_keys(str(trace.get("request_id") or ""), trace.get("response_id"))
    for alias in trace.get("aliases") or ():  # other ids an observed request is known by
        keys |= request_keys(str(alias), str(alias))
    return keys


def _fingerprint(decision: Mapping[str, Any]) -> str:
    return json.dumps(decision, sort_keys=True, default=str)


def attach(traces: Iterable[dict[str, Any]], decisions: Iterable[Mapping[str, Any]]) -> int:
    """Add each logged decision to the traces it belongs to (as a prediction), unless the
    trace already holds it (the collector joins decisions to the traces it records). Marks
    router-mode processing where the router logged an expansion. Returns how many were added."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for d in decisions:
        by_key.setdefault(str(d.get("request_id")), []).append(d)
    added = 0
    for t in traces:
        preds = t.setdefault("predictions", [])
        seen = {_fingerprint(p) for p in preds}
        for key in sorted(trace_keys(t)):
            for d in by_key.get(key, []):
                fp = _fingerprint(d)
                if fp in seen:
                    continue
                seen.add(fp)
                preds.append(dict(d))
                added += 1
                if d.get("expanded_tokens") is not None and t.get("processing_mode") is None:
                    t["processing_mode"] = "router"  # SMG logs it only for router-side expansion
    return added


def _first(preds: Sequence[Mapping[str, Any]], key: str) -> Any:
    return next((p[key] for p in preds if p.get(key) is not None), None)


def merged(preds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One view of everything the router said about a request: scalar fields from the first
    decision that has them (the one counting blocks first), candidates by worker (later
    detail wins), scores and gates from every decision, without repeats."""
    ordered = sorted(preds, key=lambda p: (p.get("overlap_blocks") is None,
                                           not p.get("candidates")))
    view: dict[str, Any] = {k: _first(ordered, k) for k in (
        "router", "worker", "branch", "overlap_blocks", "request_blocks", "block_size",
        "matched_ratio", "matched_units", "input_units", "kv_hit_rate", "policy", "origin",
        "prediction_source", "original_tokens", "expanded_tokens")}
    candidates: dict[str, dict[str, Any]] = {}
    scores: dict[str, dict[str, Any]] = {}
    gates: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for p in preds:
        for c in p.get("candidates") or []:
            old = candidates.get(c.get("worker") or "", {})
            candidates[c.get("worker") or ""] = {**old, **{k: v for k, v in c.items()
                                                          if v is not None}}
        for s in p.get("scores") or []:
            scores.setdefault(_fingerprint(s), dict(s))
        for g in p.get("gates") or []:
            gates.setdefault(_fingerprint(g), dict(g))
        warnings += [w for w in p.get("warnings") or [] if w not in warnings]
    view.update(candidates=list(candidates.values()), scores=list(scores.values()),
                gates=list(gates.values()), warnings=warnings,
                sources=sorted({str(p.get("source")) for p in preds if p.get("source")}))
    return view
