"""Collectors against the embedded demo: the real SMG 1.13.0 router and simulated vLLM workers.

Starts `mmlens demo` on free loopback ports, runs `mmlens collect` (discovery from the ready
file, a short traced workload, the router's JSON log) and checks `mmlens snapshot --json`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner

from mmlens.cli import collect as collect_cli
from mmlens.cli import snapshot as snapshot_cli
from mmlens.config import Config, RouterTarget
from mmlens.store.sqlite import Store
from tests.live_support import demo_process, free_port_base, wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture(scope="module", params=["grpc", "http"])
def demo(request, tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp(f"demo-{request.param}")
    ready = tmp / "ready.json"
    args = ["--port-base", str(free_port_base(50)), "--connection", request.param,
            "--log-dir", str(tmp / "logs"), "--smg-log-level", "debug"]
    with demo_process(args, ready) as info:
        info["_tmp"], info["_ready"], info["_mode"] = tmp, ready, request.param
        yield info


def test_collect_then_snapshot(demo, capsys) -> None:
    tmp: Path = demo["_tmp"]
    (tmp / "mmlens.toml").write_text(f'interval_s = 1\n[demo]\nready_file = "{demo["_ready"]}"\n')
    db = tmp / "live.db"
    rc = collect_cli.main(["--config", str(tmp / "mmlens.toml"), "--db", str(db),
                           "--duration", "5", "--workload", "8", "--layout-model", "qwen3-vl",
                           "--router-log", f"smg={tmp / 'logs' / 'smg.log'}"])
    assert rc == 0
    capsys.readouterr()
    assert snapshot_cli.main(["--db", str(db), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)

    workers = {w["grpc"] if demo["_mode"] == "grpc" else w["http"] for w in demo["workers"]}
    assert {w["url"] for w in snap["router_state"][0]["workers"]} == workers
    assert snap["flavors"]["demo"] == ["smg"]
    rates = [h["hit_rate"] for h in snap["hit_rates"] if h["source"] == "vllm"]
    assert rates and max(r or 0 for r in rates) > 0
    served = {r["worker"]: r["count"] for r in snap["worker_requests"]}
    assert set(served) == workers and sum(served.values()) >= 8
    branches = snap["cache_aware_branches"]["demo"]
    assert sum(branches.values()) >= 8

    traces = snap["traces"]
    assert len(traces) == 8
    assert all(t["status"] == 200 and t["worker"] in workers for t in traces)
    assert all(t["prompt_tokens"] == 81 for t in traces)
    # The core's expected layout agrees with what SMG + the engine reported.
    assert all(t["expected_layout"]["engine_prompt_tokens"] == 81 for t in traces)
    assert all(t["expected_layout"]["router_view"]["token_count"] == 81 for t in traces)
    assert all(len(t["images"][0]["identities"]["smg_blake3"]) == 64 for t in traces)
    assert any(t["cached_tokens"] > 0 for t in traces)
    assert any(t["stream"] and t["ttft_s"] is not None for t in traces)
    sources = {p["source"] for t in traces for p in t["predictions"]}

    resident = snap["resident_blocks"]
    assert sum(r["blocks"] for r in resident.values()) > 0
    assert any(r["images"] for r in resident.values())
    endpoints = snap["kv_event_health"]["endpoints"]
    assert sum(e["batches"] for e in endpoints.values()) > 0
    assert all(not e["errors"] for e in endpoints.values())

    if demo["_mode"] == "grpc":
        assert snap["mm_processing"] and snap["mm_processing"][0]["count"] >= 8
        assert (snap["mm_processing"][0]["mode"], snap["mm_processing"][0]["reason"]) == (
            "router", "auto_mixed")
        assert branches.get("event_hit", 0) > 0
        assert {"header:x-smg-cache-trace", "log:Event-driven routing", "log:mm_timing"} <= sources
        assert all(t["processing_mode"] == "router" for t in traces)
        kv = snap["router_kv_event_health"]["demo"]["workers"]
        assert sum(w.get("batches", {}).get("applied", 0) for w in kv.values()) > 0
    else:
        # HTTP mode: the router routes on text only and sends no cache trace.
        assert "log:Cache-aware selection" in sources
        assert "header:x-smg-cache-trace" not in sources
    health = {(h["collector"], h["target"]): h for h in snap["health"]}
    assert health[("metrics", "demo")]["errors"] == {}
    assert health[("router_state", "demo")]["last_success"]

    # The lead collector rolled the workers' minutes up: the blocks their KV events stored.
    store = Store(db, readonly=True)
    try:
        minutes = store.worker_minutes(0.0)
        counts = store.kv_event_counts()
    finally:
        store.close()
    stored = {w: c["stored_blocks"] for w, c in counts.items() if c.get("stored_blocks")}
    assert {m.worker for m in minutes if m.kv_stored} == set(stored)
    assert sum(m.kv_stored for m in minutes) == sum(stored.values()) > 0
    assert health[("rollups", "worker_minutes")]["counters"]["minutes_written"] > 0


def test_discovery_from_smg_workers(demo, tmp_path) -> None:
    cfg = Config(routers=[RouterTarget("smg", "auto", demo["router"],
                                       metrics_url=demo["router_metrics"])])
    store = Store(tmp_path / "d.db")
    with httpx.Client() as client:
        runner = CollectorRunner(cfg, store, http=client)
        runner.setup()
        runner.tick()
        runner.close()
    expected = {w["url"] for w in demo["workers"]}
    assert {w.router_url for w in cfg.workers} == expected
    assert runner.discovery_health.counters["discovered_workers"] == 2
    assert store.meta("router_state")[0]["kind"] == "smg"
    store.close()


def test_live_gap_is_replayed_from_the_worker(demo, tmp_path) -> None:
    """The demo worker keeps a batch off its PUB socket (`/demo/kv/drop`); the collector sees
    the sequence gap and fetches the batch from the worker's ROUTER replay socket."""
    from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

    from mmlens.config import apply_ready

    cfg = Config()
    apply_ready(cfg, demo)
    store = Store(tmp_path / "g.db")
    with httpx.Client() as client:
        runner = CollectorRunner(cfg, store, http=client)
        runner.setup()
        runner.start_kv()
        # The collector's SUB sockets must have joined before the dropped batch, and PUB/SUB
        # gives no signal when they have.
        time.sleep(0.5)
        for w in demo["workers"]:
            client.post(w["http"] + "/demo/kv/drop", params={"count": 1}).raise_for_status()
        tracer = TraceClient(client)
        model = demo["models"][0]["id"]
        rng = random.Random(time.time_ns())
        for i in range(4):  # unseen image content each time: new blocks, a new batch each
            color = (rng.randrange(256), rng.randrange(256), 40 * i)
            tracer.send(demo["router"], model, "Describe this image in detail please.",
                        [ImagePart(solid_png(64, 64, color))])
        health = [ep.health for ep in runner.kv.endpoints]
        try:
            wait_until(lambda: sum(h.counters.get("replayed_batches", 0) for h in health),
                       10, 0.2, what="a batch replayed")
        finally:
            runner.close()
    assert sum(h.counters.get("gaps", 0) for h in health) >= 1, [h.counters for h in health]
    assert sum(h.counters.get("replayed_batches", 0) for h in health) >= 1
    assert all("unrecovered_gap" not in h.errors for h in health)
    store.close()
