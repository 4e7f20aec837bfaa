"""SGLang workers beside vLLM workers behind the real SMG 1.13 router (gRPC mode).

The SGLang flavour serves `sglang.grpc.scheduler.SglangScheduler`, so SMG registers it with
`runtime_type: sglang` and routes to it; it keys images by SGLang's pad values (no extra
keys), hashes pages SGLang's way (signed int64 on the wire) and exports `sglang:*` metrics.
mmlens stores every block both engines publish, over ZMQ and over the gRPC streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
from mmlens.collectors.runner import CollectorRunner
from mmlens.demo.cluster import Cluster, ClusterConfig
from mmlens.demo.procs import write_ready
from mmlens.demo.sglang_service import MM_PAD_SHIFT_VALUE

from mmlens.config import Config
from mmlens.ingest.metrics_normalize import normalize_samples
from mmlens.store.sqlite import Store
from tests.demo.support import KvSubscriber, chat, image_messages, png_data_url
from tests.live_support import free_port_base, started, wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]
MODEL = "Qwen/Qwen3-VL-2B-Instruct"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with started(lambda: Cluster(ClusterConfig(
            workers=2, engine="vllm,sglang", port_base=free_port_base(50), speed=5.0))) as c:
        yield c


def _published(info: dict) -> dict[str, dict[str, int]]:
    return {w["url"]: httpx.get(f"{w['http']}/demo/kv/published", timeout=5).json()
            for w in info["workers"]}


def _serve_both(info: dict, salt: str = "") -> dict[str, str]:
    """Send pairs of new prompts at once until SMG has used both workers: a system line
    nobody sent before leaves nothing to match (SMG is blind to the images themselves), so
    load decides where the second of a pair goes. Returns worker URL → engine."""
    engines = {w["url"]: w["engine"] for w in info["workers"]}
    served: set[str] = set()

    def send(k: int, i: int) -> object:
        return chat(info["router"], MODEL, image_messages(
            png_data_url(64, 64, (40 * k % 256, 90 * i, 200)), "Describe",
            system=f"Session {salt} {k}.{i}"), max_tokens=24)

    for k in range(6):
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda i, k=k: send(k, i), range(2)))
        assert all(r.status == 200 for r in results), [r.body for r in results]
        served |= {r.worker for r in results if r.worker}
        if served == set(engines):
            return engines
    pytest.fail(f"SMG used only {served}")


def test_smg_registers_and_routes_to_sglang(cluster: Cluster) -> None:
    info = cluster.ready_info()
    listed = httpx.get(f"{info['router']}/workers", timeout=5).json()["workers"]
    runtime = {w["url"]: w["runtime_type"] for w in listed}
    assert runtime == {w["url"]: w["engine"] for w in info["workers"]}
    assert set(runtime.values()) == {"vllm", "sglang"}
    _serve_both(info)
    sg = next(w for w in info["workers"] if w["engine"] == "sglang")
    seen = httpx.get(f"{sg['http']}/demo/requests", timeout=5).json()
    assert seen and all("image_data" in e["mm_fields"] and e["im_token_id"] == 151655
                        for e in seen)
    # SGLang's image identity: a pad value per image content written into the ids.
    assert all(len(e["pad_values"]) == 1 and e["pad_values"][0] >= MM_PAD_SHIFT_VALUE
               for e in seen)
    metrics = httpx.get(sg["metrics"], timeout=5).text
    assert "sglang:prompt_tokens_total{" in metrics and "vllm:" not in metrics


def test_sglang_zmq_events_are_signed_pages_without_extra_keys(cluster: Cluster) -> None:
    info = cluster.ready_info()
    sg = next(w for w in info["workers"] if w["engine"] == "sglang")
    sub = KvSubscriber(sg["kv_events"], sg["kv_replay"])
    try:
        got = sub.replay(0)
    finally:
        sub.close()
    assert got, "the SGLang worker published nothing yet"
    batch = msgspec.msgpack.decode(got[0][1])
    assert isinstance(batch, list) and len(batch) == 3  # [ts, events, attn_dp_rank]
    stored = [e for e in batch[1] if e[0] == "BlockStored"]
    assert stored and all(len(e) == 7 and len(e[1]) == 1 for e in stored)  # one page each
    hashes = [h for e in stored for h in e[1]]
    assert all(-(1 << 63) <= h < 1 << 63 for h in hashes)


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
def test_both_engines_stored_without_loss(cluster: Cluster, tmp_path: Path,
                                          transport: str) -> None:
    info = cluster.ready_info()
    write_ready(tmp_path / "ready.json", info)
    cfg = Config(ready_file=str(tmp_path / "ready.json"), interval_s=0.5)
    cfg.demo_kv_transport = transport
    store = Store(tmp_path / "both.db")
    runner = CollectorRunner(cfg, store)
    runner.setup()
    runner.start_kv()
    try:
        _serve_both(info, transport)
        pub = _published(info)

        def stored_all() -> bool:
            runner.tick()
            counts = store.kv_event_counts()
            return all(counts.get(w, {}).get("stored_blocks", 0) == p["stored_blocks"]
                       for w, p in pub.items())

        wait_until(stored_all, 15, what="every published block stored")
        assert all(not h.errors for h in runner.all_health() if h.collector == "kv_events")
        assert {s.transport for s in store.kv_state()} == {transport}
        rates = normalize_samples(store.samples_since(0)).hit_rates
        assert {r.source for r in rates} >= {"vllm", "sglang"}
    finally:
        runner.close()
        store.close()
