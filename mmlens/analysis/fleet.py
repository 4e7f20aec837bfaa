"""Views that stay readable and fast on fleets: the busiest workers kept by name, the rest
summed into one series (a chart of 1,000 workers' bars is neither)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

KEEP = 12

TimelineRow = tuple[float, str, str, int]  # (bucket ts, worker, kind, blocks)


def other_label(n: int) -> str:
    return f"{n} other workers"


def fold_timeline(rows: Sequence[TimelineRow], keep: int = KEEP) -> list[TimelineRow]:
    """KV-event blocks per (bucket, worker, kind) with the ``keep`` workers that moved the
    most blocks kept and every other worker summed per bucket and kind."""
    totals: Counter[str] = Counter()
    for _, worker, _, blocks in rows:
        totals[worker] += blocks
    if len(totals) <= keep:
        return list(rows)
    top = {w for w, _ in totals.most_common(keep)}
    other = other_label(len(totals) - keep)
    summed: Counter[tuple[float, str]] = Counter()
    out = []
    for ts, worker, kind, blocks in rows:
        if worker in top:
            out.append((ts, worker, kind, blocks))
        else:
            summed[(ts, kind)] += blocks
    out += [(ts, other, kind, blocks) for (ts, kind), blocks in summed.items()]
    return sorted(out)
