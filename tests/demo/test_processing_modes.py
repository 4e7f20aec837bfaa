"""Router vs worker multimodal processing on the real SMG 1.13.0 binary, per demo model.

Workers advertise `mm_processor=inprocess`; SMG then forwards media to workers only for the
models it opts in (`smg_mm_processing_total{mode="worker",reason="auto_uniform"}`) and keeps
the others on its own pipeline (`mode="router",reason="model_not_opted_in"`).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import re
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from mmlens.collectors.media_upload import upload
from mmlens.demo.cluster import Cluster
from mmlens.demo.media_origin import ORIGIN_HOST

from mmlens.layout.families import get_family
from tests.demo.support import (
    TEXT,
    chat,
    image_messages,
    metric_value,
    noisy_png_data_url,
    png_data_url,
    running_cluster,
    worker_http,
    worker_requests,
)

pytestmark = pytest.mark.live
QWEN = "Qwen/Qwen3-VL-2B-Instruct"
DRIFT = 3


@pytest.fixture(scope="module")
def qwen_cluster() -> Iterator[Cluster]:
    with running_cluster(family="qwen3-vl", workers=2, worker_mm_processor=True,
                         count_drift=[DRIFT, DRIFT], max_image_bytes=200_000) as c:
        yield c


@pytest.fixture(scope="module")
def qwen_worker_mode(qwen_cluster: Cluster) -> dict:
    return qwen_cluster.ready_info()


def test_qwen_images_go_to_the_workers_processor(qwen_worker_mode: dict) -> None:
    info = qwen_worker_mode
    before = metric_value(info["router_metrics"], "smg_mm_processing_total", model=QWEN,
                          mode="worker", reason="auto_uniform")
    url = png_data_url(640, 480, (30, 60, 90))
    results = [chat(info["router"], QWEN, image_messages(url)) for _ in range(2)]
    after = metric_value(info["router_metrics"], "smg_mm_processing_total", model=QWEN,
                         mode="worker", reason="auto_uniform")
    assert after - before == 2
    assert metric_value(info["router_metrics"], "smg_mm_processing_total",
                        mode="router") == 0
    n_router = get_family("qwen3-vl").image_token_count(640, 480)  # what SMG would expand to
    for r in results:
        assert r.status == 200
        # The worker expanded with its own settings (+DRIFT): usage differs from router mode.
        assert r.prompt_tokens == 18 - 1 + n_router + DRIFT
    seen = worker_requests(worker_http(info, results[-1].worker), 1)[-1]
    assert seen["media_refs"] == 1 and "mm_hashes" not in seen  # no mm_inputs from SMG
    assert seen["prompt_ids"].count(151655) == n_router + DRIFT
    assert re.fullmatch(r"[0-9a-f]{64}", seen["media"][0]["identifier"])
    # SMG routes worker-mode requests on the 18 unexpanded ids, not the 320 the worker ran.
    for r in results:
        p = r.prediction
        assert p.get("input_units", 18) == 18 and p.get("request_blocks", 1) == 1


def test_worker_mode_bad_images_come_back_through_the_router(qwen_worker_mode: dict) -> None:
    info = qwen_worker_mode
    undecodable = chat(info["router"], QWEN, image_messages("data:image/png;base64,aGVsbG8="))
    assert undecodable.status == 400
    assert "cannot decode image" in undecodable.body["error"]["message"]
    oversize = chat(info["router"], QWEN, image_messages(noisy_png_data_url(400, 400)))
    assert oversize.status == 400
    assert "larger than 200000 bytes" in oversize.body["error"]["message"]
    ok = chat(info["router"], QWEN, image_messages(png_data_url(64, 64, (1, 1, 1)), TEXT))
    assert ok.status == 200 and ok.prompt_tokens == 18 - 1 + 64 + DRIFT


@pytest.fixture(scope="module")
def kimi_cluster() -> Iterator[Cluster]:
    with running_cluster(family="kimi-k3", workers=1, worker_mm_processor=True) as c:
        yield c


@contextlib.contextmanager
def probe_server(png: bytes) -> Iterator[tuple[int, list[str]]]:
    """A loopback image server that is not the demo's origin: (its port, the paths fetched)."""
    fetched: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], fetched
    finally:
        server.shutdown()
        server.server_close()


def test_kimi_k3_is_not_opted_in(kimi_cluster: Cluster) -> None:
    info = kimi_cluster.ready_info()
    model = info["models"][0]["id"]
    r = chat(info["router"], model, image_messages(png_data_url(640, 480, (5, 6, 7))))
    assert r.status == 200
    m = info["router_metrics"]
    assert metric_value(m, "smg_mm_processing_total", model=model, mode="router",
                        reason="model_not_opted_in") == 1
    assert metric_value(m, "smg_mm_processing_total", mode="worker") == 0
    seen = worker_requests(info["workers"][0]["http"], 1)[-1]
    # The worker's own expansion (its HTTP API, as vLLM serving the raw request) builds
    # the same ids as SMG's router-side expansion.
    direct = httpx.post(info["workers"][0]["http"] + "/v1/chat/completions", timeout=30,
                        json={"messages": image_messages(png_data_url(640, 480, (5, 6, 7))),
                              "max_tokens": 1})
    assert direct.status_code == 200
    own = worker_requests(info["workers"][0]["http"], 1)[-1]
    assert own["transport"] == "http" and own["prompt_ids"] == seen["prompt_ids"]
    assert seen["media_refs"] == 0 and seen["im_token_id"] == 163605
    ids = seen["prompt_ids"]
    begin, end = ids.index(163602), ids.index(163604)
    assert ids.count(163605) == 414 and 163603 in ids[begin:end]
    # SMG's placeholder range covers the whole media block, dims text included.
    assert seen["media"][0]["offset"] == begin
    assert seen["media"][0]["length"] == end + 1 - begin
    assert r.prompt_tokens == len(ids)


def test_glm_5_3_flash_is_opted_in() -> None:
    with running_cluster(family="glm-5.3-flash", workers=1, worker_mm_processor=True) as c:
        info = c.ready_info()
        model = info["models"][0]["id"]
        r = chat(info["router"], model, image_messages(png_data_url(640, 480, (7, 6, 5))))
        assert r.status == 200
        assert metric_value(info["router_metrics"], "smg_mm_processing_total", model=model,
                            mode="worker", reason="auto_uniform") == 1
        seen = worker_requests(info["workers"][0]["http"], 1)[-1]
    assert seen["media_refs"] == 1
    n = get_family("glm-5.3-flash").image_token_count(640, 480, c.model.processor_config)
    assert seen["prompt_ids"].count(151363) == n


def test_worker_fetches_http_images_only_from_the_demo_origin(qwen_cluster: Cluster) -> None:
    """The default allow-list is the demo's own media origin: an image uploaded there is
    fetched by the worker (SMG forwards the URL); a URL on any other loopback port, another
    server's or the router's own, is refused with 400 and nothing is fetched from it."""
    png = base64.b64decode(png_data_url(224, 224, (70, 80, 90)).split(",", 1)[1])
    info = qwen_cluster.ready_info()
    assert qwen_cluster.media is not None
    with httpx.Client() as client:
        url = upload(client, info["media_origin"], png, "a.png")
    ok = chat(info["router"], QWEN, image_messages(url))
    assert ok.status == 200 and ok.prompt_tokens == 18 - 1 + 64 + DRIFT
    assert [p for p, _ in qwen_cluster.media.requests] == [urlsplit(url).path]  # by the worker

    router_port = urlsplit(info["router"]).port
    with probe_server(png) as (port, fetched):
        for where in (f"127.0.0.1:{port}", f"localhost:{port}", f"127.0.0.1:{router_port}"):
            refused = chat(info["router"], QWEN, image_messages(f"http://{where}/b.png"))
            assert refused.status == 400, (where, refused.body)
            message = refused.body["error"]["message"]
            assert f"media host {where} is not in the allowed hosts" in message
        assert fetched == []
        assert len(qwen_cluster.media.requests) == 1


def test_a_router_mode_and_a_worker_mode_router_over_the_same_workers() -> None:
    """`mmlens demo --worker-mode-router`: the same request through both SMG routers; each
    counts its own mode, both engines count the same prompt, and the worker-mode router,
    routing on one placeholder per image, never matches the engines' blocks."""
    with running_cluster(family="qwen3-vl", workers=2, worker_mode_router=True) as c:
        info = c.ready_info()
        demo, worker = info["routers"]
        assert (demo["name"], demo["mm_processing"]) == ("demo", "router")
        assert (worker["name"], worker["mm_processing"]) == ("demo-worker", "worker")
        assert all(w["mm_processor"] == "inprocess" for w in info["workers"])
        url = noisy_png_data_url(640, 480)
        via_router = chat(demo["url"], QWEN, image_messages(url))
        via_worker = chat(worker["url"], QWEN, image_messages(url))
        assert via_router.status == via_worker.status == 200
        n = get_family("qwen3-vl").image_token_count(640, 480)
        assert via_router.prompt_tokens == via_worker.prompt_tokens == 18 - 1 + n
        assert metric_value(demo["metrics"], "smg_mm_processing_total", model=QWEN,
                            mode="router", reason="config") == 1
        assert metric_value(worker["metrics"], "smg_mm_processing_total", model=QWEN,
                            mode="worker", reason="config") == 1
        assert via_worker.prediction["branch"] == "event_miss"
        assert via_worker.prediction["request_blocks"] == 1  # 18 ids with one placeholder


def test_the_router_mode_smg_fetches_only_the_demo_origin(kimi_cluster: Cluster) -> None:
    """The router-mode SMG fetches image URLs itself and matches its allow-list by host alone;
    the origin's address is its own (127.0.0.7), so a URL naming another loopback port, a
    server of 127.0.0.1's or the router's own API, is refused unfetched, and on the origin's
    address no other port answers."""
    info = kimi_cluster.ready_info()
    model = info["models"][0]["id"]
    png = base64.b64decode(png_data_url(224, 224, (9, 8, 7)).split(",", 1)[1])
    media = kimi_cluster.media
    assert media is not None and urlsplit(info["media_origin"]).hostname == ORIGIN_HOST
    with httpx.Client() as client:
        url = upload(client, info["media_origin"], png, "a.png")
    before = metric_value(info["router_metrics"], "smg_mm_processing_total", model=model,
                          mode="router", reason="model_not_opted_in")
    ok = chat(info["router"], model, image_messages(url))
    assert ok.status == 200, ok.body
    assert metric_value(info["router_metrics"], "smg_mm_processing_total", model=model,
                        mode="router", reason="model_not_opted_in") == before + 1
    fetches = len(media.requests)
    assert fetches >= 1 and worker_requests(info["workers"][0]["http"], 1)[-1][
        "media_refs"] == 0  # SMG fetched and expanded it, the worker got token ids
    router_port = urlsplit(info["router"]).port
    with probe_server(png) as (port, fetched):
        for where in (f"127.0.0.1:{port}", f"localhost:{port}", f"127.0.0.1:{router_port}",
                      f"{ORIGIN_HOST}:{port}", f"{ORIGIN_HOST}:{router_port}"):
            refused = chat(info["router"], model, image_messages(f"http://{where}/b.png"))
            assert refused.status >= 400, (where, refused.status, refused.body)
        assert fetched == []
    assert len(media.requests) == fetches
