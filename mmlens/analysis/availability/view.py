"""The available-vs-achieved view the Overview, the Cache page and ``mmlens snapshot`` show:
from the stored per-minute cells and the newest per-request records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.analysis.availability.aggregate import (
    BUCKET_S,
    Cells,
    Headline,
    HitRatePoint,
    avoidable_per_minute,
    headline,
    headlines,
    hit_rates,
)
from mmlens.analysis.views.common import pct
from mmlens.records import Availability

CAUSE_TEXT = {
    "load_spill": "router chose another worker on load",
    "content_blind": "router's prediction was blind to image content",
    "stale_index": "router's index did not show the best worker's blocks",
    "count_drift": "engine expanded images to another length than the router",
    "unattributed": "router chose another worker (no decision logged)",
    "evicted": "engine evicted the blocks before prefill",
    "unexplained": "engine cached less than it held",
}


@dataclass
class AvailabilityView:
    window_s: float
    headline: Headline
    by_router: dict[str, Headline] = field(default_factory=dict)
    by_model: dict[str, Headline] = field(default_factory=dict)
    by_worker: dict[str, Headline] = field(default_factory=dict)
    rates: list[HitRatePoint] = field(default_factory=list)  # per router and bucket
    avoidable: list[tuple[float, str, float]] = field(default_factory=list)
    recent: list[Availability] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.headline.requests == 0

    def top_cause(self) -> str | None:
        causes = self.headline.causes
        return max(causes, key=lambda c: causes[c]) if causes else None

    def summary(self) -> str:
        h = self.headline
        keyed = ", ".join(f"{k} {v:.0%}" for k, v in h.image_routing.items() if v)
        return (f"{h.requests} requests: the engines cached {pct(h.achieved)} of the prompt "
                f"tokens; the best worker at each decision held {pct(h.available)}. Avoidable "
                f"{h.avoidable_tokens} tokens. Router predictions "
                f"{pct(h.predicted_blocks_ratio)} of request blocks, realized "
                f"{pct(h.realized_blocks_ratio)} (block-weighted)"
                + (f"; image requests keyed {keyed}." if keyed else "."))

    def rows(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest requests that lost tokens or had a false hit, for a table."""
        out = []
        for a in self.recent:
            if not (a.avoidable_tokens or a.false_hit_tokens):
                continue
            out.append({
                "request": a.request_id, "worker": a.worker or "—",
                "best worker": a.best_worker or "—", "available": a.best_tokens,
                "on chosen": a.chosen_tokens, "cached": a.realized_tokens,
                "avoidable": a.avoidable_tokens,
                "causes": ", ".join(f"{c} {n}" for c, n in a.causes.items()) or "—",
                "false hit": (f"{a.false_hit_tokens} ({a.false_hit_cause})"
                              if a.false_hit_tokens else "—"),
                "images keyed": a.fidelity,
                "identities": "resolved" if a.identities_resolved else "unresolved"})
            if len(out) >= limit:
                break
        return out

    def group_rows(self, by: str) -> list[dict[str, Any]]:
        groups = {"router": self.by_router, "model": self.by_model,
                  "worker": self.by_worker}[by]
        return [{by: name, "requests": h.requests,
                 "achieved": pct(h.achieved), "available": pct(h.available),
                 "avoidable tokens": h.avoidable_tokens,
                 "predicted / request blocks": pct(h.predicted_blocks_ratio),
                 "realized / request blocks": pct(h.realized_blocks_ratio)}
                for name, h in sorted(groups.items())]

    def to_json(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            **self.headline.to_json(),
            "by_router": {k: v.to_json() for k, v in self.by_router.items()},
            "by_model": {k: v.to_json() for k, v in self.by_model.items()},
            "by_worker": {k: v.to_json() for k, v in self.by_worker.items()},
            "rates": [p.__dict__ for p in self.rates],
            "avoidable_per_minute_by_cause": [
                {"t": t, "cause": c, "tokens_per_minute": v} for t, c, v in self.avoidable],
            "recent": [a.to_json() for a in self.recent],
        }


def view_model(cells: Sequence[tuple[float, str, str, str, dict[str, int]]],
               recent: Sequence[Availability], window_s: float,
               bucket_s: float = BUCKET_S) -> AvailabilityView:
    """``cells``: the store's per-minute cells of the window; ``recent``: its newest
    per-request records (newest first)."""
    c = Cells.from_rows(cells)
    return AvailabilityView(
        window_s=window_s, headline=headline(c, window_s),
        by_router=headlines(c, "router", window_s), by_model=headlines(c, "model", window_s),
        by_worker=headlines(c, "worker", window_s),
        rates=hit_rates(c, "router", max(bucket_s, BUCKET_S)),
        avoidable=avoidable_per_minute(c, max(bucket_s, BUCKET_S)), recent=list(recent))
