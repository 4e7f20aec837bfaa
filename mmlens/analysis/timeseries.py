"""Counter samples → per-interval series for the time-series panels.

Counters are differenced with reset semantics (a drop means the counter restarted and the new
value counts whole), so a rate per interval is ``Δhits / Δqueries`` over that interval, never
a gauge read at one instant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from mmlens.ingest.metric_series import Series, label, to_series
from mmlens.records import MetricSample

Point = tuple[float, float]


def bucket_of(samples: Sequence[MetricSample], points: int = 40) -> float:
    """About ``points`` buckets over the data actually present (a young store has little)."""
    if not samples:
        return 10.0
    return _bucket(max(s.ts for s in samples) - min(s.ts for s in samples), points)


def series_bucket(series: Series, points: int = 40) -> float:
    """``bucket_of`` the same samples as series."""
    if not series:
        return 10.0
    return _bucket(max(p[-1][0] for p in series.values()) -
                   min(p[0][0] for p in series.values()), points)


def _bucket(span: float, points: int) -> float:
    return max(2.0, span / points)


def deltas(points: list[Point]) -> list[Point]:
    """``[(0, 10), (5, 14), (10, 3)]`` → ``[(5, 4), (10, 3)]``."""
    out: list[Point] = []
    prev: float | None = None
    for ts, v in points:
        if v != v:  # NaN
            continue
        if prev is not None:
            out.append((ts, v - prev if v >= prev else v))
        prev = v
    return out


def bucket_sum(points: Iterable[Point], step: float) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for ts, v in points:
        out[ts - ts % step] += v
    return out


def ratio_series(num: list[Point], den: list[Point], step: float) -> list[Point]:
    """Per bucket: Σ Δnum / Σ Δden of two counters (buckets without queries are skipped)."""
    return ratio_of(bucket_counts(num, den, step))


# Per bucket start: (Σ Δhits, Σ Δqueries); sums of several workers add up, ratios do not.
BucketCounts = dict[float, tuple[float, float]]


def bucket_counts(num: list[Point], den: list[Point], step: float) -> BucketCounts:
    n = bucket_sum(deltas(num), step)
    d = bucket_sum(deltas(den), step)
    return {t: (n.get(t, 0.0), d[t]) for t in d}


def ratio_of(counts: BucketCounts) -> list[Point]:
    return [(t, n / d) for t, (n, d) in sorted(counts.items()) if d > 0]


def group_points(samples: Iterable[MetricSample], key_labels: tuple[str, ...],
                 ) -> dict[tuple[str, ...], list[Point]]:
    """Points per (target, *labels), sorted by time; series with the same key are summed
    when their timestamps coincide (one scrape)."""
    acc: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for s in samples:
        key = (s.target, *(s.label(k) for k in key_labels))
        acc[key][s.ts] += s.value
    return {k: sorted(v.items()) for k, v in acc.items()}


def group_series(series: Series, name: str, key_labels: tuple[str, ...],
                 ) -> dict[tuple[str, ...], list[Point]]:
    """``group_points`` of the series named ``name``."""
    acc: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for (target, series_name, labels), points in series.items():
        if series_name != name:
            continue
        sums = acc[(target, *(label(labels, k) for k in key_labels))]
        for ts, v in points:
            sums[ts] += v
    return {k: sorted(v.items()) for k, v in acc.items()}


# Token-weighted prefix hits and queries per engine (SGLang counts cached and prompt tokens).
HIT_COUNTERS = {
    "vllm": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
             ("worker_addr", "engine")),
    "sglang": ("sglang:cached_tokens_total", "sglang:prompt_tokens_total", ("dp_rank",)),
}
HIT_NAMES = tuple(n for hits, queries, _ in HIT_COUNTERS.values() for n in (hits, queries))


def worker_hit_rate_series(samples: Iterable[MetricSample], step: float = 10.0,
                           ) -> dict[str, list[Point]]:
    """Token-weighted prefix hit rate per worker per ``step`` seconds, from the engines'
    counters (vLLM and SGLang side by side; a rank other than 0 is named ``worker#rank``)."""
    out = {}
    for name, counts in worker_hit_counts(to_series(samples), step).items():
        series = ratio_of(counts)
        if series:
            out[name] = series
    return out


def worker_hit_counts(series: Series, step: float = 10.0) -> dict[str, BucketCounts]:
    """Per worker (named as in ``worker_hit_rate_series``): Σ Δhits and Σ Δqueries per
    ``step`` seconds."""
    out: dict[str, BucketCounts] = {}
    for hits_name, queries_name, labels in HIT_COUNTERS.values():
        h = group_series(series, hits_name, labels)
        q = group_series(series, queries_name, labels)
        for key, qpoints in sorted(q.items()):
            target, *rest = key
            addr, rank = (rest[0], rest[1]) if len(rest) == 2 else ("", rest[0])
            name = addr or target
            if rank not in ("", "0"):
                name = f"{name}#{rank}"
            counts = bucket_counts(h.get(key, []), qpoints, step)
            if any(d > 0 for _, d in counts.values()):  # a worker without queries draws nothing
                out[name] = counts
    return out


def counter_increase_series(samples: Iterable[MetricSample], name: str,
                            key_labels: tuple[str, ...], step: float = 10.0,
                            ) -> dict[tuple[str, ...], list[Point]]:
    """Increase per ``step`` of one counter, per (target, *labels)."""
    grouped = group_points((s for s in samples if s.name == name), key_labels)
    return {k: sorted(bucket_sum(deltas(p), step).items()) for k, p in grouped.items()}
