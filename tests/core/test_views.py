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
    (row,) = decision_table([_trace()])
    assert list(row)[:2] == ["time", "request"] and row["time"] == "01:01:01"
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
