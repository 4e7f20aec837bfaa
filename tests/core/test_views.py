"""The pages' view models: what each page lays out, computed without Streamlit."""

from __future__ import annotations

from typing import Any

from mmlens.analysis.lab_plan import tint
from mmlens.analysis.views.common import clock, pct, short_worker
from mmlens.analysis.views.inspector import (
    cached_text,
    explanation_text,
    image_rows,
    request_label,
)
from mmlens.analysis.views.lab import models_of, routers
from mmlens.analysis.views.overview import overview_view
from mmlens.analysis.views.routing import decision_table, mode_reason_series
from mmlens.ingest.observed import fragment
from mmlens.records import CollectorHealth, ImageInfo, MetricSample, RequestTrace, labels_of
from mmlens.state import Snapshot


def _trace(**kw: Any) -> RequestTrace:
    return RequestTrace("r1", "http://r", "smg", "m", 3661.0, False, **kw)


def test_overview_view_says_when_there_is_no_data_and_lists_routers() -> None:
    assert not overview_view(Snapshot(), [], 0.0).has_data
    snap = Snapshot(health=[CollectorHealth("metrics", "smg", last_success=1.0)],
                    targets={"prometheus": "http://p"}, router_state=[
                        {"router": "a", "kind": "smg", "workers": [{
                            "url": "grpc://w", "healthy": True, "status": "ready", "load": 0,
                            "kv_block_size": 16}]},
                        {"router": "b", "kind": "smg", "workers": []}])
    view = overview_view(snap, [], 2.0)
    assert view.has_data and view.prometheus == "http://p" and view.routers_down == ["b"]
    assert view.router_workers[0]["mm_processor"] == "—"
    assert view.targets[0]["state"] == "ok"


def test_routing_views_put_time_first_and_drop_silent_series() -> None:
    (row,) = decision_table([_trace()], {})
    assert list(row)[:2] == ["time", "request"] and row["time"] == "01:01:01"
    assert row["verdict"] == "pending"  # not judged yet: never a guess of the page's own
    labels = labels_of({"model": "m", "mode": "router", "reason": "auto"})
    quiet = labels_of({"model": "m", "mode": "worker", "reason": "auto"})
    samples = [MetricSample("smg", "smg_mm_processing_total", lb, v, ts)
               for ts, v in ((0.0, 1.0), (10.0, 3.0)) for lb in (labels,)]
    samples += [MetricSample("smg", "smg_mm_processing_total", quiet, 5.0, ts)
                for ts in (0.0, 10.0)]
    assert list(mode_reason_series(samples)) == [("smg", "m", "router", "auto")]


def test_inspector_texts() -> None:
    t = _trace(worker="grpc://10.0.0.1:1", cached_tokens=16, prompt_tokens=81,
               images=[ImageInfo("data", 10, 64, 64, {"smg_blake3": "ab" * 32})])
    assert request_label(t) == "01:01:01 · r1 · 10.0.0.1:1 · cached 16/81"
    assert image_rows(t)[0]["smg_blake3"] == "ab" * 8
    assert cached_text(t) == 16
    assert cached_text(fragment("o", "router_log", 1.0)) == "unknown"
    assert "best any worker" in explanation_text({"category": "hit", "headline": "h",
                                                  "realized_tokens": 1, "best_tokens": 2})
    assert explanation_text({"category": "cold", "headline": "h"}) == "**cold** — h"


def test_small_helpers() -> None:
    assert (clock(None), pct(None), pct(0.5), short_worker("grpc://h:1")) == (
        "—", "—", "50%", "h:1")
    assert routers({"routers": [{"name": "a"}]}) == [{"name": "a"}] and routers(None) == []
    assert models_of([{"router": "a", "models": ["m"]}], "a") == ["m"]
    assert tint(0) != tint(1)


def test_overview_names_a_store_outage_what_it_holds_and_what_was_dropped() -> None:
    def store_row(target: str, **kw: Any) -> CollectorHealth:
        return CollectorHealth("store", target, instance="vm:1:0", **kw)

    down = store_row("outage", last_error="store_down: OperationalError: the connection is "
                     "lost", counters={"down": 1, "backlog_records": 1200,
                                       "spilled_backlog_records": 200, "outages": 1})
    (note,) = overview_view(Snapshot(health=[down]), [], 0.0).store_notes
    assert note[0] == "error" and "1200 records held (200 spilled" in note[1]
    assert "connection is lost" in note[1]
    back = store_row("outage", counters={"down": 0, "backlog_records": 0, "outages": 2,
                                         "last_outage_s": 4.2, "retried_records": 900,
                                         "dropped_records": 7})
    refused = store_row("writes", errors={"unwritable_decision": 1})
    notes = overview_view(Snapshot(health=[back, refused]), [], 0.0).store_notes
    assert [s for s, _ in notes] == ["info", "error", "warning"]
    assert "2 store outage(s), the last for 4 s: 900 records" in notes[0][1]
    assert notes[1][1].startswith("7 records could not be held")
    assert "unwritable_decision 1" in notes[2][1]
    assert overview_view(Snapshot(health=[store_row("outage")]), [], 0.0).store_notes == []


def test_dynamo_events_chart_keeps_the_pairs_that_happened() -> None:
    """Dynamo's frontend exports every type/status pair, nearly all at 0: the chart shows the
    ones that happened, not thirty empty ticks; the SMG-only notice needs an SMG router."""
    from mmlens.analysis.views.routing import applied_events, routers_of_kind
    from mmlens.ingest.metrics_records import NormalizedMetrics

    m = NormalizedMetrics(kv_event_health={
        "demo": {"events_applied": {"stored/ok": 16.0, "removed/ok": 0.0,
                                    "cleared/block_not_found": 0.0}},
        "idle": {"events_applied": {"stored/ok": 0.0}}})
    assert applied_events(m) == {"demo": {"stored/ok": 16.0}}
    targets = {"routers": [{"name": "demo", "kind": "dynamo"}, {"name": "s", "kind": "smg"}]}
    assert routers_of_kind(targets, "smg") == ["s"] and routers_of_kind(None, "smg") == []


def test_overview_says_when_the_collector_is_behind_on_a_log_or_dropped_lines() -> None:
    behind = CollectorHealth("router_logs", "smg", counters={"backlog_bytes": 25_300_000,
                                                              "lines": 10})
    dropped = CollectorHealth("router_logs", "stdin", errors={"lines_dropped": 1234},
                              counters={"backlog_bytes": 0})
    caught_up = CollectorHealth("worker_logs", "worker:w1", counters={"backlog_bytes": 0})
    notes = overview_view(Snapshot(health=[behind, dropped, caught_up]), [], 0.0).store_notes
    assert [s for s, _ in notes] == ["warning", "error"]
    assert "behind on the log `smg`: 25.3 MB not read yet" in notes[0][1]
    assert notes[1][1].startswith("1,234 lines of the log `stdin` were dropped")
