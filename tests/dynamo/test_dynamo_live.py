"""The real Dynamo 1.6.1 frontend and KV router in front of mmlens' simulated vLLM workers.

Every assertion is checked against Dynamo's own outputs: `nvext.worker_id` in responses, the
frontend's JSON log (`image-token count`, `[ROUTING] Best … X/Y`, `Selected worker`,
`mm_routing` fallback warnings) and its `/metrics`; mmlens' side is what its collectors
(`TraceClient`, router-log parser, metrics scraper + normalizer) recorded.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import httpx
import pytest
from mmlens.collectors.media_upload import upload
from mmlens.collectors.metrics_scrape import MetricsScraper
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png
from mmlens.demo.dynamo_cluster import DynamoCluster
from mmlens.demo.media_origin import ORIGIN_HOST

from mmlens.ingest.metrics_normalize import detect_flavors, normalize_samples
from mmlens.records import RequestTrace
from tests.dynamo.media_server import MediaServer, media_server
from tests.dynamo.support import (
    LIVE_DYNAMO,
    applied_stored,
    decisions_for,
    listeners,
    one,
    overlapping_seeds,
    running_dynamo,
    wait_router_indexed,
    worker_requests,
)
from tests.live_support import wait_until

pytestmark = LIVE_DYNAMO

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
TEXT = "Describe this image in detail please."
BLOCK = 16

# 24 sizes: tiny (upscaled to the 65536-pixel floor), odd, extreme aspect, rounding-half
# cases (720/32 = 22.5) and large ones.
SIZES = [(17, 29), (64, 64), (100, 100), (224, 224), (256, 256), (257, 255), (336, 336),
         (500, 37), (37, 500), (640, 480), (480, 640), (800, 600), (1000, 300), (1023, 769),
         (1024, 768), (1024, 1024), (1280, 720), (720, 1280), (1366, 768), (1600, 900),
         (1920, 1080), (2048, 2048), (3000, 1000), (4000, 3000)]


@pytest.fixture(scope="module")
def media() -> Any:
    """A test media server of its own (plain 200 paths besides Range ones), which the demo's
    workers fetch from only because the cluster lists it (`media_hosts`)."""
    with media_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, media: MediaServer) -> Any:
    root = tmp_path_factory.mktemp("dynamo")
    # speed 0.2: a seed stays on its engine long enough (~0.2 s) for the next to overlap it.
    with running_dynamo(log_dir=root / "logs", model_cache=root / "models", speed=0.2,
                        media_hosts=[f"127.0.0.1:{media.port}"]) as c:
        yield c


@pytest.fixture(scope="module")
def raw_bodies() -> dict[str, dict[str, Any]]:
    return {}


@pytest.fixture(scope="module")
def client(cluster: DynamoCluster, raw_bodies: dict[str, dict[str, Any]]) -> Any:
    """mmlens' trace client; a response hook keeps Dynamo's raw JSON per x-request-id."""

    def keep(resp: httpx.Response) -> None:
        rid = resp.request.headers.get("x-request-id")
        if rid and resp.request.url.path.endswith("/chat/completions"):
            resp.read()
            try:
                raw_bodies[rid] = resp.json()
            except ValueError:
                raw_bodies[rid] = {"undecodable": resp.text[:200]}

    with httpx.Client(event_hooks={"response": [keep]}) as http:
        yield TraceClient(http, sink=TraceSink(layout_model="qwen3-vl", block_size=BLOCK))


def send(cluster: DynamoCluster, client: TraceClient, images: list[ImagePart], rid: str,
         max_tokens: int = 2, text: str = TEXT) -> RequestTrace:
    t = client.send(cluster.router_url, MODEL, text, images, router_kind="dynamo",
                    max_tokens=max_tokens, request_id=rid)
    assert t.status == 200, (t.status, t.error)
    return t


def worker_records(cluster: DynamoCluster) -> dict[str, dict[str, Any]]:
    """The simulated workers' own per-request records, keyed by Dynamo's request id."""
    return {rec["request_id"]: rec for rec in worker_requests(cluster)}


# --- tests ----------------------------------------------------------------------------------


def test_every_listener_is_loopback(cluster: DynamoCluster) -> None:
    socks = listeners(p.popen.pid for p in cluster.procs)
    ports = {port for _, port, _ in socks}
    assert cluster.cfg.frontend_port in ports and set(cluster.cfg.broker_ports) <= ports
    for i in range(cluster.cfg.workers):
        assert cluster.cfg.worker_ports(i)["system"] in ports
    assert socks and all(addr == "127.0.0.1" for addr, _, _ in socks), socks
    # The demo's media origin runs in the process that started the cluster (this one), on
    # a loopback address of its own.
    assert (ORIGIN_HOST, cluster.cfg.media_port) in {
        (addr, port) for addr, port, _ in listeners([os.getpid()])}


def test_abab_affinity_with_kv_events(cluster: DynamoCluster, client: TraceClient) -> None:
    a = ImagePart(solid_png(640, 480, (10, 180, 40)))
    b = ImagePart(solid_png(640, 480, (180, 40, 200)))
    before = applied_stored(cluster)
    # Seeds overlap in time, so the router's load accounting spreads them over both workers.
    seeds = list(overlapping_seeds(lambda: send(cluster, client, [a], "aff-A-seed", 160),
                                   lambda: send(cluster, client, [b], "aff-B-seed", 16),
                                   cluster))
    wait_router_indexed(cluster, before)
    replays = []
    for rid, img in (("aff-A-2", a), ("aff-B-2", b), ("aff-A-3", a), ("aff-B-3", b)):
        replays.append(send(cluster, client, [img], rid))
    sa, sb = seeds
    # Both seeds may land on one worker under load; affinity is about the replays.
    assert sa.worker and sb.worker
    for t in replays:
        seed = sa if "-A-" in t.request_id else sb
        assert t.worker == seed.worker, (t.request_id, t.worker, seed.worker)
        # Warm: all full blocks of the 317-token expanded prompt (18 − 1 + 300).
        assert t.prompt_tokens == 317
        assert t.cached_tokens == 304 > t.prompt_tokens // 2
        best = one(t, "log:routing_best") if decisions_for(cluster, t) else None
        assert best and (best.overlap_blocks, best.request_blocks) == (19, 20)
        timing = one(t, "nvext.timing")
        assert timing.kv_hit_rate == pytest.approx(19 / 20)
    for t in seeds:
        best = decisions_for(cluster, t) and one(t, "log:routing_best")
        assert best.overlap_blocks == 0 and best.request_blocks == 20
        assert t.cached_tokens == 0


def test_worker_attribution_equals_nvext(cluster: DynamoCluster, client: TraceClient,
                                         raw_bodies: dict[str, dict[str, Any]]) -> None:
    img = ImagePart(solid_png(224, 224, (90, 90, 20)))
    traces = [send(cluster, client, [img], f"attr-{i}") for i in range(3)]
    traces.append(send(cluster, client, [], "attr-text"))
    records = worker_records(cluster)
    ids = {str(w["worker_id"]) for w in cluster.ready_info()["workers"]}
    for t in traces:
        nvext = raw_bodies[t.request_id]["nvext"]["worker_id"]
        assert t.worker == str(nvext["decode_worker_id"]) == str(nvext["prefill_worker_id"])
        assert t.worker in ids
        # The engine that really served it logged the same id under Dynamo's request id.
        internal = t.response_id.removeprefix("chatcmpl-")
        assert str(records[internal]["worker_id"]) == t.worker
        decisions_for(cluster, t, ("log:routing_best", "log:selected_worker"))
        assert one(t, "log:selected_worker").worker == t.worker
        assert one(t, "log:routing_best").worker == t.worker


def test_image_token_counts_equal_dynamo_log(cluster: DynamoCluster,
                                             client: TraceClient) -> None:
    rows = []
    for i, (w, h) in enumerate(SIZES):
        img = ImagePart(solid_png(w, h, (i * 9 % 256, 200, 17)))
        t = send(cluster, client, [img], f"count-{w}x{h}", max_tokens=1)
        decisions_for(cluster, t, ("log:mm_image_tokens", "log:routing_best"))
        expected = t.expected_layout
        assert expected is not None and expected.ok, expected
        mine = expected.images[0].tokens
        logged = one(t, "log:mm_image_tokens").image_tokens
        best = one(t, "log:routing_best")
        rows.append((w, h, mine, logged, t.prompt_tokens, best.request_blocks))
        assert logged == [mine], rows[-1]
        # mmlens' engine length = rendered − 1 + N = what the worker reported; the router's
        # view is that length rounded up to whole blocks.
        assert t.prompt_tokens == expected.engine_prompt_tokens, rows[-1]
        assert best.request_blocks == math.ceil(t.prompt_tokens / BLOCK), rows[-1]
    assert len(rows) >= 20


def test_workers_fetch_only_from_the_demo_origin_and_listed_hosts(
        cluster: DynamoCluster, client: TraceClient, media: MediaServer) -> None:
    """The demo's own origin serves uploads with 206 (exact MM routing) and the worker's
    fetch; a URL on a loopback port nobody listed is refused by the worker, unfetched."""
    png = solid_png(640, 480, (3, 250, 4))
    info = cluster.ready_info()
    assert info["media_hosts"] == [f"{ORIGIN_HOST}:{cluster.cfg.media_port}",
                                   f"127.0.0.1:{media.port}"]
    with httpx.Client() as http:
        url = upload(http, info["media_origin"], png, "green.png")
    good = send(cluster, client, [ImagePart(url=url)], "url-origin")
    decisions_for(cluster, good, ("log:mm_image_tokens", "log:routing_best"))
    assert one(good, "log:mm_image_tokens").image_tokens == [300]
    assert cluster.media is not None
    fetches = [(path, rng) for path, rng in cluster.media.requests if path.endswith("/green.png")]
    assert any(rng for _, rng in fetches) and any(not rng for _, rng in fetches), fetches
    with media_server() as unlisted:
        unlisted.files["green.png"] = png
        t = client.send(cluster.router_url, MODEL, TEXT,
                        [ImagePart(url=unlisted.url("green.png"))], router_kind="dynamo",
                        max_tokens=2, request_id="url-unlisted")
    # Dynamo 1.6.1 answers the worker's refusal with a bare 400 "Invalid request"; the
    # reason is in the worker's log.
    assert t.status == 400, (t.status, t.error)
    reason = f"media host 127.0.0.1:{unlisted.port} is not in the allowed hosts"
    wait_until(lambda: any(reason in w.log_path.read_text(errors="replace")
                           for w in cluster.workers), 10, 0.2, what="the worker's refusal")
    # The frontend probed the dimensions (Range requests, from any host); the worker fetched
    # nothing (its GET carries no Range header).
    assert unlisted.requests and all(rng for _, rng, _ in unlisted.requests), unlisted.requests


def test_http_url_needs_range_and_200_falls_back(cluster: DynamoCluster, client: TraceClient,
                                                 media: MediaServer) -> None:
    png = solid_png(640, 480, (1, 2, 250))
    media.files["blue.png"] = png
    good = send(cluster, client, [ImagePart(url=media.url("blue.png"))], "url-range")
    decisions_for(cluster, good, ("log:mm_image_tokens", "log:routing_best"))
    assert one(good, "log:mm_image_tokens").image_tokens == [300]
    assert one(good, "log:routing_best").request_blocks == 20
    assert not [p for p in good.predictions if p.source == "log:mm_fallback"]
    assert any(path.startswith("/range/") and status == 206
               for path, _, status in media.requests)

    bad = send(cluster, client, [ImagePart(url=media.url("blue.png", range_capable=False))],
               "url-plain")
    decisions_for(cluster, bad, ("log:mm_fallback", "log:routing_best"))
    fallback = [p for p in bad.predictions if p.source == "log:mm_fallback"]
    reasons = " | ".join(w for p in fallback for w in p.warnings)
    assert "failed to fetch image dims" in reasons
    assert "expected 206 Partial Content" in reasons
    assert not [p for p in bad.predictions if p.source == "log:mm_image_tokens"]
    # Text-prefix routing: 18 rendered ids, one placeholder, no expansion → 2 blocks.
    assert one(bad, "log:routing_best").request_blocks == 2
    # The worker still fetched and expanded the image itself (as vLLM would).
    assert bad.prompt_tokens == 317


def test_dynamo_metrics_normalize(cluster: DynamoCluster, client: TraceClient,
                                  media: MediaServer) -> None:
    img = ImagePart(solid_png(336, 336, (77, 7, 177)))
    for i in range(2):
        send(cluster, client, [img], f"metrics-{i}")
    media.files["m.png"] = solid_png(100, 100, (1, 1, 1))
    send(cluster, client, [ImagePart(url=media.url("m.png", range_capable=False))],
         "metrics-no-dims")
    info = cluster.ready_info()
    targets = [("frontend", info["router_metrics"])] + [
        (w["name"], w["metrics"]) for w in info["workers"]]
    with httpx.Client() as http:
        scraper = MetricsScraper(http)
        samples = scraper.scrape_all(targets)
    names = {s.name for s in samples if s.target == "frontend"}
    assert "dynamo_frontend" in detect_flavors(names)
    assert any(n.startswith("dynamo_router_overhead_") for n in names)
    assert any(n.startswith("dynamo_component_router_") for n in names)
    worker_names = {s.name for s in samples if s.target == "w1"}
    assert {"dynamo_worker", "vllm"} <= set(detect_flavors(worker_names))

    norm = normalize_samples(samples)
    fe = norm.dynamo["frontend"]
    assert fe["block_size"][MODEL] == BLOCK
    backend_ids = {w["worker_id"] for w in info["workers"]}
    assert {w["worker_id"] for w in fe["registered_workers"]} == backend_ids
    assert fe["cached_tokens_sum"][MODEL] > 0
    assert norm.kv_event_health["frontend"]["events_flowing"] is True
    # Image-bearing requests vs those whose image tokens Dynamo counted: the gap is the
    # requests routed text-prefix only for want of image dims (at least "metrics-no-dims").
    mm = fe["image_requests"][MODEL]
    assert mm["with_images"] >= mm["counted"] + 1 and mm["uncounted"] >= 1
    assert fe["router_overhead_ms_mean"]["total"] > 0
    # Label trap: `worker_id` on dynamo_component_* at the frontend is the frontend's own id
    # (hex of router_id), never a backend worker.
    for s in samples:
        if s.target == "frontend" and s.name.startswith("dynamo_component_router_requests"):
            own = s.label("worker_id")
            assert own and str(int(own, 16)) == s.label("router_id")
            assert str(int(own, 16)) not in backend_ids
    per_worker = {s.label("worker_id") for s in samples
                  if s.name == "dynamo_frontend_worker_active_decode_blocks"}
    # Per-worker router bookkeeping appears once a worker has been routed to.
    assert per_worker and per_worker <= backend_ids
    hits = [s.value for s in samples
            if s.name == "vllm:prefix_cache_hits_total" and s.target.startswith("w")]
    assert sum(hits) > 0


def test_collect_and_snapshot_from_the_ready_line(cluster: DynamoCluster, tmp_path: Any) -> None:
    """mmlens' headless collector, pointed only at the demo's ready line, sees the frontend
    (metrics + JSON log), both workers (metrics + vLLM-format KV events) and joined traces."""
    from mmlens.collectors.runner import CollectorRunner
    from mmlens.demo.procs import write_ready

    from mmlens.config import Config
    from mmlens.store.reader import StoreReader
    from mmlens.store.snapshot import build_snapshot
    from mmlens.store.sqlite import Store

    ready = tmp_path / "ready.json"
    write_ready(ready, cluster.ready_info())
    store = Store(tmp_path / "mmlens.db")
    runner = CollectorRunner(Config(ready_file=str(ready), interval_s=0.5), store)
    try:
        runner.setup()
        runner.start_kv()
        runner.tick()
        # The collector's SUB sockets must join before the events flow, and PUB/SUB gives no
        # signal when they have.
        time.sleep(0.5)

        def batches() -> float:
            return sum(ep.health.counters.get("batches", 0) for ep in runner.kv.endpoints)

        before, batches_before = applied_stored(cluster), batches()
        with httpx.Client() as http:
            tc = TraceClient(http, sink=TraceSink(layout_model="qwen3-vl", block_size=BLOCK))
            img = ImagePart(solid_png(1024, 768, (33, 66, 99)))
            traces = [send(cluster, tc, [img], f"collect-{i}") for i in range(2)]
        wait_router_indexed(cluster, before)
        wait_until(lambda: batches() > batches_before, 10, what="KV batches at the collector")
        runner.record_traces(traces)
        runner.tick()
        runner.flush()
    finally:
        runner.close()
    store.close()
    reader = StoreReader(tmp_path / "mmlens.db")
    snap = build_snapshot(reader).to_json()
    reader.close()
    assert snap["dynamo"]["demo"]["block_size"][MODEL] == BLOCK
    assert snap["router_kv_event_health"]["demo"]["events_flowing"] is True
    served = traces[0].worker
    # Dynamo workers are named by their decimal worker id (as nvext.worker_id says).
    assert snap["resident_blocks"][f"{served}#0"]["blocks"] > 0
    stored = {t["request_id"]: t for t in snap["traces"]}
    warm = stored["collect-1"]
    assert warm["worker"] == served
    assert (warm["prompt_tokens"], warm["cached_tokens"]) == (785, 784)
    best = [p for p in warm["predictions"] if p["source"] == "log:routing_best"]
    assert (best[0]["overlap_blocks"], best[0]["request_blocks"]) == (49, 50)
    counts = [p for p in warm["predictions"] if p["source"] == "log:mm_image_tokens"]
    assert counts[0]["image_tokens"] == [768]
    # The model-level verdict (logged once at registration, no request id) is kept too.
    verdicts = list(snap["dynamo_mm_routing"].values())
    assert any(v["exact"] is True and v["spec"] == "qwen3_vl" for v in verdicts), verdicts


def test_streaming_trace(cluster: DynamoCluster, client: TraceClient) -> None:
    """SSE: every chunk carries nvext.worker_id, timing comes with the finish chunk and usage
    in a last chunk without choices; the trace must still name the engine that served."""
    img = ImagePart(solid_png(256, 256, (250, 250, 0)))
    traces = [client.send(cluster.router_url, MODEL, TEXT, [img], router_kind="dynamo",
                          stream=True, max_tokens=6, request_id=f"stream-{i}")
              for i in range(2)]
    records = worker_records(cluster)
    for t in traces:
        assert t.status == 200 and t.error is None, t.error
        assert t.response_id and t.response_id.startswith("chatcmpl-")
        served = records[t.response_id.removeprefix("chatcmpl-")]
        assert t.worker == str(served["worker_id"])
        assert t.prompt_tokens == served["prompt_tokens"] == 18 - 1 + 64
        assert t.completion_tokens == 6 and t.ttft_s is not None
        assert any(p.source == "nvext.timing" and p.kv_hit_rate is not None
                   for p in t.predictions)
    assert traces[1].worker == traces[0].worker
    assert traces[1].cached_tokens == 80
