"""The Cache page's view: its series and rows keyed by the config's worker names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from mmlens.analysis.fleet import KEEP, other_label
from mmlens.analysis.views.common import worker_label
from mmlens.records import ResidentSummary

T = TypeVar("T")


def named_series(series: Mapping[str, T], names: Mapping[str, str]) -> dict[str, T]:
    """Series keyed by worker URL → keyed by the worker's name (w1), URL when unnamed."""
    return {worker_label(k, names) if "://" in k or k in names else k: v
            for k, v in series.items()}


def named_timeline(rows: Sequence[tuple[float, str, str, int]], names: Mapping[str, str],
                   ) -> list[tuple[float, str, str, int]]:
    return [(ts, worker_label(w, names) if "://" in w or w in names else w, kind, n)
            for ts, w, kind, n in rows]


ResidentBar = tuple[str, float, float]  # (worker, resident blocks, blocks with image keys)


def resident_bars(state: Sequence[ResidentSummary], names: Mapping[str, str],
                  keep: int = KEEP) -> tuple[list[ResidentBar], int]:
    """Per worker rank its resident and image-keyed blocks, and how many ranks were folded:
    on a fleet the ``keep`` holding the most blocks by name and the others' mean as one bar
    (a mean, so that bar stays comparable with a worker's)."""
    rows = [(worker_label(s.label, names), float(s.resident_blocks),
             float(sum(s.images.values()))) for s in state]
    if len(rows) <= keep:
        return rows, 0
    rows.sort(key=lambda r: (-r[1], r[0]))
    rest = rows[keep:]
    n = len(rest)
    mean = (f"{other_label(n)} (mean)", sum(r[1] for r in rest) / n, sum(r[2] for r in rest) / n)
    return [*rows[:keep], mean], n
