"""The founding Dynamo cases on the real 1.6.1 frontend: Kimi-K3 routing-side expansion with
two-worker A/B/A/B affinity, and GLM-5.3-Flash falling back to text-prefix routing."""

from __future__ import annotations

from typing import Any

import httpx
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png
from mmlens.demo.dynamo_cluster import DynamoCluster

from mmlens.ingest.dynamo_logs import model_mm_routing, support_for
from mmlens.records import RequestTrace
from tests.dynamo.support import (
    LIVE_DYNAMO,
    applied_stored,
    decisions_for,
    one,
    overlapping_seeds,
    running_dynamo,
    wait_router_indexed,
    worker_requests,
)

pytestmark = LIVE_DYNAMO

TEXT = "Describe this image in detail please."


def _send(cluster: DynamoCluster, tc: TraceClient, img: ImagePart, rid: str,
          max_tokens: int = 2, need: tuple[str, ...] = ("log:routing_best",)) -> RequestTrace:
    t = tc.send(cluster.router_url, cluster.model.served_name, TEXT, [img],
                router_kind="dynamo", max_tokens=max_tokens, request_id=rid)
    assert t.status == 200, (t.status, t.error)
    decisions_for(cluster, t, need)
    return t


def _verdict(cluster: DynamoCluster) -> Any:
    lines = cluster.frontend_log.read_text(errors="replace").splitlines()
    return support_for(model_mm_routing(lines), cluster.model.served_name)


def test_kimi_k3_exact_routing_and_abab_affinity(tmp_path: Any) -> None:
    with running_dynamo(family="kimi-k3", speed=0.2, log_dir=tmp_path / "logs",
                        model_cache=tmp_path / "models") as cluster, httpx.Client() as http:
        assert "basetenkenizer" in cluster._frontend_cmd()
        tc = TraceClient(http, sink=TraceSink(layout_model="kimi-k3", block_size=16))
        a = ImagePart(solid_png(640, 480, (200, 30, 30)))
        b = ImagePart(solid_png(640, 480, (30, 30, 200)))
        before = applied_stored(cluster)
        sa, sb = overlapping_seeds(lambda: _send(cluster, tc, a, "k3-A-seed", 160),
                                   lambda: _send(cluster, tc, b, "k3-B-seed", 16), cluster)
        seeds = {"A": sa, "B": sb}
        wait_router_indexed(cluster, before)
        replays = [(k, _send(cluster, tc, img, f"k3-{k}-{i}"))
                   for i, (k, img) in enumerate((("A", a), ("B", b), ("A", a), ("B", b)))]
        sizes = [(224, 224), (640, 480), (1024, 768), (1920, 1080), (4000, 3000)]
        counted = [_send(cluster, tc, ImagePart(solid_png(w, h, (9, 99, 199))), f"k3-{w}x{h}",
                         1, ("log:mm_image_tokens", "log:routing_best")) for w, h in sizes]
        verdict = _verdict(cluster)
        records = worker_requests(cluster)
    assert verdict and verdict.exact is True and verdict.spec == "kimi_k3"
    # Router-side expansion: the dims-bearing media block the router built is exactly the
    # one the simulated engine built (N = 414 pads for 640x480, plus the dims text).
    assert records and all(r["matches_router_view"] is True for r in records)
    assert seeds["A"].worker != seeds["B"].worker
    for key, t in replays:
        seed = seeds[key]
        assert t.worker == seed.worker, (t.request_id, t.worker, seed.worker)
        overlap = one(t, "log:routing_best")
        assert overlap.request_blocks is not None and overlap.overlap_blocks is not None
        assert overlap.overlap_blocks == t.prompt_tokens // 16 == overlap.request_blocks - 1
        assert t.cached_tokens == (t.prompt_tokens - 1) // 16 * 16 > t.prompt_tokens // 2
    # mmlens' Kimi-K3 formula equals Dynamo's logged count (and SMG's, per the family).
    for (w, h), t in zip(sizes, counted, strict=True):
        assert t.expected_layout is not None and t.expected_layout.images
        mine = t.expected_layout.images[0].tokens
        assert one(t, "log:mm_image_tokens").image_tokens == [mine], (w, h)


def test_glm_falls_back_to_text_prefix_with_reasons(tmp_path: Any) -> None:
    with running_dynamo(family="glm-5.3-flash", log_dir=tmp_path / "logs",
                        model_cache=tmp_path / "models") as cluster, httpx.Client() as http:
        tc = TraceClient(http, sink=TraceSink(layout_model="glm-5.3-flash", block_size=16))
        img = ImagePart(solid_png(640, 480, (5, 150, 5)))
        t = _send(cluster, tc, img, "glm-1", need=("log:routing_best", "log:mm_fallback"))
        verdict = _verdict(cluster)
        records = worker_requests(cluster)
    assert verdict and verdict.exact is False
    assert any("no image processor registered" in r and "glm53_flash" in r
               for r in verdict.reasons)
    reasons = " | ".join(w for p in t.predictions if p.source == "log:mm_fallback"
                         for w in p.warnings)
    assert "skipping mm_hashes forwarding" in reasons
    assert not [p for p in t.predictions if p.source == "log:mm_image_tokens"]
    # The router saw only the rendered text; the engine expanded the image itself.
    best = one(t, "log:routing_best")
    rendered = records[0]["rendered_tokens"]
    assert best.request_blocks == -(-rendered // 16)
    assert records[0]["mm_hashes"] == [] and t.prompt_tokens > rendered
