"""Every parser is total over its input: only its declared error type escapes, a bad record is
counted and skipped, and what it returns can be stored. Fixed budgets (``SETTINGS``)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

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
from mmlens.store import codec
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
@example(batch=[1e300, [["BlockStored", [1], None, [1], 1]], 0], seq=1, mutate=b"")
@example(batch=[1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1] * 16,
                       "block_size": 16, "extra_keys": [[["ab" * 16, 1 << 31]]]}], 0],
         seq=2, mutate=b"")
@example(batch=[1.0, [{"type": "BlockStored", "block_hashes": [2], "token_ids": [1] * 16,
                       "block_size": 16, "extra_keys": [[["ab" * 16, 1 << 63]]]}], 0],
         seq=3, mutate=b"")
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
    '{"message": "Cache routing dispatch", "span": {"request_id": "r2"}, "evidence": '
    '"{\\"selections\\": [{\\"policy\\": \\"cache\\\\udc80\\", \\"worker\\": 5}]}"}',
    '{"message": "x", "model": [1, 2], "span": {"request_id": "r3", "model": [1]}}',
]
HUGE_LITERAL = "{" + "1:1," * 250_000 + "}"  # 1 MB that only ast.literal_eval would read


@SETTINGS
@given(lines=st.lists(log_lines(), min_size=1, max_size=4))
@example(lines=ISSUE_LINES)
@example(lines=[HUGE_LITERAL] * 8)
def test_router_log_lines(store, lines) -> None:
    started = time.perf_counter()
    errors: dict[str, int] = {}
    decisions = router_logs.parse_lines(lines, errors)
    store.add_decisions(decisions)
    observed, frags = read_lines(lines, {})
    store.add_decisions(observed)
    store.add_traces(frags)
    dynamo_logs.model_mm_routing(lines)
    dynamo_logs.image_token_counts(lines)
    assert time.perf_counter() - started < 10  # 8 MB of `{1:1,…}` took 26.5 s
    assert len(codec.traces(t for (t,) in store._rows("SELECT body FROM traces"))) == \
        store._one("SELECT count(*) FROM traces")  # what was stored reads back


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


def _grpc_batch(ts: float, offset: int, identifier: str, seq: int) -> Any:
    from smg_grpc_proto.generated import common_pb2

    batch = common_pb2.KvEventBatch(sequence_number=seq, timestamp=ts)
    block = batch.events.add().stored.blocks.add(block_hash=seq + 1, token_ids=[1] * 16,
                                                 block_size=16)
    key = block.extra_keys.add()
    key.multimodal.identifier, key.multimodal.offset = identifier, offset
    batch.events.add().stored.blocks.add(block_hash=seq + 2, token_ids=[2] * 16,
                                         block_size=16)
    return batch


@SETTINGS
@given(ts=st.one_of(st.floats(), st.just(1e300)),
       offset=st.integers(-(1 << 63), (1 << 63) - 1),
       identifier=st.text(max_size=40), seq=st.integers(0, (1 << 62)))
@example(ts=1.0, offset=1 << 40, identifier="ab" * 16, seq=1)  # the issue's gRPC case
def test_grpc_kv_batches(store, ts, offset, identifier, seq) -> None:
    from mmlens.ingest.kv_grpc import batch_events

    errors: dict[str, int] = {}
    try:
        got = batch_events(_grpc_batch(ts, offset, identifier, seq), f"g{next(_workers)}",
                           errors)
    except KVEventError as exc:
        assert exc.kind == "bad_number"  # the batch's own time
        return
    assert len(got.events) + sum(errors.values()) == 2  # each event used or counted alone
    assert any(e.block_hashes == [seq + 2] for e in got.events)  # the good one always
    index = KVIngest().index
    index.apply(got.events)
    assert store.add_kv_events(got.events) == len(got.events)


def _pack(obj: object) -> bytes:
    try:
        return ENC.encode(obj)
    except (TypeError, OverflowError):
        return b"\xc1"  # never valid msgpack


PLANE_EVENTS = st.lists(st.fixed_dictionaries({
    "worker_id": st.one_of(st.integers(-5, (1 << 64) - 1), VALUES),
    "event": st.one_of(DOCS, st.fixed_dictionaries({"dp_rank": VALUES, "data": st.one_of(
        DOCS, st.just("cleared"), st.fixed_dictionaries({"stored": DOCS}),
        st.fixed_dictionaries({"removed": DOCS}))}))}), max_size=3)


@SETTINGS
@given(data=st.one_of(st.binary(max_size=200), PLANE_EVENTS.map(
    lambda evs: _pack({"publisher_id": 1, "sequence": 2, "published_at": 3,
                       "payload": _pack(evs)}))))
@example(data=b"\x91" * 100_000 + b"\x00")  # was RecursionError, counted internal_error
@example(data=ENC.encode({"publisher_id": 1, "sequence": 2, "published_at": 3,
                          "payload": b"\x91" * 100_000 + b"\x00"}))
@example(data=ENC.encode({"publisher_id": 1, "sequence": 2, "published_at": 10**19,
                          "payload": b"\x90"}))
def test_dynamo_plane_messages(data) -> None:
    from mmlens.ingest.kv_dynamo_plane import decode_nats, router_events

    errors: dict[str, int] = {}
    try:
        events = router_events(decode_nats("namespace.d.component.b.kv-events", data), errors)
    except KVEventError as exc:
        assert exc.kind in ("undecodable_msgpack", "too_deep", "bad_envelope")
        return
    assert all(ev.ts <= 1 << 33 for ev in events)
