"""Every page on the store that `mmlens dashboard --demo` fills: the real SMG router, simulated
workers, the collectors and the warm-up workload. The Lab sends real requests."""

from __future__ import annotations

import pytest

from mmlens.store_queries import StoreReader
from tests.pages.apptest_util import (
    PAGES,
    assert_clean,
    figure_titled,
    figures,
    messages,
    open_page,
    trace_names,
)
from tests.pages.conftest import LiveDashboard

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture
def live(live_dashboard: LiveDashboard, monkeypatch: pytest.MonkeyPatch) -> LiveDashboard:
    monkeypatch.setenv("MMLENS_DB", str(live_dashboard.db))
    if live_dashboard.config:
        monkeypatch.setenv("MMLENS_CONFIG", str(live_dashboard.config))
    return live_dashboard


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_from_the_demo(live: LiveDashboard, page: str) -> None:
    at = open_page(page)
    assert_clean(at)
    assert not [e for e in messages(at)["error"] if "failed" in e]


def test_overview_shows_demo_numbers(live: LiveDashboard) -> None:
    at = open_page("overview")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Engine hit rate (token-weighted)"] != "—"
    assert metrics["Image requests in router mode"] == "100%"  # SMG gRPC: auto_mixed
    # The warm-up's blue image after red, same size: SMG predicts, the engine misses.
    assert any("false_hits" in w for w in messages(at)["warning"])
    assert figure_titled(at, "hit rate per worker")["data"][0]["type"] == "bar"


def test_inspector_rebuilds_a_warmup_request(live: LiveDashboard) -> None:
    reader = StoreReader(live.db)
    try:
        two = next(t for t in reader.recent_traces(50) if len(t["images"]) == 2)
    finally:
        reader.close()
    at = open_page("inspector", {"request": two["request_id"]})
    assert_clean(at)
    names = trace_names(figures(at)[0])
    assert sum(n.startswith("image ") for n in names) == 2
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Engine prompt_tokens"] == metrics["Engine expected"]
    hover = next(t for t in figures(at)[0]["data"] if t.get("name") == "blocks")
    assert any("hash " in h for h in hover["hovertext"])


def test_cache_routing_affinity_have_demo_traces(live: LiveDashboard) -> None:
    at = open_page("cache")
    assert figure_titled(at, "hit rate per worker")["data"]
    assert figure_titled(at, "KV events")["data"]
    assert figure_titled(at, "Prefix tree")["data"][0]["type"] == "icicle"
    assert len(figure_titled(at, "Predicted vs realized")["data"][1]["x"]) >= 10
    at = open_page("routing")
    assert any("router / auto_mixed" in n
               for n in trace_names(figure_titled(at, "processing mode")))
    at = open_page("affinity")
    assert sum(figures(at)[0]["data"][0]["link"]["value"]) >= 12


def test_lab_sends_a_request_and_records_it(live: LiveDashboard) -> None:
    at = open_page("lab")
    at.text_input(key="lab_size").set_value("320x240").run()
    at.selectbox(key="lab_sequence").set_value("repeat").run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    results = at.dataframe[0].value
    assert len(results) == 3
    assert (results["prompt_tokens"] > 0).all() and not results["error"].any()
    assert results["cached_tokens"].iloc[2] > results["prompt_tokens"].iloc[2] // 2
    comparison = at.dataframe[1].value
    assert (comparison["verdict"] == "equal").all()
    reader = StoreReader(live.db)
    try:
        assert reader.trace(results["request"].iloc[0]) is not None
    finally:
        reader.close()


def test_lab_runs_a_scenario(live: LiveDashboard) -> None:
    at = open_page("lab")
    at.selectbox(key="lab_sequence").set_value("scenario:repeat").run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    assert any(s.startswith("**pass**") for s in messages(at)["success"])
