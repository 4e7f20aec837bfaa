"""The KV-event store-lag histogram: quantiles within one bucket of the exact ones."""

from __future__ import annotations

import random

import pytest

from mmlens.ingest.lag import LagHistogram


def test_quantiles_are_within_a_bucket_of_the_exact_ones() -> None:
    rng = random.Random(3)
    lags = [rng.lognormvariate(-1.0, 1.2) for _ in range(20_000)]
    h = LagHistogram()
    h.add(lags)
    exact = sorted(lags)
    for q in (0.5, 0.9, 0.99):
        want = exact[int(q * len(exact)) - 1]
        assert h.quantile(q) == pytest.approx(want, rel=0.07)
    assert h.max == max(lags) and h.n == len(lags)
    assert h.quantile(1.0) == max(lags)


def test_empty_negative_and_huge_lags() -> None:
    h = LagHistogram()
    assert h.quantile(0.99) is None
    h.add([-0.5, 0.0])  # a publisher clock slightly ahead counts as no lag
    assert h.quantile(0.99) == 0.0
    h.add([10_000.0])
    assert h.quantile(1.0) == 10_000.0 and h.max == 10_000.0
