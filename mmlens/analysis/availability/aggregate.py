"""Aggregates of per-request availability, token- and block-weighted (never means of ratios).

- achieved vs available hit rate per router, model or worker over time: Σ realized / Σ prompt
  against Σ best / Σ prompt;
- avoidable prefill tokens per minute, per cause;
- predicted vs realized: Σ predicted blocks and Σ realized blocks against Σ request blocks,
  over the requests the router made a prediction for;
- image requests by how the router keyed their images (exact, degraded, text prefix).

Everything is a sum, so the inputs are cells: sums per (time bucket, router, model, worker),
kept by the store as requests are evaluated (a request is a cell of one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmlens.analysis.availability.attribution import CAUSES
from mmlens.records import Availability

FIDELITIES = ("exact", "degraded", "text_prefix", "unknown")
SUMS = ("n", "prompt", "best", "realized", "avoidable", "not_cacheable", "false_hit",
        "pred_blocks", "pred_request_blocks", "pred_realized_blocks", *FIDELITIES, *CAUSES)
"""Summed per cell. ``best`` is at least ``realized``; the ``pred_*`` sums cover requests with
a router prediction; the fidelity sums count image requests."""
BUCKET_S = 60.0


@dataclass
class Labels:
    """A string column as integer codes into ``names``."""

    codes: np.ndarray
    names: list[str]

    @classmethod
    def of(cls, values: Sequence[str]) -> Labels:
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int64,
                            count=len(values))
        return cls(codes, list(index))


@dataclass
class Cells:
    t: np.ndarray  # bucket start
    router: Labels
    model: Labels
    worker: Labels
    sums: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.sums[name]

    @classmethod
    def from_columns(cls, cols: dict[str, Sequence[Any]]) -> Cells:
        """From column lists: ``t``, ``router``, ``model``, ``worker`` and every ``SUMS``."""
        return cls(np.asarray(cols["t"], dtype=np.float64), Labels.of(cols["router"]),
                   Labels.of(cols["model"]), Labels.of(cols["worker"]),
                   {s: np.asarray(cols[s], dtype=np.int64) for s in SUMS})

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[float, str, str, str, dict[str, int]]]) -> Cells:
        """From stored cells: (bucket start, router, model, worker, sums)."""
        cols: dict[str, list[Any]] = {k: [r[i] for r in rows] for i, k in enumerate(
            ("t", "router", "model", "worker"))}
        for s in SUMS:
            cols[s] = [r[4].get(s, 0) for r in rows]
        return cls.from_columns(cols)

    @classmethod
    def of(cls, rows: Sequence[Availability], bucket_s: float = BUCKET_S) -> Cells:
        """One cell per request."""
        return cls.from_columns(cell_columns(rows, bucket_s))

    def where(self, mask: np.ndarray) -> Cells:
        return Cells(self.t[mask], Labels(self.router.codes[mask], self.router.names),
                     Labels(self.model.codes[mask], self.model.names),
                     Labels(self.worker.codes[mask], self.worker.names),
                     {s: v[mask] for s, v in self.sums.items()})


def request_sums(a: Availability) -> dict[str, int]:
    """What one request adds to its cell."""
    out = dict.fromkeys(SUMS, 0)
    bs = a.block_size
    out.update(n=1, prompt=a.prompt_tokens, best=max(a.best_tokens, a.realized_tokens),
               realized=a.realized_tokens, avoidable=a.avoidable_tokens,
               not_cacheable=a.not_cacheable_tokens, false_hit=a.false_hit_tokens)
    if a.predicted_tokens is not None:
        out.update(pred_blocks=a.predicted_tokens // bs,
                   pred_request_blocks=-(-a.prompt_tokens // bs),
                   pred_realized_blocks=a.realized_tokens // bs)
    if a.images:
        out[a.fidelity if a.fidelity in FIDELITIES else "unknown"] = 1
    for cause, tokens in a.causes.items():
        if cause in out:
            out[cause] = tokens
    return out


CellKey = tuple[float, str, str, str]
"""(bucket start, router, model, worker)."""


def cell_sums(rows: Sequence[Availability], bucket_s: float = BUCKET_S,
              ) -> dict[CellKey, dict[str, int]]:
    """Requests summed per cell (what the store adds to its cells)."""
    out: dict[CellKey, dict[str, int]] = {}
    for a in rows:
        key = (a.ts // bucket_s * bucket_s, a.router, a.model, a.worker or "")
        add = request_sums(a)
        sums = out.get(key)
        if sums is None:
            out[key] = add
        else:
            for k, v in add.items():
                sums[k] += v
    return out


def revised_sums(old: Sequence[Availability], new: Sequence[Availability],
                 bucket_s: float = BUCKET_S) -> dict[CellKey, dict[str, int]]:
    """What replacing the rows ``old`` by ``new`` adds to each cell (negative where a sum
    shrinks; a revised row may move to another cell)."""
    out = cell_sums(new, bucket_s)
    for key, sums in cell_sums(old, bucket_s).items():
        cell = out.setdefault(key, dict.fromkeys(SUMS, 0))
        for k, v in sums.items():
            cell[k] = cell.get(k, 0) - v
    return {k: s for k, s in out.items() if any(s.values())}


def cell_columns(rows: Sequence[Availability], bucket_s: float = BUCKET_S,
                 ) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {k: [] for k in ("t", "router", "model", "worker", *SUMS)}
    for a in rows:
        cols["t"].append(a.ts // bucket_s * bucket_s)
        cols["router"].append(a.router)
        cols["model"].append(a.model)
        cols["worker"].append(a.worker or "")
        for k, v in request_sums(a).items():
            cols[k].append(v)
    return cols


@dataclass(frozen=True)
class HitRatePoint:
    group: str
    t: float  # bucket start
    requests: int
    prompt_tokens: int
    achieved: float
    available: float


@dataclass(frozen=True)
class Headline:
    requests: int
    prompt_tokens: int
    achieved: float | None
    available: float | None
    avoidable_tokens: int
    avoidable_per_minute: float | None
    causes: dict[str, int]
    not_cacheable_tokens: int
    false_hit_tokens: int
    predicted_blocks_ratio: float | None  # Σ predicted / Σ request blocks
    realized_blocks_ratio: float | None  # Σ realized / Σ request blocks (same requests)
    image_routing: dict[str, float]  # share of image requests per fidelity

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _buckets(t: np.ndarray, bucket_s: float) -> tuple[np.ndarray, np.ndarray]:
    keys, inverse = np.unique(np.floor(t / bucket_s).astype(np.int64), return_inverse=True)
    return keys * bucket_s, inverse


def hit_rates(cells: Cells, by: str = "router", bucket_s: float = BUCKET_S,
              ) -> list[HitRatePoint]:
    """Token-weighted achieved and available hit rate per ``by`` (router, model, worker) and
    time bucket (a multiple of the cells' bucket)."""
    if not len(cells):
        return []
    labels: Labels = getattr(cells, by)
    starts, t = _buckets(cells.t, bucket_s)
    cell = labels.codes * len(starts) + t
    size = len(labels.names) * len(starts)
    n, prompt, realized, best = (np.bincount(cell, weights=cells[s], minlength=size)
                                 for s in ("n", "prompt", "realized", "best"))
    out = []
    for c in np.flatnonzero(n):
        p = prompt[c]
        out.append(HitRatePoint(labels.names[c // len(starts)], float(starts[c % len(starts)]),
                                int(n[c]), int(p), float(realized[c] / p) if p else 0.0,
                                float(best[c] / p) if p else 0.0))
    return out


def avoidable_per_minute(cells: Cells, bucket_s: float = BUCKET_S,
                         ) -> list[tuple[float, str, float]]:
    """(bucket start, cause, avoidable tokens per minute) for causes with any."""
    if not len(cells):
        return []
    starts, t = _buckets(cells.t, bucket_s)
    out = []
    for cause in CAUSES:
        values = cells[cause]
        if not values.any():
            continue
        sums = np.bincount(t, weights=values, minlength=len(starts)) * (60.0 / bucket_s)
        out += [(float(starts[i]), cause, float(sums[i])) for i in np.flatnonzero(sums)]
    return sorted(out)


def headline(cells: Cells, window_s: float | None = None) -> Headline:
    """Totals; per minute over ``window_s`` (default: the cells' buckets, first to last)."""
    total = {s: int(v.sum()) for s, v in cells.sums.items()} if len(cells) else dict.fromkeys(
        SUMS, 0)
    if window_s is None and len(cells):
        window_s = float(cells.t.max() - cells.t.min()) + BUCKET_S
    return _headline(total, window_s)


def _headline(total: dict[str, int], window_s: float | None) -> Headline:
    prompt, req_blocks = total["prompt"], total["pred_request_blocks"]
    images = sum(total[f] for f in FIDELITIES)
    return Headline(
        requests=total["n"], prompt_tokens=prompt,
        achieved=total["realized"] / prompt if prompt else None,
        available=total["best"] / prompt if prompt else None,
        avoidable_tokens=total["avoidable"],
        avoidable_per_minute=(total["avoidable"] * 60.0 / window_s) if window_s else None,
        causes={c: total[c] for c in CAUSES if total[c]},
        not_cacheable_tokens=total["not_cacheable"], false_hit_tokens=total["false_hit"],
        predicted_blocks_ratio=total["pred_blocks"] / req_blocks if req_blocks else None,
        realized_blocks_ratio=total["pred_realized_blocks"] / req_blocks if req_blocks else None,
        image_routing={f: total[f] / images for f in FIDELITIES} if images else {})


def headlines(cells: Cells, by: str = "router", window_s: float | None = None,
              ) -> dict[str, Headline]:
    """``headline`` per router, model or worker: every group summed in one pass (a fleet has
    1,000 workers; a pass per worker over all cells was quadratic)."""
    if not len(cells):
        return {}
    labels: Labels = getattr(cells, by)
    codes, n = labels.codes, len(labels.names)
    sums = {s: np.rint(np.bincount(codes, weights=v, minlength=n)).astype(np.int64)
            for s, v in cells.sums.items()}
    first, last = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(first, codes, cells.t)
    np.maximum.at(last, codes, cells.t)
    return {labels.names[c]: _headline(
        {s: int(v[c]) for s, v in sums.items()},
        window_s if window_s is not None else float(last[c] - first[c]) + BUCKET_S)
        for c in np.unique(codes)}
