"""PromQL through prometheus-api-client: the same MetricSample records as direct scrapes.

Prometheus adds ``job`` and ``instance`` to every series; ``instance`` is mapped back to the
collector's target name (the scrape config uses the target URL's host:port) and both labels
are dropped so series line up with direct-scrape series.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from mmlens.records import CollectorHealth, Labels, MetricSample

# Families the normalizer reads: pulled from Prometheus in one selector.
DEFAULT_SELECTOR = '{__name__=~"smg_.+|vllm:.+|sglang:.+|sglang_.+|dynamo_.+"}'


class PromClient(Protocol):
    def custom_query(self, query: str, params: dict[str, Any] | None = None,
                     timeout: int | None = None) -> list[dict[str, Any]]: ...

    def custom_query_range(self, query: str, start_time: datetime, end_time: datetime,
                           step: str, params: dict[str, Any] | None = None,
                           timeout: int | None = None) -> list[dict[str, Any]]: ...


class PromQLSource:
    def __init__(self, prom: PromClient, instance_targets: dict[str, str] | None = None,
                 timeout_s: int = 5) -> None:
        self.prom = prom
        self.instance_targets = instance_targets or {}
        self.timeout_s = timeout_s
        self.health = CollectorHealth("promql", "prometheus")

    def _sample_fields(self, metric: dict[str, str]) -> tuple[str, str, Labels]:
        labels = dict(metric)
        name = labels.pop("__name__", "")
        labels.pop("job", None)
        instance = labels.pop("instance", "")
        target = self.instance_targets.get(instance, instance)
        return target, name, tuple(sorted(labels.items()))

    def instant(self, query: str = DEFAULT_SELECTOR) -> list[MetricSample]:
        return self._samples(lambda: self.prom.custom_query(query, timeout=self.timeout_s),
                             lambda item: [item["value"]])

    def range(self, query: str, start: datetime, end: datetime, step: str = "5s",
              ) -> list[MetricSample]:
        return self._samples(
            lambda: self.prom.custom_query_range(query, start_time=start, end_time=end,
                                                 step=step, timeout=self.timeout_s),
            lambda item: item.get("values", []))

    def _samples(self, ask: Callable[[], list[dict[str, Any]]],
                 points: Callable[[dict[str, Any]], list[Any]]) -> list[MetricSample]:
        """``ask``'s series as samples, one per (ts, value) of ``points``; a failed query is
        counted and gives none."""
        try:
            result = ask()
        except Exception as exc:  # the client raises requests/its own errors: all are I/O
            self.health.error("promql_error", str(exc), time.time())
            return []
        out = []
        for item in result:
            target, name, labels = self._sample_fields(item.get("metric", {}))
            for ts, value in points(item):
                out.append(MetricSample(target, name, labels, float(value), float(ts)))
        self.health.ok(time.time())
        return out
