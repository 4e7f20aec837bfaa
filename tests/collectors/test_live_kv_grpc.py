"""KV events read from the workers' SubscribeKvEvents streams while the real SMG 1.13 router
reads the same streams: every block the engines published is stored (0 lost), the workers'
health names the gRPC transport, and SMG's index (``smg_kv_index_blocks``) is compared with
the engines' holdings: equal for text, smaller for same-size images (SMG hashes token ids
only, so different images of one size share its entries)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner
from mmlens.demo.cluster import Cluster, ClusterConfig
from mmlens.demo.procs import write_ready

from mmlens.config import Config
from mmlens.store.reader import StoreReader
from mmlens.store.sqlite import Store
from tests.demo.support import chat, image_messages, png_data_url
from tests.live_support import free_port_base, started, wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]
MODEL = "Qwen/Qwen3-VL-2B-Instruct"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("kv-grpc")
    with started(lambda: Cluster(ClusterConfig(
            workers=2, port_base=free_port_base(50), num_blocks=48, speed=20.0,
            log_dir=tmp / "logs"))) as c:
        yield c


def _published(info: dict) -> dict[str, dict[str, int]]:
    return {w["url"]: httpx.get(f"{w['http']}/demo/kv/published", timeout=5).json()
            for w in info["workers"]}



def test_grpc_streams_lose_nothing_and_track_smg(cluster: Cluster, tmp_path: Path) -> None:
    info = cluster.ready_info()
    ready = tmp_path / "ready.json"
    write_ready(ready, info)
    cfg = Config(ready_file=str(ready), interval_s=0.5)
    cfg.demo_kv_transport = "grpc"
    store = Store(tmp_path / "kv.db")
    runner = CollectorRunner(cfg, store)
    runner.setup()
    runner.start_kv()
    try:
        assert {w.kv_transport for w in cfg.workers} == {"grpc"}
        # 48 blocks per worker: fourteen distinct text prompts of 6+ blocks each evict.
        for i in range(14):
            text = f"Story {i}: " + " ".join(f"word{i}x{k}" for k in range(40))
            assert chat(info["router"], MODEL, [{"role": "user", "content": text}]).status == 200
        pub = _published(info)
        assert sum(p["removed_blocks"] for p in pub.values()) > 0, "no eviction happened"

        def stored_all() -> bool:
            runner.tick()
            counts = store.kv_event_counts()
            return all(counts.get(w, {}).get("stored_blocks", 0) == p["stored_blocks"]
                       and counts.get(w, {}).get("removed_blocks", 0) == p["removed_blocks"]
                       for w, p in pub.items())

        wait_until(stored_all)
        health = {h.target: h for h in runner.kv_grpc.health}
        assert all(not h.errors and h.counters["transport_grpc"] == 1 for h in health.values())
        state = {s.worker: s for s in store.kv_state()}
        assert {s.transport for s in state.values()} == {"grpc"}
        for w in pub:  # a worker SMG sent nothing to has published nothing
            resident = state[w].resident_blocks if w in state else 0
            assert resident == pub[w]["stored_blocks"] - pub[w]["removed_blocks"]
        busy = {w for w, p in pub.items() if p["stored_blocks"]}

        # SMG's own index (smg_kv_index_blocks) against the engines' holdings.
        def views_agree() -> bool:
            runner.tick()
            rows = StoreReader(store.path).kv_views(0)
            last = {r[1]: r for r in rows if r[2] == "index_gauge"}
            return busy <= set(last) and all(r[5] == 0 and r[6] == 0 for r in last.values())

        wait_until(views_agree)

        # Same-size images of different colours: distinct engine blocks, shared SMG entries.
        for i in range(4):
            url = png_data_url(64, 64, (i * 50, 40, 200 - i * 40))
            assert chat(info["router"], MODEL, image_messages(url, "Same size")).status == 200

        def router_merges_images() -> bool:
            runner.tick()
            rows = StoreReader(store.path).kv_views(0)
            last = {r[1]: r for r in rows if r[2] == "index_gauge"}
            return any(r[6] > 0 and r[3] < r[4] for r in last.values())

        wait_until(router_merges_images)
    finally:
        runner.close()
        store.close()
