"""A request's stored verdict: why it hit or missed, judged once by the lead collector's
verdict job (``mmlens.analysis.judgement``) and read by every view."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class Verdict:
    """``category`` is one word of ``mmlens.analysis.judgement.CATEGORIES``; an ambiguous one
    (``hit_or_false_hit``) names both readings and says why in ``reason``. ``evidence``
    holds each input's value, ``sources`` where it came from, ``unknown`` the inputs nobody
    told. ``better_worker`` is the worker that held the most of the request when it was
    routed (``better_blocks`` of it), where that is known."""

    request_id: str
    ts: float
    category: str
    headline: str
    worker: str | None = None
    attempt: int | None = None  # the attempt that served (None: unknown or only one)
    predicted_blocks: int | None = None
    realized_blocks: int | None = None
    block_size: int = 16
    better_worker: str | None = None
    better_blocks: int | None = None
    reason: str | None = None
    failed_attempts: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    judged_at: float = 0.0
    version: int = 0  # 0: judged once; 1: re-judged when late evidence arrived

    @property
    def realized_tokens(self) -> int | None:
        return None if self.realized_blocks is None else self.realized_blocks * self.block_size

    @property
    def best_tokens(self) -> int | None:
        return None if self.better_blocks is None else self.better_blocks * self.block_size

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(realized_tokens=self.realized_tokens, best_tokens=self.best_tokens)
        return out
