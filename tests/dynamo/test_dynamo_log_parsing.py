"""mmlens' router-log parser on verbatim Dynamo 1.6.1 frontend JSON lines (no Dynamo needed).

The fixture holds lines the real frontend wrote (`DYN_LOGGING_JSONL=true`, routing targets at
debug) for four requests of the live tests; only local paths were rewritten.
"""

from __future__ import annotations

from pathlib import Path

from mmlens.records import RequestTrace
from mmlens.router_logs import join, parse_lines

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
    join([trace], parse_lines(FIXTURE.read_text().splitlines()))
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
    join([trace], parse_lines(FIXTURE.read_text().splitlines()))
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
