"""SMG admin JSON from the captures (and the 1.9 source's nested /get_loads shape)."""

from __future__ import annotations

import json

import pytest

from mmlens.ingest.router_state import parse_get_loads, parse_models, parse_smg_workers
from tests.fixtures_path import capture


def test_http_workers_capture() -> None:
    workers = parse_smg_workers(json.loads(capture("smg_http_workers.txt")))
    assert [w.url for w in workers] == ["http://127.0.0.1:18002", "http://127.0.0.1:18001"]
    w = workers[0]
    assert (w.connection_mode, w.runtime, w.healthy, w.status, w.model) == (
        "http", "vllm", True, "ready", "Qwen/Qwen3-VL-2B-Instruct")
    assert w.kv_block_size is None and w.mm_processor is None


def test_grpc_workers_capture_block_size_from_page_size_label() -> None:
    workers = parse_smg_workers(json.loads(capture("smg_grpc_workers.json")))
    assert [w.url for w in workers] == ["grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"]
    assert all(w.kv_block_size == 16 for w in workers)
    assert workers[0].labels["model_type"] == "qwen3_vl"


def test_get_loads_flat_shape_captures() -> None:
    http = parse_get_loads(json.loads(capture("smg_http_get_loads.txt")))
    assert [(x.worker, x.token_usage, x.cache_hit_rate) for x in http] == [
        ("http://127.0.0.1:18001", 0.01, 0.5), ("http://127.0.0.1:18002", 0.25, 0.0)]
    grpc = parse_get_loads(json.loads(capture("smg_grpc_get_loads.json")))
    assert [x.worker for x in grpc] == ["grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"]


def test_get_loads_nested_shape_of_the_1_9_source() -> None:
    doc = {"workers": [
        {"worker": "http://a", "load": 120, "details": {"timestamp": "t", "dp_rank_count": 2,
         "loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1,
                    "token_usage": 0.3, "cache_hit_rate": 0.7},
                   {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 0,
                    "token_usage": 0.1}]}},
        {"worker": "http://b", "load": -1}]}
    loads = parse_get_loads(doc)
    assert [(x.worker, x.dp_rank, x.running, x.waiting, x.cache_hit_rate) for x in loads] == [
        ("http://a", 0, 2, 1, 0.7), ("http://a", 1, 0, 0, None), ("http://b", 0, 0, 0, None)]


def test_models_and_bad_shapes() -> None:
    assert parse_models(json.loads(capture("smg_http_v1_models.txt"))) == [
        "Qwen/Qwen3-VL-2B-Instruct"]
    for bad in ([], {"x": 1}, "html"):
        with pytest.raises(ValueError):
            parse_get_loads(bad)
        with pytest.raises(ValueError):
            parse_smg_workers(bad)
