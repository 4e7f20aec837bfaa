"""Rows for the Routing page and the inspector: recent decisions from traces (with the
router's candidates, scores and spill gates as compact text, and as detail rows per request),
strict-mode errors with advice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.decisions import DecisionView, merged
from mmlens.analysis.judgement.shown import category, headline
from mmlens.analysis.judgement.vocabulary import ERROR_HINTS
from mmlens.analysis.request_view import predicted_tokens
from mmlens.analysis.views.common import named_headline, worker_label
from mmlens.ingest.observed import known
from mmlens.records import RequestTrace, RoutingCandidate, RoutingScore, SpillGate, Verdict

# The router's error codes and their fixes live with the verdict's vocabulary; transport failures
# are the trace client's own codes.
ADVICE = {
    **ERROR_HINTS,
    "timeout": "the router did not answer in time: check its load and the workers' health",
    "unreachable": "the router is down or unreachable: check its URL on the Targets page",
}


Names = Mapping[str, str] | None  # the config's worker names (views.common.worker_names)


def _worker(url: Any, names: Names = None) -> str:
    return worker_label(str(url), names) if url else "—"


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "?"
    return f"{float(v):.{digits}f}".rstrip("0").rstrip(".")


def overlap_text(view: DecisionView) -> str:
    """Blocks the router found cached out of the request's, or, on SMG's approximate tree,
    matched out of input units."""
    if view.overlap_blocks is not None:
        return f"{view.overlap_blocks}/{view.request_blocks}"
    if view.matched_units is not None:
        return f"{view.matched_units}/{view.input_units} units"
    return "—"


def candidates_text(candidates: Sequence[RoutingCandidate], names: Names = None) -> str:
    """``host:port load N`` per candidate, flagged when unhealthy or overloaded."""
    parts = []
    for c in candidates:
        flags = [f for f, bad in (("unhealthy", c.healthy is False),
                                  ("overloaded", c.overloaded is True)) if bad]
        load = f" load {_num(c.load)}" if c.load is not None else ""
        parts.append(_worker(c.worker, names) + load + (f" ({', '.join(flags)})" if flags else ""))
    return " · ".join(parts) or "—"


_SCORE_NAMES = {"policy_affinity": "affinity", "expected_wait": "wait"}


def score_text(s: RoutingScore, names: Names = None) -> str:
    name = _SCORE_NAMES.get(s.source, s.source)
    value = _num(s.value) + (" s" if s.unit == "seconds" else
                             " blocks" if s.unit == "blocks" else "")
    device = s.device_blocks
    extra = (f" (device {_num(device)} blocks)"
             if device is not None and device != s.value else "")
    return f"{name} {_worker(s.worker, names)}: {value}{extra}"


def scores_text(scores: Sequence[RoutingScore], names: Names = None) -> str:
    return " · ".join(score_text(s, names) for s in scores) or "—"


def gate_text(g: SpillGate, names: Names = None) -> str:
    """SMG spills when load > average × relative and load > average + absolute."""
    verdict = "spill" if g.spill else "stay" if g.spill is False else "?"
    return (f"{_worker(g.worker, names)}: load {_num(g.load)} vs avg "
            f"{_num(g.average_load)} ×{_num(g.relative_threshold)} / "
            f"+{_num(g.absolute_threshold)} → {verdict}")


def gates_text(gates: Sequence[SpillGate], names: Names = None) -> str:
    return " · ".join(gate_text(g, names) for g in gates) or "—"


def policy_text(view: DecisionView) -> str:
    parts = [view.policy, view.origin, view.prediction_source]
    return " / ".join(str(p) for p in parts if p) or "—"


def decision_rows(traces: Sequence[RequestTrace], verdicts: Mapping[str, Verdict],
                  limit: int = 100, names: Names = None) -> list[dict[str, Any]]:
    """Recent requests of any origin (mmlens' own, or observed through router logs, spans or
    the tap), each with its stored verdict (pending until judged) and the verdict's one-line
    reason first; values nobody told are "?"."""
    rows = []
    for t in traces[:limit]:
        view = merged(t.predictions)
        v = verdicts.get(t.request_id)
        rows.append({
            "ts": t.ts or 0.0, "request": t.request_id,
            "verdict": category(v), "why": named_headline(headline(v), t.worker, names),
            "worker": _worker(t.worker or view.worker, names),
            "router": t.router or "—",
            "branch": view.branch or "—",
            "overlap": overlap_text(view),
            "origin": "+".join(t.sources) if t.origin == "observed" else t.origin,
            "predicted": predicted_tokens(t),
            "cached": (t.cached_tokens or 0) if known(t, "cached_tokens") else "?",
            "prompt": t.prompt_tokens, "model": t.model,
            "mode": t.processing_mode or "—",
            "policy": policy_text(view),
            "candidates": candidates_text(view.candidates, names),
            "scores": scores_text(view.scores, names),
            "gates": gates_text(view.gates, names),
            "warnings": "; ".join(view.warnings),
            "status": str(t.error_code or t.status or "—"),
        })
    return rows


def candidate_rows(view: DecisionView, names: Names = None) -> list[dict[str, Any]]:
    """One row per worker the router considered, with its scores and gate beside it."""
    workers = [c.worker for c in view.candidates]
    workers += [w for w in (x.worker for x in [*view.scores, *view.gates])
                if w and w not in workers]
    rows = []
    for w in workers:
        c = next((c for c in view.candidates if c.worker == w), RoutingCandidate(w or ""))
        rows.append({
            "worker": _worker(w, names), "chosen": w == view.worker,
            "load": c.load, "healthy": c.healthy, "overloaded": c.overloaded,
            "scores": scores_text([s for s in view.scores if s.worker == w], names),
            "gate": gates_text([g for g in view.gates if g.worker == w], names),
        })
    return rows


def score_rows(view: DecisionView, names: Names = None) -> list[dict[str, Any]]:
    return [{"source": s.source, "worker": _worker(s.worker, names), "value": s.value,
             "unit": s.unit or "—", "device blocks": s.device_blocks,
             "details": ", ".join(f"{k}={v}" for k, v in s.details.items())}
            for s in view.scores]


def gate_rows(view: DecisionView, names: Names = None) -> list[dict[str, Any]]:
    return [{"worker": _worker(g.worker, names), "load": g.load,
             "average load": g.average_load,
             "relative threshold": g.relative_threshold,
             "absolute threshold": g.absolute_threshold,
             "absolute margin": g.absolute_margin, "spill": g.spill}
            for g in view.gates]


def strict_mode_rows(traces: Sequence[RequestTrace]) -> list[dict[str, Any]]:
    return [{"request": t.request_id, "status": t.status, "error_code": t.error_code or "—",
             "message": (t.error or "")[:200],
             "what to change": ADVICE.get(t.error_code or "", "see the message")}
            for t in traces if t.error]


def dynamo_verdict_rows(verdicts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Dynamo's per-model word on exact (pad-value) MM routing, from its frontend log."""
    rows = []
    for model, v in sorted(verdicts.items()):
        exact = v.get("exact")
        rows.append({
            "model": model,
            "image routing": ("exact (pad values)" if exact is True else
                              "text prefix only" if exact is False else "unknown"),
            "spec": v.get("spec") or "—",
            "image token id": v.get("image_token_id"),
            "why not": "; ".join(v.get("reasons") or []) or "—",
        })
    return rows
