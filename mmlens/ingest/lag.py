"""End-to-end lag of KV events (publisher timestamp → committed in the store) as a fixed
log-bucket histogram: constant memory at any event rate, quantiles within one bucket (±6 %)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

_LO, _HI, _PER_DECADE = 1e-4, 3600.0, 40
_EDGES = [_LO * 10 ** (i / _PER_DECADE)
          for i in range(int(math.log10(_HI / _LO) * _PER_DECADE) + 1)]


class LagHistogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(_EDGES) + 1)
        self.n = 0
        self.max = 0.0

    def add(self, lags: Iterable[float]) -> None:
        for lag in lags:
            lag = max(lag, 0.0)  # publisher clock slightly ahead: count as no lag
            self.counts[bisect.bisect_left(_EDGES, lag)] += 1
            self.n += 1
            if lag > self.max:
                self.max = lag

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding the ``q`` quantile (None when empty)."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(_EDGES[i] if i < len(_EDGES) else self.max, self.max)
        return self.max
