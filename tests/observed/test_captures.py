"""Observed requests from what the real routers emitted (tests/fixtures/captures/, recorded by
tests/observed/capture.py): SMG 1.13 and Dynamo 1.6.1 JSON logs and OTLP exports, plus the
simulated workers' vLLM-shaped spans, merged into one record per request and judged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from mmlens.collectors.observed_sink import ObservedSink
from mmlens.collectors.verdict_job import VerdictJob

from mmlens.analysis.judgement.batch import length_exact, prompt_of, span_of
from mmlens.analysis.judgement.lengths import dynamo_prompt
from mmlens.ingest.observed import merge_all, name_router
from mmlens.ingest.observed_logs import Attempts, parse_ts, read_lines
from mmlens.ingest.observed_spans import read_spans
from mmlens.ingest.otlp import parse_export
from mmlens.records import RequestTrace, SpanRecord
from mmlens.store.reader import StoreReader
from mmlens.store.sqlite import Store
from tests.fixtures_path import CAPTURES

ROUTERS = {"smg": "smg_1.13", "dynamo": "dynamo_1.6.1"}


def spans(prefix: str) -> list[SpanRecord]:
    out: list[SpanRecord] = []
    for path in sorted(CAPTURES.glob(f"{prefix}_otlp_export_*.pb")):
        out += parse_export(path.read_bytes())
    return out


def responses(prefix: str) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(
        (CAPTURES / f"{prefix}_observed_responses.json").read_text())}


def load(tmp_path: Path, prefix: str, with_otlp: bool) -> Path:
    db = tmp_path / f"{prefix}.db"
    store = Store(db)
    sink = ObservedSink(store.add_traces, store.add_decisions, hold_s=0)
    decisions, frags = read_lines(
        (CAPTURES / f"{prefix}_observed_log.jsonl").read_text().splitlines())
    store.add_decisions(decisions)
    sink.add(frags)
    if with_otlp:
        sink.add(*read_spans(spans(prefix)))
    sink.flush(force=True)
    VerdictJob(store).catch_up()  # as the lead collector does once requests settled
    store.close()
    return db


def test_smg_spans_say_what_the_readme_says() -> None:
    got = spans("smg_1.13")
    http = [s for s in got if s.name == "http_request"
            and s.attributes.get("path") == "/v1/chat/completions"]
    execute = [s for s in got if s.name == "grpc_execute"]
    worker = [s for s in got if s.name == "llm_request"]
    assert len(http) == len(execute) == len(worker) == 5
    for s in http:
        assert s.attributes["request_id"].startswith("chatcmpl-")
        assert s.attributes["status_code"] == "200" and int(s.attributes["latency"]) > 0
        assert not any("worker" in k for k in s.attributes)  # SMG's spans name no worker
    assert {s.attributes["model"] for s in execute} == {"Qwen/Qwen3-VL-2B-Instruct"}
    # SMG passed `traceparent` to the workers: their spans are children of grpc_execute.
    by_id = {s.span_id: s for s in execute}
    for s in worker:
        parent = by_id[s.parent_span_id or ""]
        assert parent.trace_id == s.trace_id
        assert parent.attributes["request_id"] == s.attributes["gen_ai.request.id"]


def test_dynamo_spans_carry_the_routing_decision_as_events() -> None:
    got = spans("dynamo_1.6.1")
    http = [s for s in got if s.name == "http-request"]
    assert len(http) == 5
    assert all(s.attributes["decode_worker_id"] for s in http)
    select = [s for s in got if s.name == "kv_router.select_worker"]
    events = [e for s in select for e in s.events if e.name.startswith("[ROUTING] Best")]
    assert len(events) == 5 and all(e.attributes["total_blocks"] for e in events)
    _, decisions = read_spans(got)
    assert {d.source for d in decisions} >= {"otlp:routing_best"}
    assert all(d.overlap_blocks is not None for d in decisions
               if d.source == "otlp:routing_best")


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_one_record_per_request_with_its_sources(tmp_path: Path, router: str) -> None:
    prefix = ROUTERS[router]
    reader = StoreReader(load(tmp_path, prefix, with_otlp=True))
    try:
        traces = reader.recent_traces(50)
        assert len(traces) == 5
        for t in traces:
            assert t.origin == "observed" and t.sources == ["otlp", "router_log"]
            assert t.provenance["cached_tokens"] == "otlp:llm_request"
            # The router's name for the worker wins over the worker naming itself.
            assert t.provenance["worker"] in ("router_log:smg", "otlp:dynamo.http-request")
        for r in responses(prefix).values():  # found by the id the client got back
            t = reader.trace(r["id"])
            assert t is not None
            assert t.prompt_tokens == r["usage"]["prompt_tokens"]
            cached = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            assert t.cached_tokens == cached
            if "x-smg-routed-worker-id" in r["headers"]:
                assert t.worker == r["headers"]["x-smg-routed-worker-id"]
    finally:
        reader.close()


def _expected(router: str, name: str, cached: int) -> str:
    if name in ("red", "text"):
        return "cold"
    if name == "blue":  # same token ids as red, another image: only SMG is content-blind
        return "false_hit" if router == "smg" else "cold"
    return "hit" if cached else "unknown"


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_verdicts_with_logs_and_spans(tmp_path: Path, router: str) -> None:
    prefix = ROUTERS[router]
    reader = StoreReader(load(tmp_path, prefix, with_otlp=True))
    try:
        for name, r in responses(prefix).items():
            cached = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            j = reader.verdict(r["id"])  # stored by the verdict job
            assert j is not None
            assert j.category == _expected(router, name, cached), (name, j.headline)
            assert j.sources["realized"] == "otlp:llm_request"
    finally:
        reader.close()


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_logs_alone_say_what_is_unknown(tmp_path: Path, router: str) -> None:
    prefix = ROUTERS[router]
    reader = StoreReader(load(tmp_path, prefix, with_otlp=False))
    try:
        r = responses(prefix)["red-again"]
        j = reader.verdict(r["id"])  # stored by the verdict job
        assert j is not None and j.category == "unknown"
        assert "cached_tokens" in j.unknown and j.evidence["predicted_blocks"] == 5
        assert "realized hit is unknown" in j.headline
    finally:
        reader.close()


def test_logs_leave_unknown_fields_null_and_keep_smg_image_sizes(tmp_path: Path) -> None:
    """What no source said is null with no provenance (not a 0 or a false), every value set
    names its source; SMG's "Fetched images" sizes survive the token count line after it;
    whether a body streamed, and when a stream ended, come from its completion line."""
    reader = StoreReader(load(tmp_path, "smg_1.13", with_otlp=False))
    try:
        sizes = {"red": (64, 64), "red-again": (64, 64), "blue": (224, 224),
                 "red-stream": (64, 64), "text": None}
        for name, r in responses("smg_1.13").items():
            t = reader.trace(r["id"])
            assert t is not None
            body = t.to_json()
            assert body["cached_tokens"] is None and "cached_tokens" not in t.provenance
            # SMG names no mode, but a whole body's completion line comes inside the
            # request's span (a stream's after it closed: this capture ends before it).
            if name == "red-stream":
                assert body["stream"] is None and "stream" not in t.provenance
            else:
                assert (body["stream"], t.provenance["stream"]) == (False, "router_log:smg")
            assert body["ended_by"] is None
            for f in ("worker", "model", "status", "latency_s"):
                assert body[f] is not None and t.provenance[f] == "router_log:smg", (name, f)
            if sizes[name] is None:
                assert t.images == []
            else:
                (im,) = t.images
                assert (im.width, im.height, im.tokens) == (*sizes[name], 64), name
    finally:
        reader.close()


def test_records_carry_the_configured_router_name() -> None:
    _, frags = read_lines((CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines())
    frags[0].router = "other"
    name_router(frags, "gw-a", "config:log_file")
    assert frags[0].router == "other" and "router" not in frags[0].provenance
    assert {(f.router, f.provenance["router"]) for f in frags[1:]} == {
        ("gw-a", "config:log_file")}


def test_smg_failover_attempts_from_its_log() -> None:
    """SMG 1.13 retried acc-019 on w1 after w2 died: every decision names its attempt, the
    failed one is a decision of its own, and the record's worker is the one that served."""
    lines = (CAPTURES / "smg_1.13_failover_log.jsonl").read_text().splitlines()
    decisions, frags = read_lines(lines)
    by = {(d.request_id, d.source, d.attempt): d for d in decisions}
    dead, alive = "grpc://127.0.0.1:24590", "grpc://127.0.0.1:24580"
    assert by[("acc-019", "log:cache_trace", 0)].worker == dead
    assert by[("acc-019", "log:cache_trace", 1)].worker == alive
    assert by[("acc-019", "log:Event-driven routing", 0)].worker == dead
    assert by[("acc-019", "log:Event-driven routing", 1)].worker == alive
    assert by[("acc-019", "log:attempt_failed", 0)].warnings == [
        "attempt 0 failed: 500 Internal Server Error"]
    assert {d.attempt for d in decisions if d.request_id == "acc-016"
            and d.source in ("log:cache_trace", "log:Event-driven routing")} == {0}
    (failed,) = merge_all(f for f in frags if f.request_id.startswith("acc-155"))
    assert failed.error is not None and failed.error.startswith("Stream ended by the engine")
    assert (failed.error_code, failed.provenance["error"]) == ("backend_error", "router_log:smg")
    worker = {t.request_id: t.worker for t in frags if not t.request_id.startswith("acc-155")}
    assert worker == {"acc-019": alive, "acc-016": dead}
    # Read in two halves (a collector's reads split anywhere): the same attempts.
    cut = next(i for i, ln in enumerate(lines) if "pipeline attempt failed" in ln) + 1
    attempts = Attempts()
    first, _ = read_lines(lines[:cut], attempts=attempts)
    second, _ = read_lines(lines[cut:], attempts=attempts)
    assert sorted((d.source, d.attempt) for d in first + second if d.request_id == "acc-019") \
        == sorted((d.source, d.attempt) for d in decisions if d.request_id == "acc-019")
    assert "acc-019" not in attempts.failed  # forgotten once it finished


def test_smg_approximate_tree_prediction_is_judged() -> None:
    """SMG before any KV event (the run's first requests): its approximate tree credited w1
    with 80 of 84 tokens of acc-001 — another request of that prefix still in flight there —
    and the engine found nothing (its own log: cached_tokens 0). The prediction is 5 blocks,
    and the response's 0 cached tokens make it a false hit, not cold."""
    from mmlens.analysis.judgement import Evidence, judge
    from mmlens.analysis.judgement.attempts import attempts

    decisions, frags = read_lines(
        (CAPTURES / "smg_1.13_tree_match_log.jsonl").read_text().splitlines())
    (t,) = frags
    t.predictions = [d for d in decisions if d.request_id == t.request_id]
    assert {d.credited_units for d in t.predictions if d.branch == "tree_match"} == {80}
    serving, failed = attempts(t)
    assert (serving.predicted_blocks, serving.branch, failed) == (5, "tree_match", [])
    t.cached_tokens, t.provenance["cached_tokens"] = 0, "tap"  # the response's usage
    t.prompt_tokens, t.provenance["prompt_tokens"] = 84, "tap"
    assert judge(Evidence(t)).category == "false_hit"


def test_smg_warming_worker_line_names_the_worker() -> None:
    decisions, frags = read_lines(
        (CAPTURES / "smg_1.13_warming_log.jsonl").read_text().splitlines())
    (t,) = frags
    assert (t.worker, t.provenance["worker"]) == ("grpc://127.0.0.1:22330", "router_log:smg")
    (sel,) = [d for d in decisions if d.source.startswith("log:Cache miss")]
    assert (sel.branch, sel.request_blocks, sel.attempt) == ("warmup_slice", 0, 0)


def test_smg_stream_mode_and_end_from_its_completion_line() -> None:
    """SMG 1.13's log names no mode: a streamed body's completion line comes after the
    handler returned (no span; "finished processing request" was the response's head) and
    bounds when the stream ended; a whole body's comes inside the request's span."""
    lines = (CAPTURES / "smg_1.13_stream_end_log.jsonl").read_text().splitlines()
    decisions, frags = read_lines(lines)
    got = {t.request_id: t for t in merge_all(frags)}
    stream, whole = got["acc-029"], got["acc-030"]
    assert (stream.stream, stream.provenance["stream"]) == (True, "router_log:smg")
    assert stream.latency_s is not None and stream.latency_s < 0.1  # the head, not the end
    assert stream.ended_by == parse_ts("2026-12-02 00:12:01") + 1.0
    assert any(a.startswith("acc-029-") for a in stream.aliases)  # the engine's id
    assert (whole.stream, whole.ended_by) == (False, None)
    stream.predictions = [d for d in decisions if d.request_id == "acc-029"]
    start, end = span_of(stream)  # from the exact dispatch to the completion line's bound
    assert start == pytest.approx(1796170321.147563, abs=1e-6) and end == stream.ended_by


def test_dynamo_stream_that_died_after_its_head_is_an_error() -> None:
    """Dynamo 1.6.1 answered the stream 200, its worker died; "request completed" says
    error (the client got a broken stream): the record is failed, not served."""
    lines = (CAPTURES / "dynamo_1.6.1_stream_error_log.jsonl").read_text().splitlines()
    _, frags = read_lines(lines)
    got = {a: t for t in merge_all(frags) for a in t.aliases}
    dead, fine = got["acc-161"], got["acc-155"]
    assert dead.failed and (dead.error_code, dead.provenance["error"]) == (
        "unavailable", "router_log:dynamo")
    assert not fine.failed and fine.error is None


def _dynamo_requests() -> tuple[dict[str, RequestTrace], dict[str, int | None]]:
    lines = (CAPTURES / "dynamo_1.6.1_prompt_lengths_log.jsonl").read_text().splitlines()
    decisions, frags = read_lines(lines)
    usage = json.loads((CAPTURES / "dynamo_1.6.1_prompt_lengths_usage.json").read_text())
    got = {a: t for t in merge_all(frags) for a in t.aliases if a in usage}
    for t in got.values():
        ids = {t.request_id, *t.aliases}  # Dynamo names some lines by the client's id
        t.predictions = [d for d in decisions if d.request_id in ids]
    return got, usage


def test_dynamo_prompt_length_is_exact_from_its_own_lines() -> None:
    """Dynamo 1.6.1's "request completed" names the rendered prompt's input tokens (one
    placeholder per image); with each image's token count in its place it is the prompt the
    engine ran: the client's usage says so for text, image, streamed requests alike. Its
    ``MmRoutingInfo`` total is that count rounded up to whole blocks, not it."""
    got, usage = _dynamo_requests()
    assert set(got) == set(usage)
    for rid, want in usage.items():
        t = got[rid]
        if want is None:  # the request that failed over to no worker: no engine ran it
            assert t.failed
            continue
        assert (dynamo_prompt(t), length_exact(t), prompt_of(t, 16)) == (want, True, want), rid
        assert (t.rendered_tokens == want) == (not t.images), rid
    assert {got[r].stream for r in usage} == {True, False}
    assert any(t.images for t in got.values()) and any(not t.images for t in got.values())


def test_dynamo_prompt_length_is_not_guessed() -> None:
    """A request Dynamo routed twice (a migration resends the prompt with what was generated)
    or one with an image of unknown count has no exact length: the shortest its block count
    allows, loose."""
    got, _ = _dynamo_requests()
    t = got["acc-000"]
    routed = next(p for p in t.predictions if p.request_blocks is not None)
    again = replace(t, predictions=[*t.predictions, replace(routed, worker="other")])
    assert dynamo_prompt(again) is None and not length_exact(again)
    assert prompt_of(again, 16) == (routed.request_blocks - 1) * 16 + 1
    blind = replace(t, images=[replace(t.images[0], tokens=None)])
    assert dynamo_prompt(blind) is None and not length_exact(blind)
    told = replace(t, provenance={k: v for k, v in t.provenance.items()
                                  if k != "rendered_tokens"})
    assert dynamo_prompt(told) is None  # a value no source told is no count
