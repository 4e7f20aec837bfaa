"""What each worker held of a request when it was routed, from the expected layouts of the
requests it served before (mmlens' own requests, or the tap's when it computes layouts).

A layout's block keys are chained (a key names its whole prefix), so the blocks a worker
held of a request are its leading keys an earlier request there had too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mmlens.records import RequestTrace

_ABSENT = (float("inf"), "")


def keys_of(t: RequestTrace) -> list[str] | None:
    lay = t.expected_layout
    return None if lay is None else lay.block_keys


@dataclass
class HeldIndex:
    """Per worker: block key → (ts, request id) of the first request there that had it."""

    horizon_s: float = 900.0
    workers: dict[str, dict[str, tuple[float, str]]] = field(default_factory=dict)

    def add(self, traces: Iterable[RequestTrace]) -> None:
        for t in traces:
            keys = keys_of(t)
            if not keys or not t.worker or t.failed:
                continue
            seen = self.workers.setdefault(t.worker, {})
            for k in keys:
                old = seen.get(k)
                if old is None or t.ts < old[0]:
                    seen[k] = (t.ts, t.request_id)

    def held(self, t: RequestTrace) -> tuple[dict[str, int], str | None]:
        """Per worker the leading blocks of ``t`` an earlier request held there, and the
        request that left the most on the serving worker (or the best one)."""
        keys = keys_of(t)
        if not keys:
            return {}, None
        out: dict[str, int] = {}
        seeds: dict[str, str] = {}
        for worker, seen in self.workers.items():
            n = 0
            for k in keys:
                ts, rid = seen.get(k, _ABSENT)
                if ts >= t.ts:
                    break
                n += 1
                seeds[worker] = rid
            if n:
                out[worker] = n
        pick = t.worker if t.worker in out else max(out, key=out.__getitem__, default=None)
        return out, seeds.get(pick) if pick else None

    def prune(self, before: float) -> None:
        for worker in list(self.workers):
            seen = {k: v for k, v in self.workers[worker].items() if v[0] >= before}
            if seen:
                self.workers[worker] = seen
            else:
                del self.workers[worker]
