"""The Cache page's view: its series and rows keyed by the config's worker names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from mmlens.analysis.views.common import worker_label

T = TypeVar("T")


def named_series(series: Mapping[str, T], names: Mapping[str, str]) -> dict[str, T]:
    """Series keyed by worker URL → keyed by the worker's name (w1), URL when unnamed."""
    return {worker_label(k, names) if "://" in k or k in names else k: v
            for k, v in series.items()}


def named_timeline(rows: Sequence[tuple[float, str, str, int]], names: Mapping[str, str],
                   ) -> list[tuple[float, str, str, int]]:
    return [(ts, worker_label(w, names) if "://" in w or w in names else w, kind, n)
            for ts, w, kind, n in rows]
