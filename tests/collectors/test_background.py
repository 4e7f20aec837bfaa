"""Collectors running in-process on a thread while a reader opens the same store."""

from __future__ import annotations

from mmlens.collectors.background import start_background

from mmlens.config import Config, RouterTarget
from mmlens.state import Snapshot
from mmlens.store.reader import StoreReader
from mmlens.store.snapshot import build_snapshot
from tests.collectors.loopback import Loopback, Route
from tests.fixtures_path import capture
from tests.live_support import wait_until


def test_background_collectors_and_concurrent_reader(tmp_path) -> None:
    routes = {"/metrics": Route(capture("smg_http_metrics.txt")),
              "/workers": Route(capture("smg_http_workers.txt"), content_type="application/json"),
              "/v1/models": Route(capture("smg_http_v1_models.txt"),
                                  content_type="application/json")}
    with Loopback(routes) as lb:
        cfg = Config(routers=[RouterTarget("smg", "smg", lb.url, metrics_url=lb.url + "/metrics")],
                     interval_s=0.2)
        bg = start_background(cfg, tmp_path / "bg.db")
        reader = None

        def collected() -> Snapshot | None:
            nonlocal reader
            assert bg.running
            if not (tmp_path / "bg.db").exists():
                return None
            reader = reader or StoreReader(tmp_path / "bg.db")
            snap = build_snapshot(reader)
            return snap if snap.metrics.cache_aware_branches and snap.router_state else None

        try:
            snap = wait_until(collected, 10, what="branches and router state in the store")
            assert snap.metrics.cache_aware_branches["smg"] == {"tree_match": 5.0,
                                                                "expected_wait_fallback": 2.0}
            assert [w["url"] for w in snap.router_state[0]["workers"]] == [
                "http://127.0.0.1:18002", "http://127.0.0.1:18001"]
        finally:
            bg.stop()
            if reader is not None:
                reader.close()
    assert not bg.running


def test_a_crashed_background_loop_is_restarted_and_reported(tmp_path, monkeypatch) -> None:
    from mmlens.collectors import runner as runner_mod

    calls: list[int] = []
    real_setup = runner_mod.CollectorRunner.setup

    def flaky_setup(self) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk full")
        real_setup(self)

    monkeypatch.setattr(runner_mod.CollectorRunner, "setup", flaky_setup)
    bg = start_background(Config(interval_s=0.1), tmp_path / "bg.db")
    try:
        wait_until(lambda: len(calls) >= 2 and bg.runner.ticks > 0, 10,
                   what="a second runner ticking")
        h = bg.runner.supervisor_health
        assert h.counters["restarts:collectors"] == 1
        assert "disk full" in (h.last_error or "")
        assert bg.running
    finally:
        bg.stop()
