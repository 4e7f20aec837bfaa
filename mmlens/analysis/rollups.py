"""Per-worker minutes: built from the raw rows (the lead collector's rollup job) and read back
as the fleet views' KV timeline and hit-rate lines (pages on fleets, instead of raw events and
samples)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mmlens.analysis.fleet import KEEP, TimelineRow, other_label
from mmlens.analysis.timeseries import BucketCounts, Point, ratio_of
from mmlens.ingest.metrics_records import HitRate
from mmlens.records import ResidentSummary, WorkerMinute

MINUTE_S = 60.0


def minute_of(ts: float) -> float:
    return ts - ts % MINUTE_S


def build_minutes(kv: Sequence[TimelineRow], hits: Mapping[str, BucketCounts],
                  resident: Sequence[ResidentSummary], since: float, now: float,
                  ) -> list[WorkerMinute]:
    """Minutes from ``since`` on: ``kv`` is blocks per (minute, worker, kind) of the KV events,
    ``hits`` Σ Δhits and Σ Δqueries per worker and minute; the resident blocks (summed over a
    worker's ranks) go on the minute of ``now``."""
    rows: dict[tuple[float, str], WorkerMinute] = {}

    def row(ts: float, worker: str) -> WorkerMinute:
        key = (minute_of(ts), worker)
        found = rows.get(key)
        if found is None:
            found = rows[key] = WorkerMinute(key[0], worker)
        return found

    for ts, worker, kind, blocks in kv:
        if ts < since:
            continue
        r = row(ts, worker)
        if kind == "stored":
            r.kv_stored += blocks
        elif kind == "removed":
            r.kv_removed += blocks
    for worker, counts in hits.items():
        for ts, (n, d) in counts.items():
            if ts >= since:
                r = row(ts, worker)
                r.hit_tokens += n
                r.query_tokens += d
    for s in resident:
        r = row(now, s.worker)
        r.kv_resident = (r.kv_resident or 0) + s.resident_blocks
    return sorted(rows.values(), key=lambda r: (r.ts, r.worker or ""))


def _labelled(rows: Sequence[WorkerMinute], n_workers: int) -> list[tuple[str, WorkerMinute]]:
    named = {r.worker for r in rows if r.worker is not None}
    other = other_label(n_workers - len(named))
    return [(r.worker if r.worker is not None else other, r) for r in rows]


def timeline_of(rows: Sequence[WorkerMinute], n_workers: int) -> list[TimelineRow]:
    """The KV-event timeline (blocks per minute, worker and kind) of folded minutes: the
    busiest workers by name, the rest (``worker`` None) as one."""
    out: list[TimelineRow] = []
    for name, r in _labelled(rows, n_workers):
        if r.kv_stored:
            out.append((r.ts, name, "stored", r.kv_stored))
        if r.kv_removed:
            out.append((r.ts, name, "removed", r.kv_removed))
    return sorted(out)


def hit_lines_of(rows: Sequence[WorkerMinute], n_workers: int) -> dict[str, list[Point]]:
    """Token-weighted prefix hit rate per minute of folded minutes (the rest's from their
    summed hits and queries); a worker without queries draws nothing."""
    counts: dict[str, BucketCounts] = {}
    for name, r in _labelled(rows, n_workers):
        if r.query_tokens > 0:
            counts.setdefault(name, {})[r.ts] = (r.hit_tokens, r.query_tokens)
    return {w: ratio_of(c) for w, c in counts.items()}


ROLLUP_SOURCE = "rollups"  # a HitRate read from worker minutes, not from a worker's counters


def hit_rates_of_sums(sums: Sequence[tuple[str, float, float, int]]) -> list[HitRate]:
    """Per-worker hit rates from their minutes' summed hit and queried tokens
    (``StoreReader.worker_hit_sums``); a worker without queries has no rate."""
    out = []
    for worker, hits, queries, minutes in sums:
        rate = hits / queries if queries > 0 else None
        out.append(HitRate(worker, worker, "", ROLLUP_SOURCE, hits, queries, minutes * MINUTE_S,
                           rate, None, rate))
    return out


def prefer_rollups(window_s: float, n_workers: int, keep: int = KEEP) -> bool:
    """Whether a view reads minutes instead of raw rows: on a fleet (more workers than a
    chart names), or when its buckets would be a minute or longer anyway."""
    return n_workers > keep or window_s / 60 >= MINUTE_S
