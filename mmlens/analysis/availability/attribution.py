"""Available vs achieved for one request, and why the difference was lost.

Given, at the router's decision time, how many of the request's leading blocks each worker
held (content keys, image identity included), and how many the chosen worker still held when
the engine prefilled:

- available on a worker = its overlap, capped at the blocks an engine can ever hit (full
  blocks, never the one holding the last prompt token: vLLM recomputes that token);
- best = the most available on any worker; realized = the engine's cached tokens;
- avoidable = best − realized, split into
  - router causes (best − available on the chosen worker): ``load_spill`` (a spill gate
    fired, or the router credited the best worker with its blocks and still chose another),
    ``content_blind`` (the router credited the chosen worker with image blocks it did not
    hold, or routed on text alone), ``count_drift`` (the engine expanded the images to
    another length than the router's view), ``stale_index`` (the router's decision shows it
    did not see the best worker's blocks), ``unattributed`` (no decision was logged);
  - engine causes (available on the chosen worker − realized): ``evicted`` (the worker
    dropped them between decision and prefill), ``count_drift``, ``unexplained``;
- ``not_cacheable_tokens``: held blocks beyond the cap (the last-token block), not avoidable;
- ``unseen_tokens``: cached tokens the index did not show on the chosen worker (events missed,
  an image whose engine identifier is not known yet);
- ``false_hit_tokens``: what the router credited the chosen worker with beyond what it held
  (by the index, or by what the engine cached).
"""

from __future__ import annotations

from typing import Any, Literal

from mmlens.analysis.availability.facts import RequestFacts
from mmlens.records import Availability

Cause = Literal["load_spill", "content_blind", "stale_index", "count_drift", "unattributed",
                "evicted", "unexplained"]
CAUSES: tuple[Cause, ...] = ("load_spill", "content_blind", "stale_index", "count_drift",
                             "unattributed", "evicted", "unexplained")


def cacheable_blocks(prompt_tokens: int, block_size: int) -> int:
    return max(0, (prompt_tokens - 1) // block_size)


def attribute(facts: RequestFacts, overlaps: dict[str, int], prefill_blocks: int,
              identities_resolved: bool = True) -> Availability:
    """``overlaps``: leading blocks each worker held at decision time; ``prefill_blocks``:
    those the chosen worker still held when the engine prefilled."""
    bs = facts.block_size
    prompt = facts.prompt_tokens or facts.expected_prompt_tokens or len(facts.content_keys) * bs
    cap = cacheable_blocks(prompt, bs)
    available = {u: min(n, cap) * bs for u, n in overlaps.items() if n}
    chosen = facts.unit
    chosen_tok = available.get(chosen, 0) if chosen else 0
    best_worker, best_tok = _best(available, chosen)
    realized = facts.cached_tokens
    unseen = max(0, realized - chosen_tok)
    evicted = min(max(0, chosen_tok - min(prefill_blocks, cap) * bs),
                  max(0, chosen_tok - realized))
    engine_rest = max(0, chosen_tok - realized) - evicted
    causes: dict[str, int] = {}
    router_part = max(0, best_tok - chosen_tok - unseen)
    evidence = _evidence(facts, cap)
    if router_part:
        causes[router_cause(facts, available, best_worker, chosen_tok, cap, evidence)] = \
            router_part
    if evicted:
        causes["evicted"] = evicted
    if engine_rest:
        key = "count_drift" if facts.count_drift else "unexplained"
        causes[key] = causes.get(key, 0) + engine_rest
    view = facts.router_view
    predicted = None if view.predicted_blocks is None else view.predicted_blocks * bs
    # What the engine cached it held, whether or not the index showed it.
    held = max(chosen_tok, realized)
    false_hit = 0 if predicted is None else max(0, min(predicted, cap * bs) - held)
    return Availability(
        request_id=facts.request_id, ts=facts.ts, router=facts.router,
        router_kind=facts.router_kind, model=facts.model, worker=chosen, block_size=bs,
        prompt_tokens=prompt, images=facts.images, fidelity=facts.fidelity,
        available=available, best_worker=best_worker, best_tokens=best_tok,
        chosen_tokens=chosen_tok, realized_tokens=realized,
        avoidable_tokens=sum(causes.values()), causes=causes,
        not_cacheable_tokens=max(0, max(overlaps.values(), default=0) - cap) * bs,
        unseen_tokens=unseen, predicted_tokens=predicted, request_blocks=view.request_blocks,
        false_hit_tokens=false_hit,
        false_hit_cause=(_false_hit_cause(facts, predicted, cap) if false_hit else None),
        identities_resolved=identities_resolved, evidence=evidence)


def _best(available: dict[str, int], chosen: str | None) -> tuple[str | None, int]:
    if not available:
        return None, 0
    top = max(available.values())
    if chosen is not None and available.get(chosen) == top:
        return chosen, top
    return min(u for u, t in available.items() if t == top), top


def _evidence(facts: RequestFacts, cap: int) -> dict[str, Any]:
    v = facts.router_view
    return {"branch": v.branch, "spill": v.spill, "credited_blocks": dict(v.credited),
            "router_fallback": list(v.fallback), "first_image_block": facts.first_image_block(),
            "cacheable_blocks": cap, "count_drift": facts.count_drift,
            "decision_logged": v.logged}


def _image_blocks_credited(facts: RequestFacts, credited_tokens: int) -> bool:
    first = facts.first_image_block()
    return first is not None and credited_tokens > first * facts.block_size


def _false_hit_cause(facts: RequestFacts, predicted: int | None, cap: int) -> str:
    if predicted is not None and _image_blocks_credited(
            facts, min(predicted, cap * facts.block_size)):
        return "content_blind"
    return "count_drift" if facts.count_drift else "stale_index"


def router_cause(facts: RequestFacts, available: dict[str, int], best: str | None,
                 chosen_tok: int, cap: int, evidence: dict[str, Any]) -> Cause:
    """Why the router sent the request away from the worker holding the most of it."""
    v = facts.router_view
    bs = facts.block_size
    if v.spill:
        return "load_spill"
    if v.predicted_blocks is not None:
        credited = min(v.predicted_blocks, cap) * bs
        if credited > chosen_tok and _image_blocks_credited(facts, credited):
            evidence["router_credited_chosen_tokens"] = credited
            return "content_blind"
    if facts.fidelity == "text_prefix":
        return "content_blind"
    best_credit = None if best is None else v.credited.get(best.split("#")[0])
    if best is not None and best_credit is not None and \
            min(best_credit, cap) * bs >= available.get(best, 0):
        return "load_spill"  # it saw the best worker's blocks and chose on load or cost
    if facts.count_drift:
        return "count_drift"
    return "stale_index" if v.logged else "unattributed"
