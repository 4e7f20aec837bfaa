"""Rows for the Routing page and the inspector: recent decisions from traces (with the
router's candidates, scores and spill gates as compact text, and as detail rows per request),
strict-mode errors with advice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmlens.analysis.explain import ERROR_HINTS
from mmlens.analysis.request_view import predicted_tokens
from mmlens.analysis.verdicts import as_trace, judge
from mmlens.ingest.observed import known
from mmlens.store.decisions import merged

# The router's error codes and their fixes live with the miss explainer; transport failures
# are the trace client's own codes.
ADVICE = {
    **ERROR_HINTS,
    "timeout": "the router did not answer in time: check its load and the workers' health",
    "unreachable": "the router is down or unreachable: check its URL on the Targets page",
}


def _worker(url: Any) -> str:
    return str(url).split("://", 1)[-1] if url else "—"


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "?"
    return f"{float(v):.{digits}f}".rstrip("0").rstrip(".")


def overlap_text(view: dict[str, Any]) -> str:
    """Blocks the router found cached out of the request's, or, on SMG's approximate tree,
    matched out of input units."""
    if view.get("overlap_blocks") is not None:
        return f"{view['overlap_blocks']}/{view.get('request_blocks')}"
    if view.get("matched_units") is not None:
        return f"{view['matched_units']}/{view.get('input_units')} units"
    return "—"


def candidates_text(candidates: Sequence[dict[str, Any]]) -> str:
    """``host:port load N`` per candidate, flagged when unhealthy or overloaded."""
    parts = []
    for c in candidates:
        flags = [f for f, bad in (("unhealthy", c.get("healthy") is False),
                                  ("overloaded", c.get("overloaded") is True)) if bad]
        load = f" load {_num(c['load'])}" if c.get("load") is not None else ""
        parts.append(_worker(c.get("worker")) + load + (f" ({', '.join(flags)})" if flags
                                                         else ""))
    return " · ".join(parts) or "—"


_SCORE_NAMES = {"policy_affinity": "affinity", "expected_wait": "wait"}


def score_text(s: dict[str, Any]) -> str:
    name = _SCORE_NAMES.get(str(s.get("source")), str(s.get("source")))
    unit = s.get("unit")
    value = _num(s.get("value")) + (" s" if unit == "seconds" else
                                    " blocks" if unit == "blocks" else "")
    device = s.get("device_blocks")
    extra = (f" (device {_num(device)} blocks)"
             if device is not None and device != s.get("value") else "")
    return f"{name} {_worker(s.get('worker'))}: {value}{extra}"


def scores_text(scores: Sequence[dict[str, Any]]) -> str:
    return " · ".join(score_text(s) for s in scores) or "—"


def gate_text(g: dict[str, Any]) -> str:
    """SMG spills when load > average × relative and load > average + absolute."""
    verdict = "spill" if g.get("spill") else "stay" if g.get("spill") is False else "?"
    return (f"{_worker(g.get('worker'))}: load {_num(g.get('load'))} vs avg "
            f"{_num(g.get('average_load'))} ×{_num(g.get('relative_threshold'))} / "
            f"+{_num(g.get('absolute_threshold'))} → {verdict}")


def gates_text(gates: Sequence[dict[str, Any]]) -> str:
    return " · ".join(gate_text(g) for g in gates) or "—"


def policy_text(view: dict[str, Any]) -> str:
    parts = [view.get("policy"), view.get("origin"), view.get("prediction_source")]
    return " / ".join(str(p) for p in parts if p) or "—"


def decision_rows(traces: Sequence[dict[str, Any]], limit: int = 100) -> list[dict[str, Any]]:
    """Recent requests of any origin (mmlens' own, or observed through router logs, spans or
    the tap), each with its verdict; values nobody told are "?"."""
    rows = []
    for t in traces[:limit]:
        view = merged(t.get("predictions") or [])
        rec = as_trace(t)
        rows.append({
            "ts": t.get("ts") or 0.0, "request": t["request_id"],
            "worker": t.get("worker") or view.get("worker") or "—",
            "branch": view.get("branch") or "—",
            "overlap": overlap_text(view),
            "verdict": judge(rec).category,
            "origin": "+".join(rec.sources) if rec.origin == "observed" else rec.origin,
            "predicted": predicted_tokens(t),
            "cached": (t.get("cached_tokens") or 0) if known(rec, "cached_tokens") else "?",
            "prompt": t.get("prompt_tokens"), "model": t.get("model"),
            "mode": t.get("processing_mode") or "—",
            "policy": policy_text(view),
            "candidates": candidates_text(view["candidates"]),
            "scores": scores_text(view["scores"]),
            "gates": gates_text(view["gates"]),
            "warnings": "; ".join(view["warnings"]),
            "status": str(t.get("error_code") or t.get("status") or "—"),
        })
    return rows


def candidate_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per worker the router considered, with its scores and gate beside it."""
    workers = [c.get("worker") for c in view["candidates"]]
    workers += [w for w in (s.get("worker") for s in view["scores"] + view["gates"])
                if w and w not in workers]
    rows = []
    for w in workers:
        c = next((c for c in view["candidates"] if c.get("worker") == w), {})
        rows.append({
            "worker": _worker(w), "chosen": w == view.get("worker"),
            "load": c.get("load"), "healthy": c.get("healthy"),
            "overloaded": c.get("overloaded"),
            "scores": scores_text([s for s in view["scores"] if s.get("worker") == w]),
            "gate": gates_text([g for g in view["gates"] if g.get("worker") == w]),
        })
    return rows


def score_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"source": s.get("source"), "worker": _worker(s.get("worker")),
             "value": s.get("value"), "unit": s.get("unit") or "—",
             "device blocks": s.get("device_blocks"),
             "details": ", ".join(f"{k}={v}" for k, v in (s.get("details") or {}).items())}
            for s in view["scores"]]


def gate_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"worker": _worker(g.get("worker")), "load": g.get("load"),
             "average load": g.get("average_load"),
             "relative threshold": g.get("relative_threshold"),
             "absolute threshold": g.get("absolute_threshold"),
             "absolute margin": g.get("absolute_margin"), "spill": g.get("spill")}
            for g in view["gates"]]


def strict_mode_rows(traces: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in traces:
        code = t.get("error_code")
        if not t.get("error"):
            continue
        rows.append({"request": t["request_id"], "status": t.get("status"),
                     "error_code": code or "—", "message": (t.get("error") or "")[:200],
                     "what to change": ADVICE.get(code or "", "see the message")})
    return rows


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
