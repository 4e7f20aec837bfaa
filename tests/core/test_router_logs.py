"""Router log lines (SMG JSON, Dynamo JSONL and text) → routing decisions, joined to traces."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest.router_logs import cache_trace_decision, parse_lines, request_keys
from mmlens.records import RequestTrace
from mmlens.store.decisions import attach
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
    assert attach([trace], decisions) == 1
    assert trace.predictions[0].branch == "expected_wait_fallback"
    assert attach([trace], decisions) == 0  # idempotent


def _log_decisions() -> list:
    return parse_lines(capture("smg_1.13_cache_trace_log.jsonl").splitlines())


def test_real_smg_cache_trace_first_sight_lists_candidates_and_waits() -> None:
    first, _ = _log_decisions()
    assert (first.request_id, first.source, first.policy, first.origin) == (
        "mmlens-04299d8794744c2f", "log:cache_trace", "cache_aware", "policy")
    assert (first.prediction_source, first.branch) == ("approximate_tree",
                                                       "expected_wait_fallback")
    assert (first.matched_units, first.input_units, first.matched_ratio) == (0, 81, 0.0)
    assert first.overlap_blocks is None
    assert [(c.worker, c.load, c.healthy, c.overloaded) for c in first.candidates] == [
        ("grpc://127.0.0.1:24410", 0.0, True, False), ("grpc://127.0.0.1:24420", 0.0, True, False)]
    assert [(s.source, s.worker, s.value, s.unit) for s in first.scores] == [
        ("expected_wait", "grpc://127.0.0.1:24410", 0.0, "seconds"),
        ("expected_wait", "grpc://127.0.0.1:24420", 0.0, "seconds")]
    assert first.scores[0].details["drain_rate"] == 400.0
    assert first.gates == []  # no preferred worker, nothing to spill from
    assert first.ts == pytest.approx(1796019187.18135)  # dispatch_timestamp_ns


def test_real_smg_cache_trace_event_hit_has_affinity_and_gate() -> None:
    _, hit = _log_decisions()
    assert (hit.worker, hit.branch, hit.overlap_blocks, hit.request_blocks, hit.block_size) == (
        "grpc://127.0.0.1:24420", "event_hit", 5, 5, 16)
    affinity, wait = hit.scores
    assert (affinity.source, affinity.value, affinity.unit, affinity.device_blocks,
            affinity.request_blocks) == ("policy_affinity", 5.0, "blocks", 5.0, 5)
    assert affinity.details == {"block_size": 16, "selection_policy": "cache-aware-default"}
    assert (wait.source, wait.unit) == ("expected_wait", "seconds")
    (gate,) = hit.gates
    assert (gate.worker, gate.load, gate.average_load, gate.relative_threshold,
            gate.absolute_threshold, gate.absolute_margin, gate.spill) == (
        "grpc://127.0.0.1:24420", 0.0, 0.0, 1.5, 64.0, 4.0, False)


def test_reference_cache_trace_evidence_and_compact_header() -> None:
    evidence_text, _, _ = capture("smg_cache_trace_sample.json").rpartition("\n{'")
    d = cache_trace_decision(json.loads(evidence_text), source="log:cache_trace")
    assert len(d.candidates) == 2 and d.gates[0].spill is False
    wait = next(s for s in d.scores if s.source == "expected_wait")
    assert (wait.value, wait.unit, wait.details["since_poll_tokens"]) == (1.8, "seconds", 90)
    header = cache_trace_decision(json.loads(capture("smg_cache_trace_header_sample.json")))
    assert (header.policy, header.origin, header.prediction_source) == (
        "cache_aware", "policy", "event_index_overlap")
    assert header.candidates == header.scores == header.gates == []


def test_cache_trace_tolerates_odd_shapes() -> None:
    d = cache_trace_decision({"root_id": "r", "selections": [{"candidates": "x", "scores": [1],
                                                              "gates": None}],
                              "truncated": True})
    assert (d.request_id, d.candidates, d.scores, d.gates) == ("r", [], [], [])
    assert "truncated" in d.warnings[0]


DYN_FORMULA = (
    "2026-11-30T04:10:01.1Z DEBUG dynamo_kv_router::scheduling::selector::default: Formula for "
    "worker_id=1331657718810289256 dp_rank=0 with 5.00 effective cached blocks: 6.000 = "
    "prefill_load_scale * adjusted_prefill_blocks + decode_blocks + active_request_cost_blocks "
    "= 1.000 * 1.000 + 5.000 + 0.000 (raw_prefill_blocks: 6.000, overlap_credit_blocks: 5.000, "
    "overlap_credit_decay: 1.000) request_id=r-1 worker_type=decode")


def test_dynamo_cost_lines_and_selected_logit() -> None:
    cost, selected = parse_lines([DYN_FORMULA, DYN_SELECTED])
    assert (cost.request_id, cost.source, [c.worker for c in cost.candidates]) == (
        "r-1", "log:cost_formula", ["1331657718810289256"])
    (score,) = cost.scores
    assert (score.source, score.value, score.device_blocks) == ("cost", 6.0, 5.0)
    assert score.details == {"dp_rank": 0, "raw_prefill_blocks": 6.0,
                             "overlap_credit_blocks": 5.0, "overlap_credit_decay": 1.0}
    (logit,) = selected.scores
    assert (logit.source, logit.worker, logit.value, selected.policy) == (
        "logit", "1331657718810289256", 12.0, "kv")


def test_request_keys_match_smg_grpc_and_dynamo_response_ids() -> None:
    assert request_keys("mmlens-1", "mmlens-1-01a22b15-edec-7422-895a-88eedc0a936b") == {
        "mmlens-1", "mmlens-1-01a22b15-edec-7422-895a-88eedc0a936b"}
    assert "abc" in request_keys("client", "chatcmpl-abc")
    assert "chatcmpl-x" in request_keys("client", "chatcmpl-x-01a22b15-edec-7422-895a-88eedc0a936b")
    trace = RequestTrace("client", "http://r", "smg", "m", 0.0, False,
                         response_id="chatcmpl-abc-01a22b15-edec-7422-895a-88eedc0a936b")
    assert attach([trace], parse_lines([SMG_EVENT])) == 1


@settings(max_examples=500, deadline=None)
@given(rid=st.text(alphabet="-0a9fzx\n", min_size=30, max_size=46)
       | st.builds(lambda a, b: a + "-01a22f90-6718-7408-a1c2-7c8e957cf1cd" + b,
                   st.text(alphabet="-ax", max_size=4), st.sampled_from(["", "\n", "x"])))
def test_the_engine_suffix_precheck_never_skips_a_match(rid: str) -> None:
    from mmlens.ingest.router_logs import _GRPC_ENGINE_SUFFIX, _may_have_suffix

    if _GRPC_ENGINE_SUFFIX.search(rid):
        assert _may_have_suffix(rid)
