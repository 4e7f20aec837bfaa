"""The miss explainer: why a recorded request cached fewer tokens than it could have.

Expectation comes from the traces before it: each trace's expected layout carries chained
per-block content keys (token ids plus the identities of the images in the block), so the
longest common key prefix with an earlier request served by worker W is what W could have
served from its cache. The request is then classified, first match wins:

error → no layout → count drift → content-blind false hit → hit → text-prefix fallback →
cold → evicted (the serving worker held the blocks) → events blind → spilled → unexplained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Category = Literal["hit", "error", "no_layout", "count_drift", "false_hit", "fallback", "cold",
                   "evicted", "events_blind", "spilled", "unexplained"]

FALLBACK_MARKERS = ("fallback", "text-prefix", "text-only", "skipping mm routing",
                    "mm routing entry skipped", "not built")
ERROR_HINTS = {
    "multimodal_worker_processing_unsupported_model": (
        "SMG refuses worker-side expansion for this model (not worker-expandable in SMG 1.13): "
        "run with --mm-processing auto or router"),
    "no_media_ref_capable_worker": (
        "strict worker processing, but no worker advertises mm_processor: start the workers "
        "with in-process media processing or use --mm-processing auto"),
    "multimodal_prompt_contract_mismatch": (
        "the chat template emitted a different number of image anchors than the request has "
        "images: check the template's image branch"),
    "multimodal_processing_failed": (
        "the router could not fetch or decode an image (private hosts need "
        "--mm-allow-private-media-hosts on SMG, DYN_MM_ALLOW_INTERNAL=1 on Dynamo)"),
}


@dataclass
class Explanation:
    request_id: str
    category: Category
    headline: str
    realized_tokens: int
    best_tokens: int  # the most any worker could have served, from earlier requests
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "category": self.category,
                "headline": self.headline, "realized_tokens": self.realized_tokens,
                "best_tokens": self.best_tokens, "evidence": self.evidence}


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def keys_of(trace: dict[str, Any]) -> list[str] | None:
    lay = trace.get("expected_layout")
    if isinstance(lay, dict) and isinstance(lay.get("block_keys"), list):
        return lay["block_keys"]
    return None


def held_blocks(trace: dict[str, Any], history: Iterable[dict[str, Any]]
                ) -> dict[str, tuple[int, dict[str, Any]]]:
    """Per worker: the most leading blocks an earlier request there shares with `trace`."""
    keys = keys_of(trace) or []
    best: dict[str, tuple[int, dict[str, Any]]] = {}
    for h in history:
        if h.get("ts", 0) >= trace.get("ts", 0) or h.get("error") or not h.get("worker"):
            continue
        other = keys_of(h)
        if not other:
            continue
        n = common_prefix(keys, other)
        if n and n > best.get(h["worker"], (0, {}))[0]:
            best[h["worker"]] = (n, h)
    return best


def predicted_blocks(trace: dict[str, Any]) -> int | None:
    for p in trace.get("predictions") or []:
        if p.get("overlap_blocks") is not None:
            return int(p["overlap_blocks"])
    return None


def router_notes(trace: dict[str, Any]) -> list[str]:
    notes = []
    for p in trace.get("predictions") or []:
        notes += [str(w) for w in p.get("warnings") or []]
        if p.get("branch"):
            notes.append(f"branch {p['branch']}")
    return notes


def first_image_start(trace: dict[str, Any]) -> int | None:
    lay = trace.get("expected_layout") or {}
    starts = [s["start"] for s in lay.get("spans") or [] if s.get("kind") == "image"]
    return min(starts) if starts else None


def explain(
    trace: dict[str, Any],
    history: Sequence[dict[str, Any]],
    block_size: int,
    *,
    removed_events: Sequence[dict[str, Any]] = (),
    events_unavailable: Iterable[str] = (),
) -> Explanation:
    """`removed_events`: KV-event rows (`ts`, `worker`, `kind`, `n_blocks`) of kind removed or
    cleared; `events_unavailable`: workers whose KV events the router does not receive."""
    rid = str(trace.get("request_id"))
    bs = block_size
    cached = int(trace.get("cached_tokens") or 0)
    worker = trace.get("worker")
    if trace.get("error") or (trace.get("status") or 200) >= 400:
        code = trace.get("error_code") or ""
        return Explanation(rid, "error", f"the request failed: {code or trace.get('status')}",
                           0, 0, {"error": trace.get("error"), "error_code": code,
                                  "what_to_change": ERROR_HINTS.get(code, "")})
    lay = trace.get("expected_layout")
    if not isinstance(lay, dict) or keys_of(trace) is None:
        return Explanation(rid, "no_layout", "no expected layout was recorded for this request",
                           cached, 0, {"layout_error": (lay or {}).get("error")})

    held = held_blocks(trace, history)
    best_worker, (best_n, seed) = max(held.items(), key=lambda kv: kv[1][0],
                                      default=(None, (0, {})))
    served_n, served_seed = held.get(worker, (0, {})) if worker else (0, {})
    realized_n = cached // bs
    ev: dict[str, Any] = {
        "worker": worker, "cached_tokens": cached, "realized_blocks": realized_n,
        "best_worker": best_worker, "best_blocks": best_n, "served_worker_blocks": served_n,
        "seed_request": seed.get("request_id"), "prompt_tokens": trace.get("prompt_tokens"),
        "predicted_blocks": predicted_blocks(trace), "router_notes": router_notes(trace),
    }
    expected_prompt = lay.get("engine_prompt_tokens")
    prompt = trace.get("prompt_tokens")
    if expected_prompt is not None and prompt is not None and prompt != expected_prompt:
        diff = prompt - expected_prompt
        start = first_image_start(trace)
        n_images = max(1, len(lay.get("images") or []))
        n0 = (lay.get("images") or [{}])[0].get("tokens", 0)
        block = None if start is None else (start + min(n0, n0 + diff // n_images)) // bs
        ev.update(expected_prompt_tokens=expected_prompt, difference=diff,
                  first_divergent_block=block)
        return Explanation(rid, "count_drift", (
            f"count drift: the engine expanded to {prompt} tokens, the router's layout has "
            f"{expected_prompt} ({diff:+d}); blocks from {block} on shift and cannot match"),
            cached, best_n * bs, ev)
    predicted = ev["predicted_blocks"]
    if predicted is not None and predicted > realized_n + 1 and served_n < predicted:
        return Explanation(rid, "false_hit", (
            f"content-blind false hit: the router predicted {predicted} blocks on {worker}, the "
            f"engine found {realized_n}; that worker held only {served_n} blocks of this "
            "request's content (same token ids, another image)"), cached, best_n * bs, ev)
    if best_n and realized_n + 1 >= best_n:
        return Explanation(rid, "hit", (
            f"no miss: {cached} cached tokens, {best_n} blocks were available from earlier "
            "requests"), cached, best_n * bs, ev)
    notes = " ".join(ev["router_notes"]).lower()
    if any(m in notes for m in FALLBACK_MARKERS):
        return Explanation(rid, "fallback", (
            "the router fell back to text-prefix routing: " + "; ".join(ev["router_notes"])),
            cached, best_n * bs, ev)
    if best_n == 0:
        return Explanation(rid, "cold", "cold: no worker held any of this request's blocks",
                           cached, 0, ev)
    if worker and served_n > realized_n + 1:
        seed_ts = served_seed.get("ts", 0)
        removed = [r for r in removed_events if r.get("worker") == worker
                   and seed_ts <= r.get("ts", 0) <= trace.get("ts", 0)]
        ev["removed_events_between"] = len(removed)
        ev["removed_blocks_between"] = sum(int(r.get("n_blocks") or 0) for r in removed)
        if removed:
            return Explanation(rid, "evicted", (
                f"evicted: {worker} held {served_n} blocks after "
                f"{served_seed.get('request_id')}, then removed "
                f"{ev['removed_blocks_between']} blocks before this request"),
                cached, best_n * bs, ev)
        return Explanation(rid, "unexplained", (
            f"{worker} should have held {served_n} blocks (from "
            f"{served_seed.get('request_id')}) but the engine found {realized_n}, and no "
            "removal was seen"), cached, best_n * bs, ev)
    blind = set(events_unavailable)
    if best_worker in blind or worker in blind:
        return Explanation(rid, "events_blind", (
            f"events blind: the router gets no KV events from "
            f"{best_worker if best_worker in blind else worker}, so it could not see that "
            f"{best_worker} held {best_n} blocks"), cached, best_n * bs, ev)
    return Explanation(rid, "spilled", (
        f"spilled or load-balanced away: {best_worker} held {best_n} blocks, the router sent "
        f"the request to {worker}" + (f" ({'; '.join(ev['router_notes'])})"
                                      if ev["router_notes"] else "")),
        cached, best_n * bs, ev)
