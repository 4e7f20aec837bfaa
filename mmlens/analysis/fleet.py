"""Views that stay readable and fast on fleets: the busiest workers kept by name, the rest
summed into one series (a chart of 1,000 workers' bars is neither)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.analysis.timeseries import (
    BucketCounts,
    Point,
    ratio_of,
    series_bucket,
    worker_hit_counts,
)
from mmlens.ingest.metric_series import Series

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


def fold_hit_counts(counts: Mapping[str, BucketCounts], keep: int = KEEP,
                    ) -> dict[str, BucketCounts]:
    """Per-worker prefix hits and queries per bucket with the ``keep`` workers that queried
    the most tokens kept and every other worker's summed (their token-weighted hit rate)."""
    if len(counts) <= keep:
        return dict(counts)
    queried = Counter({w: sum(d for _, d in c.values()) for w, c in counts.items()})
    top = [w for w, _ in queried.most_common(keep)]
    summed: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for worker, c in counts.items():
        if worker in top:
            continue
        for t, (n, d) in c.items():
            summed[t][0] += n
            summed[t][1] += d
    out = {w: dict(counts[w]) for w in top}
    out[other_label(len(counts) - keep)] = {t: (n, d) for t, (n, d) in summed.items()}
    return out


def fleet_hit_rates(series: Series, keep: int = KEEP) -> tuple[dict[str, list[Point]], float]:
    """The Cache page's hit-rate lines and their bucket width from the window's prefix-cache
    counters: one per worker, or on a fleet the ``keep`` busiest and one for the rest."""
    step = series_bucket(series)
    folded = fold_hit_counts(worker_hit_counts(series, step), keep)
    return {w: ratio_of(c) for w, c in folded.items()}, step


def fold_view_points(points: Sequence[ViewPoint], keep: int = KEEP) -> list[ViewPoint]:
    """Router-vs-engine points with the ``keep`` most divergent workers kept: the others'
    per-request points as one series (each keeps its request id), their compared counts
    summed per time and source."""
    weight = divergence_weights(points)
    if len(weight) <= keep:
        return list(points)
    top = {w for w, _ in weight.most_common(keep)}
    other = other_label(len(weight) - keep)
    out = []
    summed: dict[tuple[float, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for p in points:
        if p.worker in top:
            out.append(p)
        elif p.source == "prediction":
            out.append(replace(p, worker=other))
        else:
            acc = summed[(p.ts, p.source)]
            for i, v in enumerate((p.router_blocks, p.engine_blocks, p.router_only,
                                   p.engine_only)):
                acc[i] += v or 0
    out += [ViewPoint(ts, other, source, *acc) for (ts, source), acc in summed.items()]
    return sorted(out, key=lambda p: p.ts)


def divergence_weights(points: Sequence[ViewPoint]) -> Counter[str]:
    """Per worker, the blocks its router and engine disagreed on over ``points``: how
    ``fold_view_points`` and ``fold_view_rows`` rank workers."""
    weight: Counter[str] = Counter()
    for p in points:
        weight[p.worker] += p.router_only + p.engine_only
    return weight


ROW_COUNTS = ("router blocks", "engine blocks", "router only", "engine only")


def fold_view_rows(rows: Sequence[Mapping[str, Any]], points: Sequence[ViewPoint],
                   keep: int = KEEP) -> list[dict[str, Any]]:
    """The router-vs-engine table (``kv_divergence.view_model``'s rows: the latest per worker
    and source) with the workers ``fold_view_points`` keeps on the chart, and the others'
    rows summed per source into one row each (a count none of them has stays empty)."""
    weight = divergence_weights(points)
    if len(weight) <= keep:
        return [dict(r) for r in rows]
    top = {w for w, _ in weight.most_common(keep)}
    other = other_label(len(weight) - keep)
    out = [dict(r) for r in rows if r["worker"] in top]
    summed: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["worker"] in top:
            continue
        acc = summed.setdefault(r["source"], {"worker": other, "source": r["source"],
                                              **dict.fromkeys(ROW_COUNTS)})
        for k in ROW_COUNTS:
            if r[k] is not None:
                acc[k] = (acc[k] or 0) + r[k]
    return out + [summed[s] for s in sorted(summed)]
