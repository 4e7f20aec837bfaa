"""Router log lines (SMG JSON, Dynamo JSONL and text) → routing decisions, joined to traces."""

from __future__ import annotations

import json

import pytest

from mmlens.records import RequestTrace
from mmlens.router_logs import cache_trace_decision, join, parse_lines
from tests.fixtures_path import capture

SMG_TREE = ('{"message":"Cache-aware selection","index":"tree","branch":"expected_wait_fallback",'
            '"worker":"http://127.0.0.1:18001","model_id":"Qwen/Qwen3-VL-2B-Instruct",'
            '"matched_ratio":0.0,"threshold":0.30000001192092896,"matched_units":0,'
            '"input_units":37,"credited_units":0,"span":{"request_id":"demo-img-1"}}')
SMG_EVENT = ('{"message":"Event-driven routing","worker":"grpc://127.0.0.1:50051",'
             '"branch":"event_hit","overlap_blocks":5,"request_blocks":5,'
             '"policy":"cache-aware-default","span":{"request_id":"chatcmpl-abc"}}')
SMG_TIMING = ('{"message":"smg_mm_timing process_multimodal_plan","modalities":"[Image]",'
              '"image_count":1,"total_ms":3.095413,"original_tokens":18,"expanded_tokens":81,'
              '"span":{"request_id":"chatcmpl-abc"}}')
DYN_BEST = ("2026-11-30T04:10:01.1Z DEBUG dynamo_llm::kv_router::push_router: [ROUTING] Best: "
            "worker_1331657718810289256 dp_rank=0 with 5/6 blocks overlap request_id=r-1 "
            "overlap_blocks=5 total_blocks=6")
DYN_SELECTED = ('INFO  dynamo_kv_router::scheduling::selector: Selected worker router_mode="kv" '
                'request_id="r-1" worker_id=1331657718810289256 worker_type=decode dp_rank=0 '
                'logit=12.0 host_pinned_blocks=0 disk_blocks=0')
DYN_JSONL = json.dumps({
    "time": "2026-11-30T04:10:01Z", "level": "DEBUG", "target": "mm_routing",
    "message": "image-token count", "model": "Qwen/Qwen3-VL-2B-Instruct", "width": 64,
    "height": 64, "tokens": 64, "mm_hash": 17365620509079423308,
    "source": "url_passthrough_header_fetch", "x_request_id": "r-1"})
DYN_FALLBACK = json.dumps({
    "level": "WARN", "target": "mm_routing", "x_request_id": "r-2",
    "message": "placeholder token count in tokenized prompt does not match image count; "
               "skipping MM routing info (text-prefix routing only)"})


def test_smg_lines() -> None:
    tree, event, timing = parse_lines([SMG_TREE, SMG_EVENT, SMG_TIMING])
    assert (tree.request_id, tree.router, tree.branch, tree.worker, tree.matched_ratio) == (
        "demo-img-1", "smg", "expected_wait_fallback", "http://127.0.0.1:18001", 0.0)
    assert (event.branch, event.overlap_blocks, event.request_blocks) == ("event_hit", 5, 5)
    assert (timing.original_tokens, timing.expanded_tokens) == (18, 81)


def test_dynamo_text_and_jsonl_lines() -> None:
    best, selected, img, fallback = parse_lines([DYN_BEST, DYN_SELECTED, DYN_JSONL, DYN_FALLBACK])
    assert (best.request_id, best.router, best.worker) == ("r-1", "dynamo", "1331657718810289256")
    assert (best.overlap_blocks, best.request_blocks) == (5, 6)
    assert (selected.request_id, selected.worker) == ("r-1", "1331657718810289256")
    assert img.image_tokens == [64]
    assert fallback.request_id == "r-2" and "text-prefix routing only" in fallback.warnings[0]


def test_cache_trace_capture_log_line_and_header() -> None:
    # The capture prints the log record as a Python literal after the evidence JSON.
    text = capture("smg_cache_trace_sample.json")
    evidence_text, _, log_line = text.rpartition("\n{'")
    log_line = "{'" + log_line
    evidence = json.loads(evidence_text)
    (d,) = parse_lines([log_line])
    assert d.request_id == evidence["root_id"] == "chatcmpl-8lmaUWbMsXdOzxueWzUt0qZj"
    assert d.source == "log:cache_trace"
    record = {"message": "Cache routing dispatch", "evidence": json.dumps(evidence),
              "span": {"request_id": evidence["root_id"]}}
    (full,) = parse_lines([json.dumps(record)])
    assert (full.worker, full.branch, full.overlap_blocks, full.request_blocks,
            full.block_size) == ("grpc://127.0.0.1:50051", "event_hit", 5, 5, 16)
    header = json.loads(capture("smg_cache_trace_header_sample.json"))
    h = cache_trace_decision(header)
    assert (h.request_id, h.worker, h.branch, h.source) == (
        "chatcmpl-CSyyXlD3bnmOG59SYUfh2NcO", "grpc://127.0.0.1:50051", "event_hit",
        "header:x-smg-cache-trace")


def test_irrelevant_and_broken_lines() -> None:
    errors: dict[str, int] = {}
    lines = ["", "plain text without routing", '{"message":"Worker healthy"}',
             '{"message": "Cache-aware selection"}',  # no request id: cannot be joined
             "{not json", "{'a': [1,", '["array"]']
    assert parse_lines(lines, errors) == []
    assert errors == {"malformed_log_line": 2}  # a JSON array line is just text


@pytest.mark.parametrize("key", ["request_id", "response_id"])
def test_join_by_request_or_response_id(key: str) -> None:
    trace = RequestTrace("demo-img-1", "http://r", "smg", "m", 0.0, False)
    if key == "response_id":
        trace.request_id, trace.response_id = "client-id", "demo-img-1"
    decisions = parse_lines([SMG_TREE, SMG_EVENT])
    assert join([trace], decisions) == 1
    assert trace.predictions[0].branch == "expected_wait_fallback"
    assert join([trace], decisions) == 0  # idempotent
