"""Every page on the store that `mmlens dashboard --demo` fills: the real SMG router, simulated
workers, the collectors and the warm-up workload. The Lab sends real requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlens.records import RequestTrace
from mmlens.store.reader import StoreReader
from tests.live_support import wait_until
from tests.pages.apptest_util import (
    PAGES,
    assert_clean,
    chart_markup,
    drawn_decisions,
    frames,
    icicle_drawn,
    layout_drawn,
    lines_titled,
    messages,
    metrics,
    open_page,
    sankey_drawn,
    svg_bars,
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


def _judged_false_hits(db: Path) -> int:
    reader = StoreReader(db)
    try:
        return reader.verdict_counts(0.0).get("false_hit", 0)
    finally:
        reader.close()


def test_overview_shows_demo_numbers(live: LiveDashboard) -> None:
    # The verdict job judges a request once it has settled: the page shows the alert only
    # once the warm-up's false hit is judged, which on a loaded machine can come after the
    # fixture's warm-up data.
    wait_until(lambda: _judged_false_hits(live.db) >= 1, 60, 0.5,
               what="the warm-up's false hit judged")
    at = open_page("overview")
    shown = metrics(at)
    assert shown["Engine hit rate (token-weighted)"] != "—"
    # Two demo routers over the same workers: one in router mode, one in worker mode.
    assert shown["Image requests in router mode"] not in ("—", "0%", "100%")
    assert shown["Image requests in worker mode"] not in ("—", "0%", "100%")
    # The warm-up's blue image after red, same size: SMG predicts, the engine misses. That
    # deliberate false hit is the one alert a healthy demo raises.
    text = messages(at)
    raised = [m for m in text["warning"] + text["error"] if "firing since" in m]
    assert len(raised) == 1 and raised[0].startswith("**false_hits**"), raised
    assert not any("kv_view_divergence" in c.value for c in at.caption)  # not even pending
    targets = next(df for df in frames(at) if "last success (s ago)" in df)
    assert not {"stale", "down"} & set(targets["state"]), targets.to_dict("records")
    assert svg_bars(at, "hit rate per worker")["y"]


def test_inspector_rebuilds_a_warmup_request(live: LiveDashboard) -> None:
    reader = StoreReader(live.db)
    try:
        # A warm-up request: it keeps its (fixed) prompt text, so the inspector rebuilds its
        # hashes; a Lab request sent by another test keeps none by default.
        two = next(t for t in reader.recent_traces(200) if len(t.images) == 2
                   and t.expected_layout is not None and t.expected_layout.text)
    finally:
        reader.close()
    at = open_page("inspector", {"request": two.request_id})
    assert_clean(at)
    names = trace_names(layout_drawn(at))
    assert sum(n.startswith("image ") for n in names) == 2
    shown = metrics(at)
    assert shown["Engine prompt_tokens"] == shown["Engine expected"]
    hover = next(t for t in layout_drawn(at)["data"] if t.get("name") == "blocks")
    assert any("hash " in h for h in hover["hovertext"])


def test_cache_routing_affinity_have_demo_traces(live: LiveDashboard) -> None:
    at = open_page("cache")
    assert lines_titled(at, "hit rate per worker")["data"]
    assert any(y > 0 for y in svg_bars(at, "KV events")["y"])
    assert len(icicle_drawn(chart_markup(at, "Prefix tree"))["ids"]) > 1
    assert sum(len(t["x"]) for t in lines_titled(at, "Predicted vs realized")["data"]) >= 10
    at = open_page("routing")
    names = svg_bars(at, "processing mode")["series"]
    assert any("router / config" in n for n in names)
    assert any("worker / config" in n for n in names)
    at = open_page("affinity")
    assert sum(sankey_drawn(at)["value"]) >= 12


def test_lab_sends_a_request_and_records_it(live: LiveDashboard) -> None:
    at = open_page("lab")
    at.text_input(key="lab_size").set_value("320x240").run()
    at.number_input(key="lab_count").set_value(1).run()
    at.selectbox(key="lab_sequence").set_value("repeat").run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    # Verdicts are the collector's, stored once the requests settled: rerun until they are.
    wait_until(lambda: "pending" not in set(at.run().dataframe[0].value["verdict"]), 60, 1.0,
               what="the Lab's verdicts stored")
    results = at.dataframe[0].value
    assert len(results) == 3
    assert (results["prompt"] > 0).all() and not results["error"].any()
    assert results["cached"].iloc[2] > results["prompt"].iloc[2] // 2
    assert results["verdict"].iloc[2] == "hit"
    assert set(results["worker"]) <= {"w1", "w2"}  # the config's names
    reader = StoreReader(live.db)
    try:
        assert reader.trace(results["request"].iloc[0]) is not None
    finally:
        reader.close()


def test_lab_compares_router_and_worker_mode(live: LiveDashboard) -> None:
    at = open_page("lab")
    at.selectbox(key="lab_sequence").set_value("once").run()
    at.toggle(key="lab_compare").set_value(True).run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "engine prompt_tokens (observed)" in
                 d.value.columns).set_index("router")
    assert set(table["mode"]) == {"router", "worker"}
    observed = table["engine prompt_tokens (observed)"]
    assert observed["demo"] == observed["demo-worker"] == table["expected prompt_tokens"]["demo"]
    # Worker mode routes on one placeholder per image: far fewer ids than router mode.
    routed = table["router routed on (tokens)"]
    assert routed["demo-worker"] < routed["demo"]
    assert any("in every mode" in i for i in messages(at)["info"])


def test_lab_runs_a_scenario(live: LiveDashboard) -> None:
    at = open_page("lab")
    at.selectbox(key="lab_sequence").set_value("scenario:repeat").run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    text = messages(at)
    verdicts = [s for s in text["success"] + text["error"] if s.startswith("**")]
    # Both demo workers hold long image-token prefixes (the warm-up spread them), and the
    # scenario's short text leaves its last block partial: SMG's content-blind score can tie
    # between the workers, so a repeat may go elsewhere. The Lab says which and why.
    assert verdicts and (verdicts[0].startswith("**pass**")
                         or "went to different workers" in verdicts[0]), text


def test_lab_url_scenario_through_the_worker_mode_router_uses_the_demo_origin(
        live: LiveDashboard) -> None:
    """The targets carry the demo's media origin; through the worker-mode router the workers
    fetch the identity scenario's URL images, from that origin (the only host they allow)."""
    reader = StoreReader(live.db)
    try:
        routers = {r["name"]: r for r in reader.meta("targets")["routers"]}
    finally:
        reader.close()
    origin = routers["demo-worker"]["media_origin"]
    assert origin and origin == routers["demo"]["media_origin"]
    at = open_page("lab")
    at.selectbox(key="lab_router").set_value("demo-worker").run()
    at.selectbox(key="lab_sequence").set_value("scenario:identity").run()
    at.button(key="lab_send").click().run()
    assert_clean(at)
    text = messages(at)
    verdicts = [s for s in text["success"] + text["error"] + text["warning"]
                if s.startswith("**")]
    assert verdicts and verdicts[0].startswith("**pass**"), text


def _traces_with_logged_candidates(db: Path, timeout: float = 30.0) -> list[RequestTrace]:
    """Warm-up traces (written straight to the store by the Lab's sender) that the collector's
    log follower has since matched with SMG's "Cache routing dispatch" lines."""

    def found() -> list[RequestTrace]:
        reader = StoreReader(db)
        try:
            return [t for t in reader.recent_traces(100) if any(
                p.source == "log:cache_trace" and p.candidates for p in t.predictions)]
        finally:
            reader.close()

    return wait_until(found, timeout, 1.0, what="traces with SMG's logged candidates")


def test_warmup_decisions_show_real_smg_candidates(live: LiveDashboard) -> None:
    traces = _traces_with_logged_candidates(live.db)
    assert len(traces) >= 10
    logged = [p for t in traces for p in t.predictions if p.source == "log:cache_trace"]
    # Two simulated workers behind the real SMG 1.13: both are candidates every time.
    assert all(len(p.candidates) == 2 for p in logged)
    assert all(c.healthy is True for p in logged for c in p.candidates)
    assert {p.policy for p in logged} == {"cache_aware"}
    assert {"expected_wait"} <= {s.source for p in logged for s in p.scores}
    hits = [p for p in logged if p.branch == "event_hit"]
    assert hits and all(p.gates and "policy_affinity" in {s.source for s in p.scores}
                        for p in hits)

    at = open_page("routing")
    assert_clean(at)
    rows = drawn_decisions(at).set_index("request")
    hit = next(t for t in traces if any(p in hits for p in t.predictions))
    row = rows.loc[hit.request_id]
    assert row["candidates"].count(" load ") == 2
    assert "affinity" in row["scores"] and "→ " in row["gates"]
    at = open_page("inspector", {"request": hit.request_id})
    assert_clean(at)
    candidates = next(d for d in frames(at) if "chosen" in d.columns)
    assert len(candidates) == 2 and candidates["chosen"].sum() == 1
