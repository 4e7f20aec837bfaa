"""The real Dynamo 1.6.1 router in its other modes: approximate (no KV events) and an engine
whose image-token count drifts from the router's estimate."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png
from mmlens.demo.dynamo_cluster import DynamoCluster

from mmlens.records import RequestTrace
from tests.dynamo.support import (
    LIVE_DYNAMO,
    applied_stored,
    decisions_for,
    running_dynamo,
    wait_router_indexed,
    worker_requests,
)

pytestmark = LIVE_DYNAMO

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
TEXT = "Describe this image in detail please."


def _send(cluster: DynamoCluster, tc: TraceClient, img: ImagePart, rid: str,
          text: str = TEXT) -> RequestTrace:
    t = tc.send(cluster.router_url, MODEL, text, [img], router_kind="dynamo", max_tokens=2,
                request_id=rid)
    assert t.status == 200, (t.status, t.error)
    decisions_for(cluster, t)
    return t


def _best(t: RequestTrace) -> tuple[int | None, int | None]:
    best = next(p for p in t.predictions if p.source == "log:routing_best")
    return best.overlap_blocks, best.request_blocks


def test_approximate_mode_predicts_whole_blocks(tmp_path: Any) -> None:
    with running_dynamo(workers=1, router_kv_events=False, log_dir=tmp_path / "logs",
                        model_cache=tmp_path / "models") as cluster, httpx.Client() as http:
        tc = TraceClient(http, sink=TraceSink(layout_model="qwen3-vl", block_size=16))
        img = ImagePart(solid_png(640, 480, (120, 10, 10)))
        before = applied_stored(cluster)
        first = _send(cluster, tc, img, "approx-1")
        # Approximate mode: the router's own insert of what it routed counts as applied too.
        wait_router_indexed(cluster, before)
        second = _send(cluster, tc, img, "approx-2")
        other = _send(cluster, tc, ImagePart(solid_png(640, 480, (10, 120, 10))), "approx-3")
        assert "--no-router-kv-events" in cluster._frontend_cmd()
    # The router inserts its own zero-padded view: a warm repeat is total/total (20/20) while
    # the engine can only have cached the 19 full blocks of its 317 tokens.
    assert _best(first) == (0, 20)
    assert _best(second) == (20, 20)
    timing = next(p for p in second.predictions if p.source == "nvext.timing")
    assert timing.kv_hit_rate == pytest.approx(1.0)
    assert (second.prompt_tokens, second.cached_tokens) == (317, 304)
    # Content-sensitive: block 0 already holds 12 pad values of the image, so a different
    # image of the same size shares nothing.
    assert _best(other) == (0, 20)


def test_engine_count_drift_is_visible(tmp_path: Any) -> None:
    text = TEXT + " Name every object, its colour, its position and anything unusual you see."
    with running_dynamo(workers=1, count_drift=[3], log_dir=tmp_path / "logs",
                        model_cache=tmp_path / "models") as cluster, httpx.Client() as http:
        tc = TraceClient(http, sink=TraceSink(layout_model="qwen3-vl", block_size=16))
        img = ImagePart(solid_png(640, 480, (10, 10, 120)))
        before = applied_stored(cluster)
        cold = _send(cluster, tc, img, "drift-1", text)
        wait_router_indexed(cluster, before)
        warm = _send(cluster, tc, img, "drift-2", text)
        records = worker_requests(cluster)
    expected = cold.expected_layout
    assert expected is not None and expected.engine_prompt_tokens is not None
    length = expected.engine_prompt_tokens  # mmlens' (and Dynamo's) expanded length
    assert expected.images[0].tokens == 300
    # The engine expanded 303 image tokens, not 300.
    assert cold.prompt_tokens == warm.prompt_tokens == length + 3
    assert all(r["matches_router_view"] is False for r in records)
    # The engine's own cache hits every full block of its longer prompt…
    assert warm.cached_tokens == (length + 3 - 1) // 16 * 16
    # …but its KV events match the router's view only up to the end of the image run
    # (tokens 0..303 → 19 whole blocks); every block after it is shifted by 3 tokens.
    overlap, total = _best(warm)
    assert total == math.ceil(length / 16)
    assert overlap == (4 + 300) // 16 < length // 16


@pytest.mark.parametrize("legacy", [False, True], ids=["map-events", "array-events"])
def test_vllm_zmq_events_normalized_by_dynamo(tmp_path: Any, legacy: bool) -> None:
    """Real vLLM's path: the engine publishes raw image-token runs with extra_keys
    (64-hex identifiers) on ZMQ; Dynamo's relay rewrites them to pad values itself."""
    with running_dynamo(workers=1, kv_path="vllm-zmq", zmq_legacy_encoding=legacy,
                        log_dir=tmp_path / "logs", model_cache=tmp_path / "models",
                        ) as cluster, httpx.Client() as http:
        tc = TraceClient(http, sink=TraceSink(layout_model="qwen3-vl", block_size=16))
        img = ImagePart(solid_png(640, 480, (60, 60, 160)))
        before = applied_stored(cluster)
        _send(cluster, tc, img, "zmq-1")
        wait_router_indexed(cluster, before)
        warm = _send(cluster, tc, img, "zmq-2")
        other = _send(cluster, tc, ImagePart(solid_png(640, 480, (160, 60, 60))), "zmq-3")
        relay = [json.loads(line) for line in
                 cluster.workers[0].log_path.read_text(errors="replace").splitlines()
                 if line.startswith('{"event": "kv_relay"')]
    assert relay and relay[0]["image_token_id"] == 151655
    assert _best(warm) == (19, 20) and warm.cached_tokens == 304
    assert _best(other) == (0, 20)
