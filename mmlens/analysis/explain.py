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

from mmlens.records import ExpectedLayout, KVEventRow, RequestTrace

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


def keys_of(trace: RequestTrace) -> list[str] | None:
    lay = trace.expected_layout
    return None if lay is None else lay.block_keys


def held_blocks(trace: RequestTrace, history: Iterable[RequestTrace]
                ) -> dict[str, tuple[int, RequestTrace]]:
    """Per worker: the most leading blocks an earlier request there shares with `trace`."""
    keys = keys_of(trace) or []
    best: dict[str, tuple[int, RequestTrace]] = {}
    for h in history:
        if h.ts >= trace.ts or h.error or not h.worker:
            continue
        other = keys_of(h)
        if not other:
            continue
        n = common_prefix(keys, other)
        if n and n > best.get(h.worker, (0, None))[0]:
            best[h.worker] = (n, h)
    return best


def predicted_blocks(trace: RequestTrace) -> int | None:
    return next((p.overlap_blocks for p in trace.predictions if p.overlap_blocks is not None),
                None)


def router_notes(trace: RequestTrace) -> list[str]:
    notes = []
    for p in trace.predictions:
        notes += [str(w) for w in p.warnings]
        if p.branch:
            notes.append(f"branch {p.branch}")
    return notes


def first_image_start(layout: ExpectedLayout) -> int | None:
    starts = [s.start for s in layout.spans if s.kind == "image"]
    return min(starts) if starts else None


@dataclass
class _Case:
    """What the rules below judge: the request, its layout and the workers' holdings."""

    trace: RequestTrace
    layout: ExpectedLayout
    bs: int
    cached: int
    realized_n: int
    best_worker: str | None
    best_n: int
    served_n: int
    served_seed: RequestTrace | None
    ev: dict[str, Any]

    def result(self, category: Category, headline: str, best_blocks: int | None = None,
               ) -> Explanation:
        best = self.best_n if best_blocks is None else best_blocks
        return Explanation(self.trace.request_id, category, headline, self.cached,
                           best * self.bs, self.ev)


def _case(trace: RequestTrace, layout: ExpectedLayout, history: Sequence[RequestTrace],
          bs: int) -> _Case:
    held = held_blocks(trace, history)
    best_worker, (best_n, seed) = max(held.items(), key=lambda kv: kv[1][0],
                                      default=(None, (0, None)))
    worker = trace.worker
    served_n, served_seed = held.get(worker, (0, None)) if worker else (0, None)
    cached = trace.cached_tokens or 0
    ev: dict[str, Any] = {
        "worker": worker, "cached_tokens": cached, "realized_blocks": cached // bs,
        "best_worker": best_worker, "best_blocks": best_n, "served_worker_blocks": served_n,
        "seed_request": None if seed is None else seed.request_id,
        "prompt_tokens": trace.prompt_tokens, "predicted_blocks": predicted_blocks(trace),
        "router_notes": router_notes(trace),
    }
    return _Case(trace, layout, bs, cached, cached // bs, best_worker, best_n, served_n,
                 served_seed, ev)


def _count_drift(c: _Case) -> Explanation | None:
    expected, prompt = c.layout.engine_prompt_tokens, c.trace.prompt_tokens
    if expected is None or prompt is None or prompt == expected:
        return None
    diff = prompt - expected
    start = first_image_start(c.layout)
    n_images = max(1, len(c.layout.images))
    n0 = c.layout.images[0].tokens if c.layout.images else 0
    block = None if start is None else (start + min(n0, n0 + diff // n_images)) // c.bs
    c.ev.update(expected_prompt_tokens=expected, difference=diff, first_divergent_block=block)
    return c.result("count_drift", (
        f"count drift: the engine expanded to {prompt} tokens, the router's layout has "
        f"{expected} ({diff:+d}); blocks from {block} on shift and cannot match"))


def _false_hit(c: _Case) -> Explanation | None:
    predicted = c.ev["predicted_blocks"]
    if predicted is None or predicted <= c.realized_n + 1 or c.served_n >= predicted:
        return None
    return c.result("false_hit", (
        f"content-blind false hit: the router predicted {predicted} blocks on "
        f"{c.trace.worker}, the engine found {c.realized_n}; that worker held only "
        f"{c.served_n} blocks of this request's content (same token ids, another image)"))


def _hit(c: _Case) -> Explanation | None:
    if not (c.best_n and c.realized_n + 1 >= c.best_n):
        return None
    return c.result("hit", (f"no miss: {c.cached} cached tokens, {c.best_n} blocks were "
                            "available from earlier requests"))


def _fallback(c: _Case) -> Explanation | None:
    notes = " ".join(c.ev["router_notes"]).lower()
    if not any(m in notes for m in FALLBACK_MARKERS):
        return None
    return c.result("fallback", "the router fell back to text-prefix routing: "
                    + "; ".join(c.ev["router_notes"]))


def _cold(c: _Case) -> Explanation | None:
    if c.best_n:
        return None
    return c.result("cold", "cold: no worker held any of this request's blocks", 0)


def _evicted(c: _Case, removed_events: Sequence[KVEventRow]) -> Explanation | None:
    worker, seed = c.trace.worker, c.served_seed
    if not worker or c.served_n <= c.realized_n + 1:
        return None
    seed_ts = 0.0 if seed is None else seed.ts
    seed_id = None if seed is None else seed.request_id
    removed = [r for r in removed_events
               if r.worker == worker and seed_ts <= r.ts <= c.trace.ts]
    c.ev["removed_events_between"] = len(removed)
    c.ev["removed_blocks_between"] = sum(r.n_blocks for r in removed)
    if removed:
        return c.result("evicted", (
            f"evicted: {worker} held {c.served_n} blocks after {seed_id}, then removed "
            f"{c.ev['removed_blocks_between']} blocks before this request"))
    return c.result("unexplained", (
        f"{worker} should have held {c.served_n} blocks (from {seed_id}) but the engine "
        f"found {c.realized_n}, and no removal was seen"))


def _blind_or_spilled(c: _Case, blind: set[str]) -> Explanation:
    worker, best = c.trace.worker, c.best_worker
    if best in blind or worker in blind:
        return c.result("events_blind", (
            f"events blind: the router gets no KV events from "
            f"{best if best in blind else worker}, so it could not see that {best} held "
            f"{c.best_n} blocks"))
    notes = c.ev["router_notes"]
    return c.result("spilled", (
        f"spilled or load-balanced away: {best} held {c.best_n} blocks, the router sent "
        f"the request to {worker}" + (f" ({'; '.join(notes)})" if notes else "")))


def explain(
    trace: RequestTrace,
    history: Sequence[RequestTrace],
    block_size: int,
    *,
    removed_events: Sequence[KVEventRow] = (),
    events_unavailable: Iterable[str] = (),
) -> Explanation:
    """`removed_events`: KV-event rows of kind removed or cleared; `events_unavailable`:
    workers whose KV events the router does not receive."""
    rid = trace.request_id
    if trace.failed:
        code = trace.error_code or ""
        return Explanation(rid, "error", f"the request failed: {code or trace.status}",
                           0, 0, {"error": trace.error, "error_code": code,
                                  "what_to_change": ERROR_HINTS.get(code, "")})
    lay = trace.expected_layout
    if lay is None or lay.block_keys is None:
        return Explanation(rid, "no_layout", "no expected layout was recorded for this request",
                           trace.cached_tokens or 0, 0,
                           {"layout_error": None if lay is None else lay.error})
    c = _case(trace, lay, history, block_size)
    for rule in (_count_drift, _false_hit, _hit, _fallback, _cold):
        found = rule(c)
        if found is not None:
            return found
    return _evicted(c, removed_events) or _blind_or_spilled(c, set(events_unavailable))
