"""The Cache page's router-view-vs-engine section and the Overview's worker liveness, on a
store written through the store's own API (what `mmlens collect` writes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.records import CollectorHealth, MetricSample, labels_of
from mmlens.store.sqlite import Store
from tests.pages.apptest_util import (
    assert_clean,
    block_texts,
    frames,
    lines_titled,
    messages,
    open_page,
)

REG = "dynamo_component_router_worker_registered"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    now = time.time()
    path = tmp_path / "views.db"
    store = Store(path)
    store.add_samples([
        MetricSample("demo", REG, labels_of({"router_worker_id": "111"}), 1.0, now - 20),
        MetricSample("demo", REG, labels_of({"router_worker_id": "222"}), 1.0, now - 20),
        MetricSample("demo", REG, labels_of({"router_worker_id": "111"}), 1.0, now - 10),
    ])
    store.set_kv_state({"111#0": {"worker": "111", "rank": 0, "resident_blocks": 40,
                                  "transport": "zmq"}}, now)
    health = CollectorHealth("metrics", "demo")
    health.ok(now - 10)
    store.set_health([health], now)
    store.add_kv_views([ViewPoint(now - 60, "111", "event_plane", 30, 30, 0, 0),
                        ViewPoint(now - 50, "111", "event_plane", 40, 28, 12, 0),
                        ViewPoint(now - 10, "111", "event_plane", 40, 28, 12, 0)])
    store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    return path


def test_cache_page_shows_router_only_blocks_and_alerts(db: Path) -> None:
    at = open_page("cache")
    assert_clean(at)
    fig = lines_titled(at, "Router view vs engine holdings")
    router_only = next(t for t in fig["data"] if "router only" in t["name"])
    assert list(router_only["y"]) == [0, 12, 12]
    assert any("12 block(s) the router believes resident" in m
               for m in messages(at)["warning"])


def test_overview_shows_a_gone_worker_with_since_when(db: Path) -> None:
    at = open_page("overview")
    assert_clean(at)
    text = messages(at)
    assert any("worker_gone" in m and "222" in m for m in text["warning"])
    # Diverging for 50 s, past its 30 s hold: firing (with since when), not pending.
    assert any("kv_view_divergence" in m and "firing since" in m for m in text["warning"])
    table = next(df for df in frames(at) if "KV transport" in df.columns)
    states = dict(zip(table["worker"], table["state"], strict=True))
    assert states == {"111": "live", "222": "gone"}
    assert table.set_index("worker").loc["111", "KV transport"] == "zmq"


def test_cache_page_folds_a_fleets_view_table_and_keeps_every_row_one_toggle_away(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    path = tmp_path / "fleet-views.db"
    store = Store(path)
    workers = [f"w{i:02d}" for i in range(20)]  # more than the 12 a fleet view names
    store.add_kv_views([ViewPoint(now - 10, w, "event_plane", 100, 100 - i, i, 0)
                        for i, w in enumerate(workers)])
    store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    at = open_page("cache")
    assert_clean(at)
    assert not at.get("dataframe")  # no data grid for a new tab to load
    (table,) = [df for df in frames(at) if "router only" in df.columns]
    assert list(table["worker"]) == [*workers[8:], "8 other workers"]  # the chart's workers
    assert table["router only"].iloc[-1] == sum(range(8))
    assert table["engine blocks"].iloc[-1] == sum(100 - i for i in range(8))
    assert any("12 workers whose views differ most" in t for t in block_texts(at))
    at.toggle(key="views_all").set_value(True).run()
    (everything,) = [df for df in frames(at) if "router only" in df.columns
                     and len(df) == len(workers)]
    assert sorted(everything["worker"]) == workers
    assert dict(zip(everything["worker"], everything["router only"], strict=True)) == {
        w: i for i, w in enumerate(workers)}
