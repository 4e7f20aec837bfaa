"""The Lab's request sequences and result rows (pure: images are opaque values here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from mmlens.analysis.request_view import predicted_tokens
from mmlens.records import RequestTrace

T = TypeVar("T")

SEQUENCES = {
    "once": "one request",
    "repeat": "repeat ×3 (cache hits should grow, then stay)",
    "abab": "A, B, A, B (needs two images: each replay should return to its seed worker)",
    "isolation": "A, A, then B (needs two images of one size: B may be a false hit)",
    "staircase": "1, 2, 3 copies of the first image (overlap should climb)",
}


def plan_steps(sequence: str, images: Sequence[T], text: str,
               ) -> list[tuple[str, str, list[T]]]:
    """``(label, text, images)`` per request of a sequence."""
    imgs = list(images)
    if sequence == "once":
        return [("request", text, imgs)]
    if sequence == "repeat":
        return [(f"repeat {i + 1}", text, imgs) for i in range(3)]
    if sequence in ("abab", "isolation"):
        if len(imgs) < 2:
            raise ValueError(f"{SEQUENCES[sequence]}: add at least two images")
        a, b = [imgs[0]], [imgs[1]]
        if sequence == "abab":
            return [("A", text, a), ("B", text, b), ("A again", text, a), ("B again", text, b)]
        return [("A (seed)", text, a), ("A (warm)", text, a), ("B (same size)", text, b)]
    if sequence == "staircase":
        if not imgs:
            raise ValueError("staircase: add an image")
        return [(f"{n} image(s)", text, [imgs[0]] * n) for n in (1, 2, 3)]
    raise ValueError(f"unknown sequence {sequence!r}")


def result_row(label: str, router: str, trace: RequestTrace) -> dict[str, Any]:
    lay = trace.expected_layout
    return {
        "step": label, "router": router, "request": trace.request_id,
        "worker": trace.worker or "—", "prompt_tokens": trace.prompt_tokens,
        "cached_tokens": trace.cached_tokens, "predicted": predicted_tokens(trace),
        "ttft_ms": None if trace.ttft_s is None else round(trace.ttft_s * 1000, 1),
        "expected_router_view": lay.router_view.token_count if lay and lay.router_view else None,
        "expected_worker_view": lay.worker_view.token_count if lay and lay.worker_view else None,
        "expected_engine": lay.engine_prompt_tokens if lay else None,
        "mode": trace.processing_mode or "—",
        "error": f"{trace.error_code}: {trace.error}" if trace.error else "",
    }


def comparison_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step and router: what each mode sends and what the engine counted."""
    rows = []
    for r in results:
        observed = r.get("prompt_tokens")
        expected = r.get("expected_engine")
        verdict = ("—" if observed is None or expected is None else
                   "equal" if observed == expected else
                   f"engine counted {observed - expected:+d} tokens (count drift or wrapper)")
        rows.append({
            "step": r["step"], "router": r["router"],
            "router mode: router sends": r.get("expected_router_view"),
            "worker mode: router sends": r.get("expected_worker_view"),
            "expected engine prompt_tokens": expected,
            "observed prompt_tokens": observed, "verdict": verdict,
        })
    return rows
