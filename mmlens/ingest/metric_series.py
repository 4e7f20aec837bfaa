"""Sample windows as series, and the counter arithmetic every metric normalizer shares."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from mmlens.records import Labels, MetricSample

SeriesKey = tuple[str, str, Labels]  # target, sample name, labels
Points = list[tuple[float, float]]  # (ts, value), ascending
Series = dict[SeriesKey, Points]


def to_series(samples: Iterable[MetricSample]) -> Series:
    series: Series = defaultdict(list)
    for s in samples:
        series[(s.target, s.name, s.labels)].append((s.ts, s.value))
    for points in series.values():
        points.sort()
    return dict(series)


def increase(points: Points) -> float:
    """Counter increase over the points; a drop is a reset and the new value counts whole.

    ``[(0, 10), (5, 14), (10, 3), (15, 6)]`` → 4 + 3 + 3 = 10.
    """
    total = 0.0
    prev: float | None = None
    for _, v in points:
        if v != v:  # NaN
            continue
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
    return total


def latest(points: Points) -> float:
    return points[-1][1] if points else 0.0


def span(points: Points) -> float:
    return points[-1][0] - points[0][0] if len(points) > 1 else 0.0


def label(labels: Labels, key: str, default: str = "") -> str:
    for k, v in labels:
        if k == key:
            return v
    return default


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


class SeriesIndex:
    """Series grouped by sample name for the normalizers."""

    def __init__(self, series: Series) -> None:
        self.by_name: dict[str, list[tuple[str, Labels, Points]]] = defaultdict(list)
        self.names_by_target: dict[str, set[str]] = defaultdict(set)
        for (target, name, labels), points in series.items():
            self.by_name[name].append((target, labels, points))
            self.names_by_target[target].add(name)

    def get(self, name: str) -> list[tuple[str, Labels, Points]]:
        return self.by_name.get(name, [])

    def grouped(self, name: str, key_labels: tuple[str, ...]) -> dict[tuple[str, ...],
                                                                       list[Points]]:
        """The series of `name` by (target, *values of key_labels)."""
        groups: dict[tuple[str, ...], list[Points]] = defaultdict(list)
        for target, labels, points in self.get(name):
            groups[(target, *(label(labels, k) for k in key_labels))].append(points)
        return groups

    def counter_rows(self, name: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        """One row per series of `name`: target, the `keys` labels, last count and increase."""
        rows = []
        for target, labels, points in sorted(self.get(name), key=lambda r: (r[0], r[1])):
            row: dict[str, Any] = {"target": target}
            row.update({k: label(labels, k) for k in keys})
            row["count"] = latest(points)
            row["increase"] = increase(points)
            rows.append(row)
        return rows
