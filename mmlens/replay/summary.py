"""What a replay did: sent, served, errors, the rate it achieved against the rate asked, how
late the sends were, and the replayed token-weighted cache hit rate beside the recording's
for the same requests (both from the engines' own ``cached_tokens``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mmlens.replay.plan import Plan, PlannedRequest


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replayed request as it came back."""

    planned: PlannedRequest
    request_id: str  # the replayed request's own id
    sent_at_s: float  # from the replay's start
    late_s: float  # sent_at_s - planned offset (waiting for a free slot counts)
    status: int | None
    error_code: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    worker: str | None
    latency_s: float | None

    @property
    def ok(self) -> bool:
        return self.error_code is None and self.status is not None and self.status < 400


def hit_rate(pairs: Sequence[tuple[int | None, int | None]]) -> float | None:
    """Token-weighted hit rate, sum(cached) / sum(prompt), over the pairs where both are known
    (None: none are)."""
    known = [(c, p) for c, p in pairs if c is not None and p]
    total = sum(p for _, p in known)
    return sum(c for c, _ in known) / total if total else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass
class ReplaySummary:
    planned: int
    sent: int
    ok: int
    errors: dict[str, int]
    skipped: dict[str, int]
    approximations: dict[str, int]
    speed: float
    elapsed_s: float
    asked_rate: float | None  # requests/s the schedule asked for
    achieved_rate: float | None  # requests/s as sent
    late_p50_s: float | None
    late_max_s: float | None
    hit_rate: float | None  # replayed, token-weighted, over the served requests
    recorded_hit_rate: float | None  # the recording's, over the same requests
    prompt_matched: int  # served requests whose prompt length equals the recorded one
    prompt_compared: int
    workers: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        def pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:.1f}%"

        def rate(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}/s"

        out = [f"replayed {self.sent} of {self.planned} planned requests at {self.speed:g}x "
               f"in {self.elapsed_s:.1f} s: {self.ok} ok, {self.sent - self.ok} errors",
               f"rate: asked {rate(self.asked_rate)}, achieved {rate(self.achieved_rate)}; "
               f"late by p50 {self.late_p50_s or 0:.3f} s, max {self.late_max_s or 0:.3f} s",
               f"hit rate (token-weighted): replayed {pct(self.hit_rate)}, recorded "
               f"{pct(self.recorded_hit_rate)}",
               f"prompt length as recorded: {self.prompt_matched} of {self.prompt_compared}"]
        out += [f"  error {code}: {n}" for code, n in sorted(self.errors.items())]
        out += [f"  skipped ({why}): {n}" for why, n in sorted(self.skipped.items())]
        out += [f"  approximated ({what}): {n}" for what, n in sorted(self.approximations.items())]
        out += [f"  worker {w}: {n}" for w, n in sorted(self.workers.items())]
        return out


def summarize(plan: Plan, outcomes: Sequence[Outcome], elapsed_s: float) -> ReplaySummary:
    served = [o for o in outcomes if o.ok]
    errors = Counter(o.error_code or f"http_{o.status}" for o in outcomes if not o.ok)
    sent_at = sorted(o.sent_at_s for o in outcomes)
    achieved = ((len(sent_at) - 1) / (sent_at[-1] - sent_at[0])
                if len(sent_at) > 1 and sent_at[-1] > sent_at[0] else None)
    lates = [o.late_s for o in outcomes]
    compared = [o for o in served if o.prompt_tokens is not None]
    return ReplaySummary(
        planned=len(plan.requests), sent=len(outcomes), ok=len(served), errors=dict(errors),
        skipped=dict(plan.skipped), approximations=dict(plan.approximations), speed=plan.speed,
        elapsed_s=elapsed_s, asked_rate=plan.asked_rate, achieved_rate=achieved,
        late_p50_s=_quantile(lates, 0.5), late_max_s=max(lates, default=None),
        hit_rate=hit_rate([(o.cached_tokens, o.prompt_tokens) for o in served]),
        recorded_hit_rate=hit_rate([(o.planned.recorded_cached, o.planned.recorded_prompt)
                                    for o in served]),
        prompt_matched=sum(1 for o in compared if o.prompt_tokens == o.planned.prompt_tokens),
        prompt_compared=len(compared),
        workers=dict(Counter(o.worker or "unknown" for o in served)))
