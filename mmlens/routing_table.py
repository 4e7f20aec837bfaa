"""Rows for the Routing page: recent decisions from traces, strict-mode errors with advice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmlens.request_view import predicted_tokens

STRICT_MODE_ADVICE = {
    "multimodal_worker_processing_unsupported_model": (
        "SMG was told to let workers expand images (--mm-processing worker) for a model it "
        "does not opt in: use --mm-processing auto or router for this model"),
    "no_media_ref_capable_worker": (
        "strict worker mode needs workers that advertise mm_processor: start them with "
        "multimodal processing enabled, or use --mm-processing auto"),
    "multimodal_processing_failed": (
        "the router could not fetch or decode the image: loopback/private URLs need "
        "--mm-allow-private-media-hosts; check the URL and format"),
    "timeout": "the router did not answer in time: check its load and the worker health",
    "unreachable": "the router is down or unreachable: check its URL on the Targets page",
}


def decision_rows(traces: Sequence[dict[str, Any]], limit: int = 100) -> list[dict[str, Any]]:
    rows = []
    for t in traces[:limit]:
        pred = (t.get("predictions") or [{}])[0]
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
            "status": t.get("error_code") or t.get("status"),
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
                     "what to change": STRICT_MODE_ADVICE.get(code or "", "see the message")})
    return rows
