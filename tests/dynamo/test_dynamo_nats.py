"""Dynamo in production shape: the real 1.6.1 frontend and simulated workers on etcd discovery
and the NATS event plane (the demo's own etcd and nats-server, loopback only).

mmlens hears the router's view on NATS and the engines' own vLLM-format ZMQ streams: every
block published is counted on both (0 lost), a real eviction (a 48-block cache overflowing)
reaches both views so they agree; with the router in approximate mode the same eviction shows
as blocks the router believes resident that the engine evicted, and the alert fires.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner
from mmlens.collectors.traces import TraceClient
from mmlens.demo.dynamo_cluster import DynamoCluster
from mmlens.demo.dynamo_env import infra_missing
from mmlens.demo.procs import write_ready

from mmlens.analysis.kv_divergence import alerts, prediction_points
from mmlens.config import Config
from mmlens.store.reader import StoreReader
from mmlens.store.sqlite import Store
from tests.dynamo.support import LIVE_DYNAMO, listeners, running_dynamo, worker_requests
from tests.live_support import wait_until

pytestmark = [*LIVE_DYNAMO, pytest.mark.slow,
              pytest.mark.skipif(infra_missing() is not None, reason=str(infra_missing()))]
MODEL = "Qwen/Qwen3-VL-2B-Instruct"


def _prompt(i: int) -> str:
    return f"Story {i}: " + " ".join(f"word{i}x{k}" for k in range(40))


def _send(router: str, text: str) -> dict:
    r = httpx.post(f"{router}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    return r.json()


def _published(cluster: DynamoCluster) -> dict[str, dict]:
    """Per worker id: what its engine published, from its last request record."""
    last: dict[str, dict] = {}
    for rec in worker_requests(cluster):
        last[str(rec["worker_id"])] = rec["kv_published"]
    return last


def test_nats_plane_loses_nothing_and_agrees_with_the_engines(tmp_path: Path) -> None:
    with running_dynamo(workers=2, num_blocks=48, event_plane="nats", speed=20.0) as cluster:
        info = cluster.ready_info()
        assert info["event_plane"].startswith("nats://127.0.0.1:")
        pids = [p.popen.pid for p in cluster.procs]
        assert {a for a, _, _ in listeners(pids)} == {"127.0.0.1"}
        write_ready(tmp_path / "ready.json", info)
        store = Store(tmp_path / "nats.db")
        runner = CollectorRunner(Config(ready_file=str(tmp_path / "ready.json")), store)
        runner.setup()
        runner.start_kv()
        try:
            plane = runner.planes[0]
            assert plane.ready.is_set()  # start_kv waited for the subscription
            for i in range(14):  # 6 blocks each: 48-block caches evict
                _send(info["router"], _prompt(i))
            pub = _published(cluster)
            assert sum(p["dynamo"]["removed_blocks"] for p in pub.values()) > 0

            def all_counted() -> bool:
                runner.tick()
                routed = {s["worker"]: s for s in runner.router_view.summary().values()}
                stored = store.kv_event_counts()
                return all(
                    routed.get(w, {}).get("stored", 0) == p["dynamo"]["stored_blocks"]
                    and routed.get(w, {}).get("removed", 0) == p["dynamo"]["removed_blocks"]
                    and stored.get(w, {}).get("stored_blocks", 0) == p["zmq"]["stored_blocks"]
                    and stored.get(w, {}).get("removed_blocks", 0) == p["zmq"]["removed_blocks"]
                    for w, p in pub.items())

            wait_until(all_counted, 15, what="every published block counted on NATS and ZMQ")
            assert all(p["dynamo"]["dropped"] == 0 for p in pub.values())
            assert not plane.health.errors and plane.health.counters.get("gaps", 0) == 0

            def views_agree() -> bool:
                runner.tick()
                rows = StoreReader(store.path).kv_views(0)
                last = {r[1]: r for r in rows if r[2] == "event_plane"}
                return set(pub) <= set(last) and all(
                    r[5] == 0 and r[6] == 0 and r[3] == r[4] for r in last.values())

            wait_until(views_agree, 10, what="router view equal to the engines' holdings")
        finally:
            runner.close()
            store.close()


def test_approximate_router_keeps_blocks_the_engine_evicted() -> None:
    with running_dynamo(workers=1, num_blocks=24, event_plane="nats", speed=20.0,
                        router_kv_events=False) as cluster:
        router = cluster.ready_info()["router"]
        with httpx.Client() as client:
            tracer = TraceClient(client)
            seed = tracer.send(router, MODEL, _prompt(0), router_kind="dynamo")
            for i in range(1, 6):  # the only worker's 24 blocks overflow: the seed is evicted
                tracer.send(router, MODEL, _prompt(i), router_kind="dynamo")
            again = tracer.send(router, MODEL, _prompt(0), router_kind="dynamo")
        # The engine really evicted (its own ZMQ stream says so); the router was told nothing.
        last = worker_requests(cluster)[-1]["kv_published"]
        assert last["zmq"]["removed_blocks"] > 0 and last["dynamo"]["stored_blocks"] == 0
        points = prediction_points([seed, again])
        assert points[-1].router_only >= 4, points  # predicted from its own tree, not cached
        assert again.cached_tokens < 16
        found = alerts(points)
        assert found and found[0].source == "prediction" and "evicted" in found[0].message
