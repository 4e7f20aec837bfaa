"""Rows for the Routing page: recent decisions from traces, strict-mode errors with advice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmlens.explain import ERROR_HINTS
from mmlens.request_view import predicted_tokens

# The router's error codes and their fixes live with the miss explainer; transport failures
# are the trace client's own codes.
ADVICE = {
    **ERROR_HINTS,
    "timeout": "the router did not answer in time: check its load and the workers' health",
    "unreachable": "the router is down or unreachable: check its URL on the Targets page",
}


def decision_rows(traces: Sequence[dict[str, Any]], limit: int = 100) -> list[dict[str, Any]]:
    rows = []
    for t in traces[:limit]:
        preds = t.get("predictions") or [{}]
        # The first prediction that counts blocks (for Dynamo the log's `[ROUTING] Best`,
        # which follows `nvext.timing`).
        pred = next((p for p in preds if p.get("overlap_blocks") is not None), preds[0])
        rows.append({
            "ts": t.get("ts") or 0.0, "request": t["request_id"],
            "worker": t.get("worker") or "—", "branch": pred.get("branch") or "—",
            "overlap": (f"{pred['overlap_blocks']}/{pred.get('request_blocks')}"
                        if pred.get("overlap_blocks") is not None else "—"),
            "predicted": predicted_tokens(t), "cached": t.get("cached_tokens") or 0,
            "prompt": t.get("prompt_tokens"), "model": t.get("model"),
            "mode": t.get("processing_mode") or "—",
            "warnings": "; ".join(w for p in t.get("predictions") or []
                                  for w in p.get("warnings") or []),
            "status": str(t.get("error_code") or t.get("status") or "—"),
        })
    return rows


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
