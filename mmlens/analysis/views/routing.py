"""The Routing page's view: processing mode and reason per interval, Dynamo's applied events,
the totals line when the window saw no image request, and the decisions table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.routing_table import decision_rows
from mmlens.analysis.timeseries import Point, bucket_of, counter_increase_series
from mmlens.analysis.views.common import clock, is_miss
from mmlens.ingest.metrics_records import NormalizedMetrics
from mmlens.records import MetricSample, RequestTrace, Verdict

MODE_SERIES = "smg_mm_processing_total"


def mode_reason_series(samples: Sequence[MetricSample],
                       ) -> dict[tuple[str, ...], list[Point]]:
    """Image requests per (target, model, mode, reason) and interval; silent series left out."""
    series = counter_increase_series(samples, MODE_SERIES, ("model", "mode", "reason"),
                                     step=bucket_of(samples, 30))
    return {k: v for k, v in series.items() if any(p[1] for p in v)}


def mode_totals(metrics: NormalizedMetrics) -> str:
    return ", ".join(f"{m['mode']}/{m['reason']} {m['count']:.0f}" for m in metrics.mm_processing)


def applied_events(metrics: NormalizedMetrics) -> dict[str, Any]:
    """Dynamo's KV events applied per status, per frontend: the pairs that happened (its
    frontend exports every type/status pair, most of them at 0)."""
    out = {}
    for target, h in metrics.kv_event_health.items():
        seen = {k: n for k, n in (h.get("events_applied") or {}).items() if n}
        if seen:
            out[target] = seen
    return out


def routers_of_kind(targets: Mapping[str, Any] | None, kind: str) -> list[str]:
    """The configured routers of one kind (``smg``, ``dynamo``), by name."""
    return [str(r.get("name")) for r in (targets or {}).get("routers") or []
            if r.get("kind") == kind]


def decision_table(traces: Sequence[RequestTrace], verdicts: Mapping[str, Verdict],
                   names: Mapping[str, str] | None = None, misses_only: bool = False,
                   routers: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """``decision_rows`` with the time first and routers by their config names, as the page
    shows it; ``misses_only`` keeps the requests whose stored verdict is a miss."""
    rows = [{"time": clock(row.pop("ts")), **row,
             "router": (routers or {}).get(row["router"], row["router"])}
            for row in decision_rows(traces, verdicts, names=names)]
    return [r for r in rows if is_miss(r["verdict"])] if misses_only else rows
