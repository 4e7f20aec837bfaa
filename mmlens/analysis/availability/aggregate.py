"""Aggregates of per-request availability, token- and block-weighted (never means of ratios).

- achieved vs available hit rate per router, model or worker over time: Σ realized / Σ prompt
  against Σ best / Σ prompt;
- avoidable prefill tokens per minute, per cause;
- predicted vs realized: Σ predicted blocks, Σ realized blocks and Σ request blocks over the
  requests the router made a prediction for;
- image requests by how the router keyed their images (exact, degraded, text prefix).

Columns (``AvailabilityColumns``) keep 100k requests to a few vectorized passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mmlens.analysis.availability.attribution import CAUSES, Availability

FIDELITIES = ("exact", "degraded", "text_prefix", "unknown")
GROUPS = ("router", "model", "worker")


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

    def __getitem__(self, mask: np.ndarray) -> Labels:
        return Labels(self.codes[mask], self.names)


@dataclass
class AvailabilityColumns:
    ts: np.ndarray
    router: Labels
    model: Labels
    worker: Labels
    block_size: np.ndarray
    prompt: np.ndarray
    best: np.ndarray
    realized: np.ndarray
    avoidable: np.ndarray
    not_cacheable: np.ndarray
    false_hit: np.ndarray
    predicted: np.ndarray  # tokens, −1 without a prediction
    images: np.ndarray
    fidelity: np.ndarray  # index into FIDELITIES
    causes: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def of(cls, rows: Sequence[Availability]) -> AvailabilityColumns:
        def ints(values: list[int]) -> np.ndarray:
            return np.asarray(values, dtype=np.int64)

        return cls(
            ts=np.asarray([r.ts for r in rows], dtype=np.float64),
            router=Labels.of([r.router for r in rows]),
            model=Labels.of([r.model for r in rows]),
            worker=Labels.of([r.worker or "" for r in rows]),
            block_size=ints([r.block_size for r in rows]),
            prompt=ints([r.prompt_tokens for r in rows]),
            best=ints([r.best_tokens for r in rows]),
            realized=ints([r.realized_tokens for r in rows]),
            avoidable=ints([r.avoidable_tokens for r in rows]),
            not_cacheable=ints([r.not_cacheable_tokens for r in rows]),
            false_hit=ints([r.false_hit_tokens for r in rows]),
            predicted=ints([-1 if r.predicted_tokens is None else r.predicted_tokens
                            for r in rows]),
            images=ints([r.images for r in rows]),
            fidelity=ints([FIDELITIES.index(r.fidelity) for r in rows]),
            causes={c: ints([r.causes.get(c, 0) for r in rows]) for c in CAUSES})


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


def _buckets(ts: np.ndarray, bucket_s: float) -> tuple[np.ndarray, np.ndarray]:
    b = np.floor(ts / bucket_s).astype(np.int64)
    keys, inverse = np.unique(b, return_inverse=True)
    return keys * bucket_s, inverse


def hit_rates(cols: AvailabilityColumns, by: str = "router", bucket_s: float = 60.0,
              ) -> list[HitRatePoint]:
    """Token-weighted achieved and available hit rate per ``by`` (router, model, worker) and
    time bucket."""
    if not len(cols):
        return []
    labels: Labels = getattr(cols, by)
    names, g = labels.names, labels.codes
    starts, t = _buckets(cols.ts, bucket_s)
    cell = g * len(starts) + t
    size = len(names) * len(starts)
    n = np.bincount(cell, minlength=size)
    prompt = np.bincount(cell, weights=cols.prompt, minlength=size)
    realized = np.bincount(cell, weights=cols.realized, minlength=size)
    best = np.bincount(cell, weights=np.maximum(cols.best, cols.realized), minlength=size)
    out = []
    for c in np.flatnonzero(n):
        p = prompt[c]
        out.append(HitRatePoint(str(names[c // len(starts)]), float(starts[c % len(starts)]),
                                int(n[c]), int(p), float(realized[c] / p) if p else 0.0,
                                float(best[c] / p) if p else 0.0))
    return out


def avoidable_per_minute(cols: AvailabilityColumns, bucket_s: float = 60.0,
                         ) -> list[tuple[float, str, float]]:
    """(bucket start, cause, avoidable tokens per minute) for causes with any."""
    if not len(cols):
        return []
    starts, t = _buckets(cols.ts, bucket_s)
    scale = 60.0 / bucket_s
    out = []
    for cause, values in cols.causes.items():
        if not values.any():
            continue
        sums = np.bincount(t, weights=values, minlength=len(starts))
        out += [(float(starts[i]), cause, float(sums[i] * scale)) for i in np.flatnonzero(sums)]
    return sorted(out)


def headline(cols: AvailabilityColumns) -> Headline:
    n = len(cols)
    prompt = int(cols.prompt.sum()) if n else 0
    realized = int(cols.realized.sum()) if n else 0
    best = int(np.maximum(cols.best, cols.realized).sum()) if n else 0
    avoidable = int(cols.avoidable.sum()) if n else 0
    span = float(cols.ts.max() - cols.ts.min()) if n > 1 else 0.0
    predicted = cols.predicted >= 0
    req_blocks = (cols.prompt[predicted] + cols.block_size[predicted] - 1) // \
        cols.block_size[predicted]
    pred_blocks = cols.predicted[predicted] // cols.block_size[predicted]
    real_blocks = cols.realized[predicted] // cols.block_size[predicted]
    total = int(req_blocks.sum())
    imaged = cols.images > 0
    shares = {}
    if imaged.any():
        counts = np.bincount(cols.fidelity[imaged], minlength=len(FIDELITIES))
        shares = {f: float(counts[i] / imaged.sum()) for i, f in enumerate(FIDELITIES)}
    return Headline(
        requests=n, prompt_tokens=prompt,
        achieved=realized / prompt if prompt else None,
        available=best / prompt if prompt else None,
        avoidable_tokens=avoidable,
        avoidable_per_minute=avoidable * 60.0 / span if span > 0 else None,
        causes={c: int(v.sum()) for c, v in cols.causes.items() if v.any()},
        not_cacheable_tokens=int(cols.not_cacheable.sum()) if n else 0,
        false_hit_tokens=int(cols.false_hit.sum()) if n else 0,
        predicted_blocks_ratio=int(pred_blocks.sum()) / total if total else None,
        realized_blocks_ratio=int(real_blocks.sum()) / total if total else None,
        image_routing=shares)


def subset(cols: AvailabilityColumns, mask: np.ndarray) -> AvailabilityColumns:
    return AvailabilityColumns(
        **{name: getattr(cols, name)[mask] for name in (
            "ts", "router", "model", "worker", "block_size", "prompt", "best", "realized",
            "avoidable", "not_cacheable", "false_hit", "predicted", "images", "fidelity")},
        causes={c: v[mask] for c, v in cols.causes.items()})


def headlines(cols: AvailabilityColumns, by: str = "router") -> dict[str, Headline]:
    """``headline`` per router, model or worker."""
    if not len(cols):
        return {}
    labels: Labels = getattr(cols, by)
    present = np.unique(labels.codes)
    return {labels.names[c]: headline(subset(cols, labels.codes == c)) for c in present}
