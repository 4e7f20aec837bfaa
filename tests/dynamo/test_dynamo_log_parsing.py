"""mmlens' router-log parser on verbatim Dynamo 1.6.1 frontend JSON lines (no Dynamo needed).

The fixture holds lines the real frontend wrote (`DYN_LOGGING_JSONL=true`, routing targets at
debug) for four requests of the live tests; only local paths were rewritten.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlens.ingest.observed import merge_all
from mmlens.ingest.observed_logs import read_lines
from mmlens.ingest.router_logs import parse_lines
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store.decisions import attach

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "dynamo_frontend_1.6.1.jsonl"
WARM = "ed314030-ae5c-443e-b530-eb1d0b904e9f"  # x-request-id aff-A-2
PLAIN = "b25cc991-89d1-4536-aaa4-bf60b028c555"  # x-request-id url-plain (media server said 200)


def _trace(rid: str, internal: str) -> RequestTrace:
    return RequestTrace(request_id=rid, router="http://127.0.0.1:8000", router_kind="dynamo",
                        model="Qwen/Qwen3-VL-2B-Instruct", ts=0.0, stream=False,
                        response_id=f"chatcmpl-{internal}")


def test_every_line_parses() -> None:
    errors: dict[str, int] = {}
    decisions = parse_lines(FIXTURE.read_text().splitlines(), errors)
    assert not errors
    sources = {d.source for d in decisions}
    assert {"log:routing_best", "log:selected_worker", "log:mm_image_tokens",
            "log:mm_fallback"} <= sources


def test_warm_request_joins_by_x_request_id_and_internal_id() -> None:
    trace = _trace("aff-A-2", WARM)
    attach([trace], parse_lines(FIXTURE.read_text().splitlines()))
    by = {p.source: p for p in trace.predictions}
    best = by["log:routing_best"]
    assert (best.overlap_blocks, best.request_blocks) == (19, 20)
    assert best.worker == "15316022301463935172"
    # "Selected worker" carries only Dynamo's internal id (no x_request_id): joined through
    # the response id `chatcmpl-<internal id>`.
    assert by["log:selected_worker"].worker == best.worker
    assert by["log:mm_image_tokens"].image_tokens == [300]


def test_failed_dims_fallback_keeps_its_reason() -> None:
    trace = _trace("url-plain", PLAIN)
    attach([trace], parse_lines(FIXTURE.read_text().splitlines()))
    fallback = [p for p in trace.predictions if p.source == "log:mm_fallback"]
    assert len(fallback) == 1
    (warning,) = fallback[0].warnings
    assert warning.startswith("mm-routing: failed to fetch image dims; MM routing entry skipped")
    assert "expected 206 Partial Content, got HTTP 200 OK" in warning
    assert not [p for p in trace.predictions if p.source == "log:mm_image_tokens"]
    best = [p for p in trace.predictions if p.source == "log:routing_best"]
    assert best[0].request_blocks == 2  # text-prefix routing only


def test_text_line_fallback_reason() -> None:
    line = ('2026-11-30T05:25:42Z WARN mm_routing: mm-routing: failed to fetch image dims; MM '
            'routing entry skipped error="fetch_image_dims failed: image dim fetch expected 206 '
            'Partial Content, got HTTP 200 OK" x_request_id=r1')
    (d,) = parse_lines([line])
    assert d.request_id == "r1" and d.source == "log:mm_fallback"
    assert "expected 206 Partial Content" in d.warnings[0]


# --- model-level MM routing support and per-image counts (mmlens.ingest.dynamo_logs) ---

SUPPORT = FIXTURE.with_name("dynamo_frontend_mm_support_1.6.1.jsonl")


def test_model_level_mm_routing_verdicts() -> None:
    from mmlens.ingest.dynamo_logs import ANY_MODEL, model_mm_routing, support_for

    table = model_mm_routing(SUPPORT.read_text().splitlines())
    qwen = support_for(table, "Qwen/Qwen3-VL-2B-Instruct")
    assert qwen and qwen.exact is True and qwen.spec == "qwen3_vl"
    assert qwen.image_token_id == 151655 and not qwen.reasons
    # Kimi-K3 resolves its placeholder, but its prompt block needs segmented encoding, which
    # the HuggingFace tokenizer backend lacks: exact routing off, text-prefix only.
    k3 = support_for(table, "moonshotai/Kimi-K3")
    assert k3 and k3.exact is False and k3.spec == "kimi_k3" and k3.image_token_id == 163605
    assert any("does not support segmented encoding" in r for r in k3.reasons)
    glm = support_for(table, "zai-org/GLM-5.3-Flash")
    assert glm and glm.exact is False
    assert any('no image processor registered' in r and "glm53_flash" in r
               for r in glm.reasons)
    assert table[ANY_MODEL].exact is False
    assert "fastokens tokenizer backend is active" in table[ANY_MODEL].reasons[0]
    assert support_for({}, "x") is None


def test_image_token_counts_keep_size_hash_and_source() -> None:
    from mmlens.ingest.dynamo_logs import image_token_counts

    counts = image_token_counts(FIXTURE.read_text().splitlines())
    by_rid = {c.x_request_id: c for c in counts}
    c = by_rid["count-640x480"]
    assert (c.width, c.height, c.tokens) == (640, 480, 300)
    assert c.source == "url_passthrough_header_fetch" and c.mm_hash and c.mm_hash > 0
    assert c.model == "Qwen/Qwen3-VL-2B-Instruct"
    assert "url-plain" not in by_rid  # dims failed: no count


# --- metrics: image-request accounting and router overhead (real 1.6.1 capture) --------------


def test_capture_image_requests_and_router_overhead() -> None:
    from mmlens.ingest.exposition import parse_exposition
    from mmlens.ingest.metrics_normalize import normalize_samples
    from tests.fixtures_path import capture

    samples = parse_exposition(capture("dyn_frontend_metrics_text.txt"), "fe", 0.0)
    fe = normalize_samples(samples).dynamo["fe"]
    # A text-only workload: 13 requests, all in the le="0" bucket of images_per_request.
    assert fe["image_requests"]["Qwen/Qwen3-0.6B"] == {
        "with_images": 0.0, "counted": 0.0, "uncounted": 0.0}
    assert fe["router_overhead_ms_mean"]["total"] == pytest.approx(12.94209 / 13)


def test_merge_mm_routing_keeps_the_latest_verdict() -> None:
    from mmlens.ingest.dynamo_logs import ModelMmRouting, merge_mm_routing

    table: dict[str, ModelMmRouting] = {}
    assert merge_mm_routing(table, {"m": ModelMmRouting("m", spec="qwen3_vl")})
    assert merge_mm_routing(table, {"m": ModelMmRouting("m", exact=False, reasons=["r"])})
    assert (table["m"].exact, table["m"].spec, table["m"].reasons) == (False, "qwen3_vl", ["r"])
    assert not merge_mm_routing(table, {"m": ModelMmRouting("m", exact=False, reasons=["r"])})
    assert merge_mm_routing(table, {"m": ModelMmRouting("m", exact=True)})
    assert (table["m"].exact, table["m"].reasons) == (True, [])


def test_routing_rows_use_dynamo_block_counts() -> None:
    from mmlens.analysis.request_view import predicted_tokens
    from mmlens.analysis.routing_table import decision_rows
    from tests.verdicts_support import judged

    trace = _trace("r", "i")
    trace.ts, trace.worker, trace.prompt_tokens, trace.cached_tokens = 1.0, "7", 317, 304
    trace.predictions = [
        RoutingDecision("r", "dynamo", "nvext.timing", kv_hit_rate=0.95),
        RoutingDecision("r", "dynamo", "log:routing_best", overlap_blocks=19, request_blocks=20),
        RoutingDecision("r", "dynamo", "log:mm_fallback", warnings=["mm-routing: x; error=y"])]
    (row,) = decision_rows([trace], judged([trace]))
    assert row["overlap"] == "19/20" and row["predicted"] == 304
    assert row["warnings"] == "mm-routing: x; error=y"
    ratio_only = _trace("q", "j")
    ratio_only.prompt_tokens = 100
    ratio_only.predictions = [RoutingDecision("q", "dynamo", "nvext.timing", kv_hit_rate=0.5)]
    assert predicted_tokens(ratio_only) == 50


def test_dynamo_verdict_rows() -> None:
    from dataclasses import asdict

    from mmlens.analysis.routing_table import dynamo_verdict_rows
    from mmlens.ingest.dynamo_logs import model_mm_routing

    table = model_mm_routing(SUPPORT.read_text().splitlines())
    rows = {r["model"]: r for r in dynamo_verdict_rows({m: asdict(v) for m, v in table.items()})}
    assert rows["/models/Qwen3-VL-2B-Instruct"]["image routing"] == "exact (pad values)"
    glm = rows["/models/GLM-5.3-Flash"]
    assert glm["image routing"] == "text prefix only" and "glm53_flash" in glm["why not"]


WORKER_FIXTURE = FIXTURE.with_name("dynamo_worker_1.6.1.jsonl")  # the runtime's ingress lines


def test_a_workers_own_log_tells_when_each_request_reached_it() -> None:
    # Verbatim lines of the Dynamo 1.6.1 runtime in two workers' logs (`push_handler.rs`): a
    # KV-query ingress, five requests received on `generate`, one completed. Only the
    # requests received become records, each with its worker's time, joined by x-request-id.
    decisions, frags = read_lines(WORKER_FIXTURE.read_text().splitlines())
    assert not decisions
    got = {a: t.engine_received for t in frags for a in t.aliases}
    assert set(got) == {"acc-000", "acc-001", "acc-002", "acc-003", "acc-004", "acc-007"}
    assert got["acc-001"] == {"1793629401006860017": pytest.approx(1796280675.600927)}
    assert list(got["acc-007"]) == ["6071493109577130047"]
    assert all(t.provenance == {"engine_received": "router_log:dynamo_worker"} for t in frags)
    assert all(t.worker is None and t.status is None for t in frags)  # the router's to say


def test_a_workers_arrival_merges_into_the_routers_record_earliest_first() -> None:
    lines = WORKER_FIXTURE.read_text().splitlines()
    _, frags = read_lines(lines + lines[1:3])  # a line read twice keeps its time
    (one,) = [t for t in merge_all(frags) if "acc-001" in t.aliases]
    assert one.engine_received == {"1793629401006860017": pytest.approx(1796280675.600927)}
