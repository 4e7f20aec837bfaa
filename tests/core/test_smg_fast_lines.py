"""SMG lines read through the typed fast decode (``smg_typed.typed_line``), in Python and in
the compiled reader (``_smglines.c``, where it is built), give the very decisions and request
fragments the whole-object decode gives: random SMG-shaped lines, the readers side by side."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest import smg_typed
from mmlens.ingest.observed_logs import read_lines

MESSAGES = [
    "Cache-aware selection", "Event-driven routing", "Cache miss routed to a warming worker",
    "Cache routing dispatch", "pipeline attempt failed", "Token expansion complete",
    "smg_mm_timing process_multimodal_plan", "finished processing request",
    "Fetched images for multimodal processing", "Multimodal preprocessing complete",
    "Processing chat completion request for model: Qwen/Qwen3-VL-2B-Instruct",
    "Request r1-01a22f90-6718-7408-a1c2-7c8e957cf1cd marked as completed",
    "Created AbortOnDropStream for request r2-01a22f90", "multimodal config cache miss",
    # starts like a decision, then reads as Dynamo's: the whole object is needed
    "Cache routing dispatch Selected worker", "Token expansion complete image-token count",
    "Event-driven routing [ROUTING] Best: worker_3 dp_rank=0 with 2/4 blocks overlap",
]
FIELDS = ["worker", "model_id", "branch", "overlap_blocks", "request_blocks", "matched_ratio",
          "matched_units", "input_units", "credited_units", "policy", "attempt", "status",
          "original_tokens", "expanded_tokens", "original_len", "expanded_len", "item_sizes",
          "total_tokens", "item_count", "worker_id", "logit", "tokens", "error", "time",
          "request_id", "x_request_id", "filename", "line_number"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                    st.floats(allow_nan=False), st.sampled_from(
                        ["", "w1", "12", "3.5", "[ImageSize { width: 64, height: 32 }]",
                         "grpc://127.0.0.1:1"]))
VALUES = st.recursive(SCALARS, lambda v: st.lists(v, max_size=2) | st.dictionaries(
    st.sampled_from(["worker", "request_id", "path", "x"]), v, max_size=2), max_leaves=4)
GATE = st.dictionaries(st.sampled_from(["worker", "load", "average_load", "spill", "x"]),
                       SCALARS, max_size=3)
SELECTION = st.dictionaries(st.sampled_from(
    ["worker", "policy", "origin", "prediction", "candidates", "scores", "gates"]), st.one_of(
    VALUES, st.dictionaries(st.sampled_from(["source", "branch", "matched_units",
                                             "input_units", "overlap_blocks"]), SCALARS),
    st.lists(st.one_of(GATE, SCALARS, st.dictionaries(st.sampled_from(
        ["worker", "load", "healthy", "overloaded", "source", "score", "score_unit",
         "effective_score", "queued_tokens"]), SCALARS)), max_size=3)), max_size=5)
CACHE_TRACE = st.dictionaries(st.sampled_from(
    ["attempt", "dispatch_timestamp_ns", "selections", "unattributed_gates", "truncated",
     "root_id"]), st.one_of(SCALARS, st.lists(st.one_of(SELECTION, GATE, SCALARS),
                                              max_size=2)), max_size=6)
EVIDENCE = st.one_of(CACHE_TRACE.map(json.dumps), st.sampled_from([
    json.dumps({"attempt": 0, "selections": [{"worker": "w1", "policy": "cache_aware",
                                              "candidates": [{"worker": "w1", "load": 1}],
                                              "scores": [{"source": "expected_wait",
                                                          "worker": "w1", "score": 0.5}]}]}),
    "{not json", "plain", json.dumps({"selections": "x"})]))


@st.composite
def smg_lines(draw: Any) -> str:
    obj: dict[str, Any] = {"timestamp": draw(st.sampled_from(
        ["2026-12-01 03:05:22", "2026-12-01 03:05:23", "bad", 7])),
        "level": "DEBUG", "message": draw(st.sampled_from(MESSAGES) | st.text(max_size=8))}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        obj[name] = draw(VALUES)
    if draw(st.booleans()) or obj["message"] == "Cache routing dispatch":
        obj["evidence"] = draw(EVIDENCE)
    if draw(st.integers(0, 9)) == 0:
        obj["fields"] = {"worker": draw(VALUES), "message": "Event-driven routing"}
    span: dict[str, Any] = {"method": "POST"}
    for name, values in (("request_id", st.sampled_from(["r1", "r2", "", 5, None])),
                         ("path", st.sampled_from(["/v1/chat/completions", "/health",
                                                   "/generate/", 3])),
                         ("trace_id", st.sampled_from(["ab" * 16, "", None])),
                         ("status_code", VALUES), ("latency", VALUES)):
        if draw(st.integers(0, 4)):
            span[name] = draw(values)
    kind = draw(st.integers(0, 9))
    if kind:
        obj["span"] = span if kind > 1 else draw(VALUES)
    if draw(st.booleans()):
        obj["spans"] = [span]
    return json.dumps(obj, separators=(",", ":"))


# The readers this install has (the compiled one where it is built), each held to "whole".
PATHS = ["typed"] + (["native"] if smg_typed.NATIVE is not None else [])


def _read(lines: list[str], path: str, first_seq: int | None = 0,
          ) -> tuple[Any, Any, dict[str, int]]:
    errors: dict[str, int] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smg_typed, "PATH", path)
        decisions, frags = read_lines(lines, errors, first_seq=first_seq)
    return decisions, frags, errors


def test_the_compiled_reader_is_built_where_expected() -> None:
    if os.environ.get("MMLENS_EXPECT_NATIVE"):
        assert smg_typed.PATH == "native"


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(smg_lines(), min_size=1, max_size=12),
       first_seq=st.sampled_from([0, None, 1 << 40]))
def test_the_fast_decode_reads_what_the_whole_decode_reads(lines: list[str],
                                                           first_seq: int | None) -> None:
    whole = _read(lines, "whole", first_seq)
    for path in PATHS:
        assert _read(lines, path, first_seq) == whole, path


def test_the_capture_takes_the_fast_decode() -> None:
    from tests.fixtures_path import CAPTURES

    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    fast = [line for line in lines if smg_typed.typed_line(line) is not None]
    assert len(fast) > len(lines) // 3  # the routing, image and outcome lines
    for first_seq in (0, None):
        test_the_fast_decode_reads_what_the_whole_decode_reads.hypothesis.inner_test(
            lines, first_seq)


def _optional(fields: dict[str, Any]) -> Any:
    return st.fixed_dictionaries({}, optional=fields)


CANDIDATE = _optional({k: SCALARS for k in ("worker", "load", "healthy", "overloaded",
                                            "registry_revision")})
SCORE = _optional({"source": st.sampled_from(["expected_wait", "policy_affinity"]) | SCALARS,
                   **{k: SCALARS for k in ("worker", "score", "score_unit", "effective_score",
                                           "device_blocks", "request_blocks",
                                           "queued_tokens")}})
GATE_OK = _optional({k: SCALARS for k in ("worker", "load", "average_load",
                                          "relative_threshold", "absolute_threshold",
                                          "absolute_margin", "spill", "reason")})
PREDICTION = _optional({k: SCALARS for k in ("source", "branch", "overlap_blocks",
                                             "request_blocks", "block_size", "matched_units",
                                             "input_units", "credited_units")})
TRACE_SELECTION = _optional({
    "worker": SCALARS, "policy": SCALARS, "origin": SCALARS,
    "prediction": st.one_of(PREDICTION, PREDICTION, SCALARS),
    "candidates": st.one_of(st.lists(CANDIDATE, max_size=3), SCALARS),
    "scores": st.one_of(st.lists(SCORE, max_size=3), SCALARS),
    "gates": st.lists(GATE_OK, max_size=2)})
WELL_SHAPED_TRACE = _optional({
    "attempt": SCALARS, "dispatch_timestamp_ns": SCALARS | st.integers(0, 1 << 64),
    "selections": st.one_of(st.lists(TRACE_SELECTION, max_size=2),
                            st.lists(TRACE_SELECTION | SCALARS, max_size=2)),
    "unattributed_gates": st.lists(GATE_OK, max_size=2), "truncated": SCALARS,
    "root_id": SCALARS, "engine_ids": VALUES})


@settings(max_examples=300, deadline=None)
@given(trace=WELL_SHAPED_TRACE)
def test_the_typed_cache_trace_reads_what_the_whole_trace_reads(trace: dict[str, Any]) -> None:
    from mmlens.ingest.router_logs import cache_trace_decision

    text = json.dumps(trace)
    typed = smg_typed._typed_trace(text)
    if typed is not None:  # else the whole trace is read (by the reference itself)
        assert smg_typed._trace_decision(typed, "r1") == cache_trace_decision(
            json.loads(text), "r1", "log:cache_trace")
    line = json.dumps({"timestamp": "2026-12-01 03:05:22", "message": "Cache routing dispatch",
                       "evidence": text, "span": {"request_id": "r1", "path": "/generate"}})
    whole = _read([line], "whole")
    for path in PATHS:  # the compiled reader's trace too
        assert _read([line], path) == whole, path


def test_each_fragment_has_lists_and_dicts_of_its_own() -> None:
    """The compiled reader makes a request's first fragment as a copy of one made by
    ``observed.fragment``: no two fragments may share a list or dict (a merge appends to
    ``sources``, sets ``provenance``)."""
    from tests.fixtures_path import CAPTURES

    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    for path in PATHS:
        _, frags, _ = _read(lines, path)
        assert len(frags) >= 5, path
        for name in ("sources", "provenance", "aliases", "images", "predictions",
                     "engine_received"):
            assert len({id(getattr(f, name)) for f in frags}) == len(frags), (path, name)
        frags[0].sources.append("x")
        assert all(f.sources == frags[1].sources != frags[0].sources for f in frags[1:]), path
