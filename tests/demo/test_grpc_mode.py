"""The demo through the real SMG router in gRPC mode (router-side image expansion, KV events).

One cluster per module: SMG 1.13.0 + two simulated Qwen3-VL workers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import openai
import pytest
from mmlens.demo.cluster import Cluster
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from mmlens.layout.families import get_family
from tests.demo.support import (
    TEXT,
    KvSubscriber,
    chat,
    decode_payload,
    image_messages,
    metric_value,
    png_data_url,
    running_cluster,
    worker_http,
    worker_requests,
)
from tests.live_support import wait_until

pytestmark = pytest.mark.live
MODEL = "Qwen/Qwen3-VL-2B-Instruct"
PAD = 151655
RENDERED_LEN = 18  # Qwen chat template around one image anchor and TEXT (SMG's own count)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(family="qwen3-vl", workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def info(cluster: Cluster) -> dict:
    return cluster.ready_info()


def zmq_messages_of_one_request(w: dict, image_url: str, text: str) -> list[tuple[int, bytes]]:
    """The worker's ZMQ KV messages for one image request sent straight to its HTTP API."""
    sub = KvSubscriber(w["kv_events"], w["kv_replay"], w["kv_topic"])
    try:
        body = {"model": MODEL, "max_tokens": 1, "messages": image_messages(image_url, text)}
        httpx.post(w["http"] + "/v1/chat/completions", json=body, timeout=30)
        return sub.recv()
    finally:
        sub.close()


def test_ready_line_lists_loopback_endpoints(info: dict) -> None:
    assert info["event"] == "ready"
    assert info["router"].startswith("http://127.0.0.1:")
    assert info["router_metrics"].startswith("http://127.0.0.1:")
    assert [m["id"] for m in info["models"]] == [MODEL]
    for w in info["workers"]:
        for key in ("grpc", "http", "metrics", "kv_events", "kv_replay"):
            assert "127.0.0.1" in w[key]
    workers = httpx.get(info["router"] + "/workers", timeout=10).json()["workers"]
    assert {w["url"] for w in workers} == {w["url"] for w in info["workers"]}
    assert all(w["runtime_type"] == "vllm" for w in workers)


def test_openai_client_repeats_stick_and_hit_the_cache(info: dict) -> None:
    client = openai.OpenAI(base_url=info["router"] + "/v1", api_key="none", max_retries=0)
    url = png_data_url(640, 480, (200, 40, 40))
    n = get_family("qwen3-vl").image_token_count(640, 480)
    routed, usages = [], []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=image_messages(url), max_tokens=4)
        routed.append(raw.headers["x-smg-routed-worker-id"])
        usages.append(raw.parse().usage)
    assert len(set(routed)) == 1
    assert all(u.prompt_tokens == RENDERED_LEN - 1 + n for u in usages)  # 317: expanded
    for u in usages[1:]:
        assert u.prompt_tokens_details.cached_tokens > u.prompt_tokens / 2
    # The engine really received SMG's expansion: N pad ids and SMG's hash.
    seen = worker_requests(worker_http(info, routed[0]), 3)
    assert all(r["prompt_ids"].count(PAD) == n and r["im_token_id"] == PAD for r in seen)
    assert len({r["mm_hashes"][0] for r in seen}) == 1
    assert metric_value(info["router_metrics"], "smg_worker_requests_total",
                        worker=routed[0], model=MODEL) >= 3


def test_abab_returns_each_replay_to_its_seed_worker(info: dict) -> None:
    a = (png_data_url(640, 480, (10, 200, 10)), "System A: you describe green things.")
    b = (png_data_url(640, 480, (10, 10, 200)), "System B: a specialist for blue images.")
    # Seed both at once: while A is in flight on one worker, SMG's load score sends B (which
    # shares no prefix with A) to the other one.
    with ThreadPoolExecutor(2) as pool:
        seeds = list(pool.map(
            lambda x: chat(info["router"], MODEL, image_messages(x[0], system=x[1]),
                           max_tokens=64), (a, b)))
    replays = [chat(info["router"], MODEL, image_messages(u, system=s)) for u, s in (a, b, a, b)]
    assert all(r.status == 200 for r in seeds + replays)
    assert seeds[0].worker != seeds[1].worker
    assert [r.worker for r in replays] == [seeds[0].worker, seeds[1].worker] * 2
    for r in replays:
        assert r.prediction["branch"] == "event_hit"
        assert r.cached_tokens > r.prompt_tokens / 2


def test_equal_size_different_images_reproduce_smgs_false_hit(info: dict) -> None:
    system = "You are a careful visual assistant. Mention colours, shapes and any text."
    first = png_data_url(224, 224, (250, 250, 0))
    other = png_data_url(224, 224, (0, 250, 250))  # different content, same N (64)
    seed = chat(info["router"], MODEL, image_messages(first, system=system))
    warm = chat(info["router"], MODEL, image_messages(first, system=system))
    probe = chat(info["router"], MODEL, image_messages(other, system=system))
    assert warm.worker == seed.worker and warm.cached_tokens > warm.prompt_tokens / 2
    # Router: content-blind, the expanded ids are identical -> full predicted overlap.
    assert probe.worker == seed.worker
    assert probe.prediction["branch"] == "event_hit"
    assert probe.prediction["overlap_blocks"] == probe.prediction["request_blocks"]
    predicted = probe.prediction["overlap_blocks"] * probe.prediction["block_size"]
    # Engine: the image's blocks carry its identity in extra_keys -> only the text prefix hits.
    seen = worker_requests(worker_http(info, seed.worker), 1)[-1]
    image_offset = seen["media"][0]["offset"]
    assert probe.cached_tokens == image_offset // 16 * 16
    assert 0 < probe.cached_tokens < predicted
    assert seen["mm_hashes"] != worker_requests(worker_http(info, seed.worker), 2)[0]["mm_hashes"]


def test_streaming_usage_and_router_token_metrics(info: dict) -> None:
    client = openai.OpenAI(base_url=info["router"] + "/v1", api_key="none", max_retries=0)
    before = metric_value(info["router_metrics"], "smg_router_tokens_total", token_type="input")
    stream = client.chat.completions.create(
        model=MODEL, messages=image_messages(png_data_url(64, 64, (1, 2, 3))), max_tokens=5,
        stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text.strip()
    assert usage is not None and usage.prompt_tokens == RENDERED_LEN - 1 + 64
    assert usage.completion_tokens == 5
    after = metric_value(info["router_metrics"], "smg_router_tokens_total", token_type="input")
    assert after - before == usage.prompt_tokens  # SMG counts the expanded length


def test_router_metrics_show_kv_event_driven_routing(info: dict) -> None:
    m = info["router_metrics"]
    assert metric_value(m, "smg_mm_processing_total", mode="router", reason="auto_mixed") > 0
    assert metric_value(m, "smg_cache_aware_policy_branch_total", branch="event_hit") > 0
    for w in info["workers"]:
        assert metric_value(m, "smg_kv_event_batches_total", worker=w["url"],
                            disposition="load_only") > 0
        assert metric_value(m, "smg_kv_events_unavailable", worker=w["url"]) == 0
    assert sum(metric_value(m, "smg_kv_event_batches_total", worker=w["url"],
                            disposition="applied") for w in info["workers"]) > 0


def test_worker_metrics_use_vllm_names_and_labels(info: dict) -> None:
    w = info["workers"][0]
    names = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total",
             "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
             "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_count",
             "vllm:request_prompt_tokens_count", "vllm:mm_cache_queries_total",
             "vllm:mm_cache_hits_total"]
    from tests.demo.support import metric_samples

    for name in names:
        samples = metric_samples(w["metrics"], name)
        assert samples, name
        assert samples[0][0] == {"model_name": MODEL, "engine": "0"}, name
    info_labels = metric_samples(w["metrics"], "vllm:cache_config_info")[0][0]
    assert info_labels["block_size"] == "16" and int(info_labels["num_gpu_blocks"]) > 0
    total_hits = sum(metric_value(x["metrics"], "vllm:prefix_cache_hits_total")
                     for x in info["workers"])
    total_queries = sum(metric_value(x["metrics"], "vllm:prefix_cache_queries_total")
                        for x in info["workers"])
    assert 0 < total_hits < total_queries


def test_zmq_events_match_what_the_engine_cached(info: dict) -> None:
    w = info["workers"][0]
    sub = KvSubscriber(w["kv_events"], w["kv_replay"], w["kv_topic"])
    try:
        url = png_data_url(64, 64, (90, 10, 160))
        body = {"model": MODEL, "messages": image_messages(url, "Events, please."),
                "max_tokens": 2}
        r = httpx.post(w["http"] + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200
        msgs = sub.recv()
    finally:
        sub.close()
    assert msgs and [s for s, _ in msgs] == list(range(msgs[0][0], msgs[0][0] + len(msgs)))
    stored = [e for _, p in msgs for e in decode_payload(p)[1] if e["type"] == "BlockStored"]
    first = stored[0]
    seen = worker_requests(w["http"], 1)[-1]
    prompt_blocks = len(seen["prompt_ids"]) // 16
    assert len(first["block_hashes"]) == prompt_blocks
    assert first["token_ids"] == seen["prompt_ids"][: prompt_blocks * 16]
    ident = seen["media"][0]["identifier"]
    offset = seen["media"][0]["offset"]
    assert first["extra_keys"][0] == [[ident, offset]]
    assert first["extra_keys"][1] == [[ident, offset - 16]]
    assert all(0 <= h < 2**64 for h in first["block_hashes"])


def test_replay_fills_a_forced_gap(info: dict) -> None:
    w = info["workers"][1]
    sub = KvSubscriber(w["kv_events"], w["kv_replay"], w["kv_topic"])
    try:
        warm = {"model": MODEL, "messages": image_messages(png_data_url(64, 64, (5, 5, 5)),
                                                           "gap test, first"), "max_tokens": 1}
        httpx.post(w["http"] + "/v1/chat/completions", json=warm, timeout=30)
        before = sub.recv()
        assert before
        last = before[-1][0]
        httpx.post(w["http"] + "/demo/kv/drop?count=2", timeout=10)
        for shade in (7, 8, 9):  # three new prompts: three batches, the first two dropped
            body = {"model": MODEL, "max_tokens": 1, "messages": image_messages(
                png_data_url(96, 96, (shade, shade, shade)), "gap test, second")}
            httpx.post(w["http"] + "/v1/chat/completions", json=body, timeout=30)
        after = sub.recv()
        assert after[0][0] > last + 1  # a gap: the next batches never reached the SUB socket
        missed = list(range(last + 1, after[0][0]))
        replayed = sub.replay(last + 1)
        assert [s for s, _ in replayed][: len(missed)] == missed
        assert {s for s, _ in after} <= {s for s, _ in replayed}
        events = [e for _, p in replayed[: len(missed)] for e in decode_payload(p)[1]]
        assert any(e["type"] == "BlockStored" for e in events)
    finally:
        sub.close()


def test_grpc_stream_sends_metadata_heartbeats_and_the_same_events(info: dict) -> None:
    w = info["workers"][0]
    target = w["grpc"].removeprefix("grpc://")
    with grpc.insecure_channel(target) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        t0 = time.monotonic()
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10)
        call.initial_metadata()
        assert time.monotonic() - t0 < 1.0  # SMG gives a stream 2 s to answer
        first = next(call)  # the load at once, as the stream's first record
        assert first.load.load_only and not first.events and first.sequence_number == 0
        heartbeat = next(call)  # then about every second while idle
        assert heartbeat.load.load_only and not heartbeat.events
        assert 0.5 < time.monotonic() - t0 < 2.5
        zmq_msgs = zmq_messages_of_one_request(w, png_data_url(80, 80, (3, 99, 3)), "grpc+zmq")
        batch = next(b for b in call if b.events)
        call.cancel()
    stored = batch.events[0].stored
    zmq_first = next(e for _, p in zmq_msgs for e in decode_payload(p)[1])
    # gRPC carries int64 (two's complement) of vLLM's unsigned hashes; sequence = ZMQ seq + 1.
    assert [h & (2**64 - 1) for h in (b.block_hash for b in stored.blocks)] == zmq_first[
        "block_hashes"]
    assert batch.sequence_number == zmq_msgs[0][0] + 1
    ident = stored.blocks[0].extra_keys[0].multimodal.identifier
    assert ident == zmq_first["extra_keys"][0][0][0]


def test_bad_grpc_requests_get_errors_and_the_worker_keeps_serving(info: dict) -> None:
    w = info["workers"][0]
    target = w["grpc"].removeprefix("grpc://")
    with grpc.insecure_channel(target) as channel:
        raw = channel.unary_stream("/vllm.grpc.engine.VllmEngine/Generate",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as malformed:
            list(raw(b"\xff\xff\xff\x0f garbage", timeout=5))
        # grpcio's server answers an undecodable message itself, as for vLLM's servicer.
        assert malformed.value.code() == grpc.StatusCode.UNKNOWN
        assert "Error parsing message" in (malformed.value.details() or "")
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        bad = [
            vllm_engine_pb2.GenerateRequest(request_id="empty", tokenized=vllm_engine_pb2.
                                            TokenizedInput(input_ids=[])),
            vllm_engine_pb2.GenerateRequest(request_id="oov", tokenized=vllm_engine_pb2.
                                            TokenizedInput(input_ids=[1, 10**7])),
            vllm_engine_pb2.GenerateRequest(request_id="text", text="not tokenized"),
            vllm_engine_pb2.GenerateRequest(  # media_refs to a worker without mm_processor
                request_id="refs", tokenized=vllm_engine_pb2.TokenizedInput(input_ids=[1, PAD]),
                media_refs=vllm_engine_pb2.MediaRefs(items=[vllm_engine_pb2.MediaRef(
                    modality=common_pb2.IMAGE, url=png_data_url(8, 8, (1, 1, 1)))])),
        ]
        for req in bad:
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(req, timeout=5))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, req.request_id
        ok = list(stub.Generate(vllm_engine_pb2.GenerateRequest(
            request_id="ok", tokenized=vllm_engine_pb2.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=2)), timeout=5))
        assert ok[-1].complete.completion_tokens == 2
    # Undecodable image in router mode: SMG itself refuses it (it decodes before routing).
    bad_png = "data:image/png;base64,bm90IGFuIGltYWdl"
    r = chat(info["router"], MODEL, image_messages(bad_png))
    assert r.status == 400
    assert r.headers["x-smg-error-code"] == "multimodal_processing_failed"
    good = chat(info["router"], MODEL, image_messages(png_data_url(64, 64, (4, 4, 4)), TEXT))
    assert good.status == 200


def test_info_loads_and_abort_over_grpc(info: dict) -> None:
    w = info["workers"][1]
    with grpc.insecure_channel(w["grpc"].removeprefix("grpc://")) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        model = stub.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest(), timeout=5)
        assert model.served_model_name == MODEL and model.model_type == "qwen3_vl"
        assert model.supports_vision and list(model.eos_token_ids) == [151645]
        server = stub.GetServerInfo(vllm_engine_pb2.GetServerInfoRequest(), timeout=5)
        assert server.server_type == "vllm-grpc" and server.block_size == 16
        assert server.mm_processor == ""  # this cluster keeps images on the router
        loads = stub.GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=5)
        assert loads.dp_rank_count == 1 and loads.loads[0].max_total_num_tokens == 2048 * 16
        # A long uncached prompt keeps the request in prefill (~0.6 s) while Abort arrives.
        stream = stub.Generate(vllm_engine_pb2.GenerateRequest(
            request_id="to-abort", stream=True,
            tokenized=vllm_engine_pb2.TokenizedInput(input_ids=list(range(1000, 25000))),
            sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=20)), timeout=20)
        wait_until(lambda: any(r["request_id"] == "to-abort"
                               for r in worker_requests(w["http"], 5)), 10, 0.02,
                   what="the worker received the request")
        stub.Abort(vllm_engine_pb2.AbortRequest(request_ids=["to-abort"]), timeout=5)
        responses = list(stream)
    done = responses[-1].complete
    assert done.finish_reason == "abort" and done.completion_tokens == 0
    assert done.prompt_tokens == 24000


def test_grpc_subscription_resumes_from_a_sequence_number(info: dict) -> None:
    w = info["workers"][0]
    zmq_msgs = zmq_messages_of_one_request(w, png_data_url(72, 72, (11, 22, 33)), "resume")
    seq = zmq_msgs[0][0]
    with grpc.insecure_channel(w["grpc"].removeprefix("grpc://")) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        call = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=seq + 1), timeout=10)
        first = next(call)
        assert first.load.load_only
        resumed = next(call)
        call.cancel()
    assert resumed.sequence_number == seq + 1 and resumed.events
    zmq_hashes = decode_payload(zmq_msgs[0][1])[1][0]["block_hashes"]
    assert [b.block_hash & (2**64 - 1) for b in resumed.events[0].stored.blocks] == zmq_hashes
