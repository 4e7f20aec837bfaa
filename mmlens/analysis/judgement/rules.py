"""One verdict per request, from all the evidence the store has of it.

The serving attempt's prediction (``attempts``) is set against what the engine realized
(usage ``cached_tokens``, a worker span, or the KV chain attributed to it) and what each
worker held of the request when it was routed. First match wins:

error → fallback → count_drift → (realized) false_hit | evicted → hit (unless a worker held
clearly more) → spilled | events_blind (a better worker elsewhere) → evicted | unexplained
(the serving worker held it) → spilled (gate fired) → cold; (realized unknown) spilled |
cold (as the router saw it) | unknown. Realized evidence with two readings is judged on
both: one category when they agree, ``hit_or_<other>`` when not.
"""

from __future__ import annotations

import time
from typing import Any

from mmlens.analysis.judgement.attempts import Prediction, attempts
from mmlens.analysis.judgement.evidence import Evidence, Realized, usage_realized
from mmlens.analysis.judgement.lengths import dynamo_prompt
from mmlens.analysis.judgement.vocabulary import ERROR_HINTS, FALLBACK_MARKERS, MISS_BRANCHES
from mmlens.ingest.observed import OBSERVED
from mmlens.records import RequestTrace, Verdict

_FIELDS = ("worker", "cached_tokens", "prompt_tokens", "status")


def _expected_prompt(t: RequestTrace, pred: Prediction) -> int | None:
    """The prompt length the router (or mmlens' layout) expected the engine to see."""
    lay = t.expected_layout
    if lay is not None and lay.engine_prompt_tokens is not None:
        return int(lay.engine_prompt_tokens)
    if pred.expanded_tokens is not None:
        return int(pred.expanded_tokens)
    return dynamo_prompt(t) if t.images else None


def _first_divergent_block(t: RequestTrace, diff: int, bs: int) -> int | None:
    """The first block the count difference shifts (from the layout's first image)."""
    lay = t.expected_layout
    starts = [] if lay is None else [s.start for s in lay.spans if s.kind == "image"]
    if lay is None or not starts:
        return None
    n0 = lay.images[0].tokens if lay.images else 0
    return (min(starts) + min(n0, n0 + diff // max(1, len(lay.images)))) // bs


def _fell_back(warnings: list[str]) -> bool:
    notes = " ".join(warnings).lower()
    return any(m in notes for m in FALLBACK_MARKERS)


def _failover_note(failed: list[Prediction]) -> str:
    if not failed:
        return ""
    parts = [f"attempt {p.attempt} on {p.worker or '?'} (predicted "
             f"{'?' if p.predicted_blocks is None else p.predicted_blocks} blocks) failed"
             for p in failed]
    return " after failover: " + "; ".join(parts)


class _Case:
    """One request's inputs, as the rules read them."""

    def __init__(self, ev: Evidence, pred: Prediction, failed: list[Prediction]) -> None:
        self.t = ev.trace
        self.ev = ev
        self.pred = pred
        self.failed = failed
        self.worker = self.t.worker or pred.worker
        self.predicted = pred.predicted_blocks
        best = (None, 0) if not ev.held else max(
            ev.held.items(), key=lambda kv: (kv[1], kv[0] == self.worker))
        self.best_worker, self.best_n = best if best[1] else (None, 0)
        self.served_n = ev.held.get(self.worker or "", 0)
        self.note = _failover_note(failed) if failed else ""

    def one(self, got: Realized | None) -> tuple[str, str]:
        """The category and headline for one reading of the realized hit."""
        if got is None:
            return self._unrealized()
        return self.reading(got.blocks, got.source)

    def reading(self, n: int, source: str) -> tuple[str, str]:
        """``one`` of a realized hit of ``n`` blocks that ``source`` told."""
        worker, predicted = self.worker, self.predicted
        if predicted is not None and predicted > n + 1:
            if self.ev.removed_blocks >= predicted - n:
                return "evicted", (
                    f"evicted: the router predicted {predicted} blocks on {worker}, the engine "
                    f"found {n}; {worker} removed {self.ev.removed_blocks} blocks shortly "
                    "before")
            return "false_hit", (
                f"content-blind false hit: the router predicted {predicted} blocks on "
                f"{worker}, the engine found {n} ({source}); same token ids, other "
                "content (e.g. another image of the same size)" + self.note)
        if self.best_n > n + 1 and self.best_worker != worker:
            return self._elsewhere(n)
        if n > 0:
            return "hit", (f"hit: {n} blocks served from cache on {worker} (router predicted "
                           f"{'?' if predicted is None else predicted}){self.note}")
        if self.served_n > n + 1:
            return self._lost(n)
        if self.pred.spill:
            return "spilled", (f"spilled: the spill gate on {self.pred.spill_from or 'the '}"
                               f"{'' if self.pred.spill_from else 'preferred worker'} fired, "
                               f"the router sent it to {worker}, which held nothing of it")
        return "cold", (f"cold{self.note or ''}: nothing of it was cached on {worker} "
                        f"({source}), and the router expected nothing")

    def _elsewhere(self, n: int) -> tuple[str, str]:
        best, worker = self.best_worker, self.worker
        blind = self.ev.blind
        if best in blind or worker in blind:
            return "events_blind", (
                f"events blind: the router gets no KV events from "
                f"{best if best in blind else worker}, so it could not see that {best} held "
                f"{self.best_n} blocks; {worker} served {n}")
        gate = " (its spill gate fired)" if self.pred.spill else ""
        return "spilled", (f"spilled or load-balanced away{gate}: {best} held {self.best_n} "
                           f"blocks, the router sent it to {worker}, which served {n}")

    def _lost(self, n: int) -> tuple[str, str]:
        worker, seed = self.worker, self.ev.seed or "an earlier request"
        if self.ev.removed_blocks:
            return "evicted", (f"evicted: {worker} held {self.served_n} blocks after {seed}, "
                               f"then removed {self.ev.removed_blocks} blocks before this "
                               "request")
        return "unexplained", (f"{worker} should have held {self.served_n} blocks (from "
                               f"{seed}) but the engine found {n}, and no removal was seen")

    def _unrealized(self) -> tuple[str, str]:
        """Without the engine's side the router's view is not a verdict: a spill or a
        first sight may still have hit (the live runs saw both)."""
        worker, predicted, branch = self.worker, self.predicted, self.pred.branch
        if self.pred.spill:
            return "unknown", (f"unknown: the spill gate on {self.pred.spill_from or 'the '}"
                               f"{'' if self.pred.spill_from else 'preferred worker'} fired, "
                               f"the router sent it to {worker}; the realized hit is unknown")
        if predicted == 0 or (predicted is None and branch in MISS_BRANCHES):
            return "unknown", (f"unknown{self.note}: the router saw no prefix of it on any "
                               f"worker ({branch or '0 blocks overlap'}); the realized hit is "
                               "unknown")
        if predicted is None:
            return "unknown", ("unknown: no routing decision and no realized hit were seen "
                               "for this request")
        return "unknown", (
            f"unknown: the router predicted {predicted} cached blocks on {worker}; the "
            "realized hit is unknown (no response through the tap, no worker span, no KV "
            "events of it)")


def _ambiguous(c: _Case, got: Realized) -> tuple[str, str, str | None]:
    readings: dict[str, int] = {}
    for b in (got.blocks, *got.alternatives):
        readings.setdefault(c.reading(b, got.source)[0], b)
    if len(readings) == 1 or not {"hit", "false_hit"} & set(readings):
        cat, head = c.one(got)
        return cat, f"{head} ({got.reason})" if got.reason else head, got.reason
    other = next(c for c in ("false_hit", "spilled", "cold", *readings) if c in readings
                 and c != "hit")
    word = f"hit_or_{other if other in ('false_hit', 'spilled') else 'cold'}"
    blocks = " or ".join(str(b) for b in sorted(set(readings.values()), reverse=True))
    return word, (f"{word.replace('_', ' ')}: {c.worker} served {blocks} blocks of it "
                  f"({got.reason or 'the KV events allow both'})"), got.reason


def judge(ev: Evidence, judged_at: float | None = None) -> Verdict:
    t = ev.trace
    pred, failed = attempts(t)
    c = _Case(ev, pred, failed)
    bs = pred.block_size
    lay = t.expected_layout
    if lay is not None and lay.block_size:
        bs = lay.block_size
    # ``known`` of each field, read once: what an observed record's sources told
    told = t.provenance if t.origin == OBSERVED else None
    knows_cached = told is None or "cached_tokens" in told
    knows_prompt = told is None or "prompt_tokens" in told
    got = (usage_realized(t, bs) if knows_cached else None) or ev.realized
    evidence: dict[str, Any] = {
        "predicted_blocks": pred.predicted_blocks, "request_blocks": pred.request_blocks,
        "branch": pred.branch, "predicted_worker": pred.worker, "worker": t.worker,
        "cached_tokens": t.cached_tokens if knows_cached else None,
        "prompt_tokens": t.prompt_tokens if knows_prompt else None,
        "router_notes": pred.warnings, "spill_gate": pred.spill,
        "held_blocks": dict(ev.held), "seed_request": ev.seed}
    sources = dict(t.provenance) if t.origin == "observed" else {"*": t.origin}
    if pred.sources:
        sources["prediction"] = ", ".join(pred.sources)
    if ev.held_source and ev.held:
        sources["held"] = ev.held_source
    unknown = [] if told is None else [f for f in _FIELDS if f not in told]
    if pred.predicted_blocks is None:
        unknown.append("predicted_blocks")
    if got is not None:
        evidence["realized_blocks"] = got.blocks
        evidence["realized_source"] = got.source
        evidence["realized_alternatives"] = list(got.alternatives)
        sources["realized"] = got.source
        if "cached_tokens" in unknown:
            unknown.remove("cached_tokens")
    else:
        unknown.append("realized")
    reason = None
    if t.failed:
        code = t.error_code or ""
        evidence.update(error=t.error, error_code=code, what_to_change=ERROR_HINTS.get(code, ""))
        cat, head = "error", f"the request failed: {code or t.status}"
    elif pred.warnings and _fell_back(pred.warnings):
        cat, head = "fallback", ("the router fell back to text-prefix routing: "
                                 + "; ".join(pred.warnings[:3]))
    elif knows_prompt and (expected := _expected_prompt(t, pred)) is not None \
            and t.prompt_tokens is not None and t.prompt_tokens != expected:
        diff = t.prompt_tokens - expected
        block = _first_divergent_block(t, diff, bs)
        evidence.update(expected_prompt_tokens=expected, difference=diff,
                        first_divergent_block=block)
        cat, head = "count_drift", (
            f"count drift: the engine expanded to {t.prompt_tokens} tokens, the router's "
            f"view has {expected} ({diff:+d}); blocks "
            f"{'after the first image' if block is None else f'from {block} on'} shift and "
            "cannot match")
    elif got is not None and got.alternatives:
        cat, head, reason = _ambiguous(c, got)
    else:
        cat, head = c.one(got)
    # Positional, in ``Verdict``'s field order (one per request: keywords cost a third of it)
    return Verdict(
        t.request_id, t.ts, cat, head, c.worker, pred.attempt, pred.predicted_blocks,
        None if got is None else got.blocks, bs, c.best_worker,
        c.best_n if c.best_worker else None, reason,
        [p.summary() for p in failed] if failed else [], evidence, sources, unknown,
        time.time() if judged_at is None else judged_at)
