"""Every parser is total over its input: only its declared error type escapes, a bad record is
counted and skipped, and what it returns can be stored. Fixed budgets (``SETTINGS``)."""

from __future__ import annotations

import itertools
import json
import time

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mmlens.config import Config, ConfigError, apply_ready
from mmlens.errors import LayoutError
from mmlens.ingest import dynamo_logs, router_logs, router_state
from mmlens.ingest.exposition import ExpositionParser
from mmlens.ingest.kv_events import KVEventError, parse_seq
from mmlens.ingest.kv_index import KVIngest
from mmlens.ingest.observed_logs import read_lines
from mmlens.ingest.observed_spans import read_spans
from mmlens.ingest.otlp import OtlpError, spans_of
from mmlens.ingest.otlp_json import decode_export_json
from mmlens.layout.families import FAMILIES
from mmlens.targets_toml import validate_toml
from tests.fuzz.strategies import (
    DOCS,
    SETTINGS,
    VALUES,
    admin_docs,
    kv_batches,
    log_lines,
    otlp_json_bodies,
    toml_docs,
)

pytestmark = pytest.mark.fuzz
ENC = msgspec.msgpack.Encoder()
_workers = itertools.count()


@SETTINGS
@given(batch=kv_batches(), seq=st.integers(0, (1 << 63) - 1), mutate=st.binary(max_size=4))
@example(batch=[float("inf"), [["BlockStored", [1 << 64], None, [1], 1]], 0], seq=1, mutate=b"")
def test_kv_batches(store, batch, seq, mutate) -> None:
    try:
        payload = ENC.encode(batch)
    except (TypeError, OverflowError):  # not msgpack-able: raw bytes instead
        payload = json.dumps(batch, default=str).encode()
    payload = payload[: len(payload) - len(mutate)] + mutate if mutate else payload
    ingest = KVIngest()
    # A worker of its own: two examples with the same seq and time would share event keys.
    events = ingest.ingest(f"w{next(_workers)}", seq, payload)
    assert ingest.batches + sum(ingest.errors.values()) >= 1  # used or counted
    assert store.add_kv_events(events) == len(events)
    assert store.add_kv_events(events) == 0  # and stored once


@SETTINGS
@given(payload=st.binary(max_size=200))
@example(payload=b"\x91" * 100_000 + b"\x00")  # nested deeper than the interpreter recurses
@example(payload=b"\xdc\xff\xff" + b"\xc0" * 10)  # a list claiming 65,535 items
def test_kv_raw_payloads(store, payload) -> None:
    ingest = KVIngest()
    events = ingest.ingest("w", 0, payload)
    assert ingest.batches + sum(ingest.errors.values()) >= 1
    store.add_kv_events(events)


@SETTINGS
@given(frame=st.binary(min_size=0, max_size=10))
def test_sequence_frames(frame) -> None:
    try:
        seq = parse_seq(frame)
    except KVEventError as exc:
        assert exc.kind in ("truncated_frame", "oversize_number")
    else:
        assert 0 <= seq < 1 << 63


ISSUE_LINES = [  # what killed `mmlens collect` before
    "Formula for worker_id=1 dp_rank=0 with 1.2.3 effective cached blocks: 4.5 = prefill: 1.0 "
    "request_id=r",
    json.dumps({"message": "Cache routing dispatch", "span": {"request_id": "r"},
                "evidence": json.dumps({"dispatch_timestamp_ns": 10**400, "selections": [
                    {"prediction": {"matched_units": 10**30, "input_units": 10**400}}]})}),
    '{"message": "x", "request_id": "\\ud800", "tokens": 1e999}',
    "{" * 5000,
    "{[1]: 2}",
]


@SETTINGS
@given(lines=st.lists(log_lines(), min_size=1, max_size=4))
@example(lines=ISSUE_LINES)
def test_router_log_lines(store, lines) -> None:
    errors: dict[str, int] = {}
    decisions = router_logs.parse_lines(lines, errors)
    store.add_decisions(decisions)
    observed, frags = read_lines(lines, {})
    store.add_decisions(observed)
    store.add_traces(frags)
    dynamo_logs.model_mm_routing(lines)
    dynamo_logs.image_token_counts(lines)


@SETTINGS
@given(doc=st.one_of(DOCS, VALUES), raw=st.text(max_size=30))
def test_cache_trace_headers(doc, raw) -> None:
    for text in (json.dumps(doc, default=str), raw, "[" * 50_000):
        d = router_logs.cache_trace_from_header(text, "r")
        assert d.source == "header:x-smg-cache-trace"
        json.dumps(d.__dict__ if hasattr(d, "__dict__") else str(d), default=str)


@SETTINGS
@given(doc=admin_docs())
@example(doc={"scores": {"w": {"0": float("inf")}}})
@example(doc={"workers": [{"url": "u", "labels": [1]}]})
def test_router_admin_documents(doc) -> None:
    for parse in (router_state.parse_smg_workers, router_state.parse_get_loads,
                  router_state.parse_models, router_state.parse_indexer_scores,
                  router_state.summarize_indexer_dump):
        try:
            parse(doc)
        except ValueError:
            pass


@SETTINGS
@given(text=st.text(max_size=300), lines=st.lists(st.sampled_from([
    'vllm:num_requests_running{engine="0"} 1', "x_total -1", "x 1e999", "# HELP x",
    'y{a="b"} NaN', "z{", "}", "a b c d"]), max_size=6))
def test_exposition(text, lines) -> None:
    errors: dict[str, int] = {}
    ExpositionParser().parse(text + "\n" + "\n".join(lines), "t", 1.0, errors)


@SETTINGS
@given(text=toml_docs())
@example(text='interval_s = [1]\nstore = 3')
@example(text='[[worker]]\nkv_events = "tcp://127.0.0.1:99999"')
def test_mmlens_toml(text) -> None:
    try:
        validate_toml(text)
    except ConfigError:
        pass


@SETTINGS
@given(doc=DOCS, routers=st.lists(DOCS, max_size=2), workers=st.lists(DOCS, max_size=3))
def test_ready_lines(tmp_path_factory, doc, routers, workers) -> None:
    ready = {**doc, "event": "ready", "routers": routers, "workers": workers}
    for line in (ready, {**doc, "event": "ready"}):
        try:
            apply_ready(Config(), line, tmp_path_factory.getbasetemp())
        except ConfigError:
            pass


@SETTINGS
@given(family=st.sampled_from(FAMILIES), config=DOCS, width=st.integers(1, 70_000),
       height=st.integers(1, 70_000))
@example(family=next(f for f in FAMILIES if f.name == "llama-4"),
         config={"max_patches": 10**30}, width=1000, height=700)
@example(family=next(f for f in FAMILIES if f.name == "llava-next"),
         config={"patch_size": 400}, width=1000, height=700)
def test_processor_configs(family, config, width, height) -> None:
    started = time.perf_counter()
    try:
        family.image_token_count(width, height, config)
    except LayoutError:
        pass
    assert time.perf_counter() - started < 0.5  # cost independent of the values


@SETTINGS
@given(body=otlp_json_bodies())
@example(body=b"[" * 100_000)  # nested deeper than the interpreter recurses
@example(body=b'{"resourceSpans":' + b'[' * 5000 + b']' * 5000 + b'}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k",'
         b'"value":' + b'{"kvlistValue":{"values":[{"key":"k","value":' * 200
         + b'{}' + b'}]}}' * 200 + b'}]}]}]}]}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"\xff\xfe"}]}]}]}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":1e999}]}]}]}')
def test_otlp_json_bodies(store, body) -> None:
    try:
        req = decode_export_json(body)
    except OtlpError as exc:
        assert str(exc)
        return
    spans = spans_of(req)
    frags, decisions = read_spans(spans)
    store.add_traces(frags)
    store.add_decisions(decisions)
