"""Available vs achieved on the Dynamo demo: the real Dynamo 1.6.1 frontend routes images
exactly (per-image pad values), so once its index holds a request's blocks, a repeat goes to
the worker holding them and nothing is avoidable. mmlens reads the workers' own KV events
(image runs in pad-value form, identity in extra_keys as Dynamo's mm_hash)."""

from __future__ import annotations

from pathlib import Path

import httpx
from mmlens.collectors.runner import CollectorRunner
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

from mmlens.config import Config, apply_ready
from mmlens.store.open import open_store
from tests.dynamo.support import LIVE_DYNAMO, applied_stored, running_dynamo, wait_router_indexed
from tests.live_support import wait_until

pytestmark = LIVE_DYNAMO

TEXT = "Describe this image in detail please."
RED, BLUE = (200, 30, 30), (30, 30, 200)


def test_exact_routing_leaves_nothing_avoidable(tmp_path: Path) -> None:
    with running_dynamo() as cluster:
        info = cluster.ready_info()
        cfg = Config()
        apply_ready(cfg, info)
        store = open_store(str(tmp_path / "dynamo.db"))
        runner = CollectorRunner(cfg, store)
        runner.setup()
        runner.start_kv()
        model, model_dir = info["models"][0]["id"], info["models"][0]["path"]
        client = httpx.Client(timeout=120)
        tracer = TraceClient(client, sink=TraceSink(store.add_traces, layout_model=model_dir))

        def send(color: tuple[int, int, int]):
            return tracer.send(info["router"], model, TEXT,
                               [ImagePart(solid_png(640, 480, color))], router_kind="dynamo",
                               max_tokens=4)

        def stored_blocks() -> int:
            runner.tick()
            return sum(v.get("stored_blocks", 0) for v in store.kv_event_counts().values())

        try:
            send((9, 9, 9))
            wait_until(stored_blocks, 15, what="the warm-up request's KV events stored")
            seeds = []
            for color in (RED, BLUE):
                before = applied_stored(cluster)
                seeds.append(send(color))
                wait_router_indexed(cluster, before)
            repeats = [send(RED), send(BLUE)]
            runner.flush()
            found = {r.request_id: r for r in store.availability_rows(0.0)}
        finally:
            runner.close()
            client.close()
            store.close()
    assert {t.request_id for t in seeds + repeats} <= set(found)
    for r in found.values():
        assert r.avoidable_tokens == 0 and r.causes == {}, r
        assert r.fidelity == "exact" and r.identities_resolved and r.false_hit_tokens == 0
    for seed, repeat in zip(seeds, repeats, strict=True):
        got = found[repeat.request_id]
        assert repeat.worker == seed.worker
        cacheable = (got.prompt_tokens - 1) // 16 * 16
        assert got.available == {seed.worker: cacheable}
        assert got.best_tokens == got.realized_tokens == cacheable > 0
