"""The demo through the real SMG router in HTTP mode: SMG forwards the raw OpenAI JSON and the
workers render, tokenize and expand images themselves (as vLLM's OpenAI server does)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from mmlens.layout.families import get_family
from tests.demo.support import (
    chat,
    image_messages,
    metric_value,
    png_data_url,
    running_cluster,
    worker_requests,
)

pytestmark = pytest.mark.live
MODEL = "Qwen/Qwen3-VL-2B-Instruct"
PAD = 151655


@pytest.fixture(scope="module")
def info() -> Iterator[dict]:
    with running_cluster(family="qwen3-vl", workers=2, connection="http") as c:
        yield c.ready_info()


def test_workers_register_as_vllm_http_workers(info: dict) -> None:
    workers = httpx.get(info["router"] + "/workers", timeout=10).json()["workers"]
    assert {w["url"] for w in workers} == {w["http"] for w in info["workers"]}
    assert all(w["connection_mode"] == "http" for w in workers)
    models = httpx.get(info["workers"][0]["http"] + "/v1/models", timeout=10).json()
    assert models["data"][0]["owned_by"] == "vllm"


def test_openai_client_repeats_stick_and_report_worker_expansion(info: dict) -> None:
    client = openai.OpenAI(base_url=info["router"] + "/v1", api_key="none", max_retries=0)
    url = png_data_url(640, 480, (120, 30, 200))
    n = get_family("qwen3-vl").image_token_count(640, 480)
    raws = [client.chat.completions.with_raw_response.create(
        model=MODEL, messages=image_messages(url), max_tokens=4) for _ in range(3)]
    routed = {r.headers["x-smg-routed-worker-id"] for r in raws}
    assert len(routed) == 1 and routed.pop().startswith("http://127.0.0.1:")
    usages = [r.parse().usage for r in raws]
    assert all(u.prompt_tokens == 18 - 1 + n for u in usages)
    assert all(u.prompt_tokens_details.cached_tokens > u.prompt_tokens / 2 for u in usages[1:])
    worker = raws[0].headers["x-smg-routed-worker-id"]
    seen = worker_requests(worker, 3)
    assert all(r["transport"] == "http" and r["prompt_ids"].count(PAD) == n for r in seen)
    assert metric_value(info["router_metrics"], "smg_worker_requests_total", worker=worker) >= 3
    hits = metric_value(worker + "/metrics", "vllm:prefix_cache_hits_total")
    assert hits >= sum(u.prompt_tokens_details.cached_tokens for u in usages)


def test_raw_httpx_sse_stream_with_usage(info: dict) -> None:
    body = {"model": MODEL, "messages": image_messages(png_data_url(64, 64, (9, 9, 9))),
            "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    text, usage, done = "", None, False
    with httpx.stream("POST", info["router"] + "/v1/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-smg-routed-worker-id"].startswith("http://")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
            usage = chunk.get("usage") or usage
    assert done and text.strip()
    assert usage["prompt_tokens"] == 81 and usage["completion_tokens"] == 6


def test_bad_images_get_the_workers_error_and_it_keeps_serving(info: dict) -> None:
    undecodable = "data:image/png;base64,bm90IGFuIGltYWdl"
    r = chat(info["router"], MODEL, image_messages(undecodable))
    assert r.status == 400 and r.worker is not None
    assert "cannot decode image" in r.body["error"]["message"]
    bad_b64 = "data:image/png;base64,@@@"
    r = chat(info["router"], MODEL, image_messages(bad_b64))
    assert r.status == 400 and "base64" in r.body["error"]["message"]
    r = chat(info["router"], MODEL, [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}])
    assert r.status == 400
    ok = chat(info["router"], MODEL, image_messages(png_data_url(64, 64, (8, 8, 8))))
    assert ok.status == 200 and ok.prompt_tokens == 81
    # and straight at a worker: malformed JSON
    w = info["workers"][0]["http"]
    raw = httpx.post(w + "/v1/chat/completions", content=b"{not json", timeout=10,
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == 400
    assert httpx.get(w + "/health", timeout=10).status_code == 200
