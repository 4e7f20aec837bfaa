"""Every parser is total over its input: only its declared error type escapes, a bad record is
counted and skipped, and what it returns can be stored. Inputs are recorded real ones (router
captures, the demo's wire encodings and ready lines) edited as bytes and as decoded documents
(``strategies.recorded``), the issue's table inputs as explicit examples. Fixed budgets
(``SETTINGS``)."""

from __future__ import annotations

import itertools
import json
import time
import tomllib
from typing import Any

import msgspec
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from mmlens.config import Config, ConfigError, apply_ready, read_ready_file
from mmlens.config import __doc__ as CONFIG_DOC
from mmlens.errors import LayoutError
from mmlens.ingest import dynamo_logs, router_logs, router_state
from mmlens.ingest.exposition import ExpositionParser
from mmlens.ingest.kv_events import KVEventError, parse_seq
from mmlens.ingest.kv_index import KVIngest
from mmlens.ingest.observed_logs import read_lines
from mmlens.ingest.observed_spans import read_spans
from mmlens.ingest.otlp import OtlpError, decode_export, spans_of
from mmlens.ingest.otlp_json import decode_export_json
from mmlens.layout.families import FAMILIES
from mmlens.store import codec
from mmlens.targets_toml import validate_toml
from tests.fuzz.strategies import (
    _DEEP,
    FIXTURES,
    QUARANTINED,
    SEED_LINES,
    SETTINGS,
    capture_lines,
    recorded,
    toml_value,
)

pytestmark = pytest.mark.fuzz
ENC = msgspec.msgpack.Encoder()
CAPTURES = FIXTURES / "captures"
_workers = itertools.count()


def _in_range(doc: Any) -> Any:
    """``doc`` with what msgpack cannot hold made holdable: ints past 64 bits at the edge,
    the deep marker a list 100 deep."""
    if isinstance(doc, dict):
        return {k: _in_range(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_in_range(v) for v in doc]
    if isinstance(doc, int) and not isinstance(doc, bool):
        return max(-(1 << 63), min(doc, (1 << 64) - 1))
    if doc == _DEEP:
        out: list[Any] = []
        for _ in range(100):
            out = [out]
        return out
    return doc


def _msgpack_dumps(doc: Any) -> bytes:
    return ENC.encode(_in_range(doc))


def _msgpack_loads(raw: bytes) -> Any:
    return msgspec.msgpack.decode(raw)


def _pack(obj: object) -> bytes:
    try:
        return ENC.encode(obj)
    except (TypeError, OverflowError):
        return json.dumps(obj, default=str).encode()  # not msgpack-able: raw bytes instead


def _kv_seeds() -> list[bytes]:
    """Batches as the demo's workers put them on the wire (vLLM's map and array encodings,
    SGLang's pages): stored blocks with an image key, removed blocks, all cleared."""
    from mmlens.demo.kv_wire import encode_batch, encode_sglang_batch
    from mmlens.demo.prefix_cache import AllCleared, RemovedBlocks, StoredBlocks

    image = [("ab" * 16, 3)]
    stored = StoredBlocks([11, 12], None, list(range(32)), 16, [image, None])
    child = StoredBlocks([13], 12, list(range(32, 48)), 16, [image])
    events = [[stored], [child, RemovedBlocks([11])], [AllCleared()]]
    return [*(encode_batch(1.7e9, e, legacy) for e in events for legacy in (False, True)),
            *(encode_sglang_batch(1.7e9, e) for e in events[:2])]


KV_SEEDS = _kv_seeds()
ISSUE_KV = [  # the issue's table: one bad event must not take its batch, or the stream
    [float("inf"), [["BlockStored", [1 << 64], None, [1], 1]], 0],
    [1e300, [["BlockStored", [1], None, [1], 1]], 0],
    *([1.0, [{"type": "BlockStored", "block_hashes": [2], "token_ids": [1] * 16,
               "block_size": 16, "extra_keys": [[["ab" * 16, offset]]]}], 0]
      for offset in (1 << 31, 1 << 63))]
# vLLM's image id as a msgpack str whose bytes are a lone surrogate's UTF-8 escape.
SURROGATE_ID = _pack([1.0, [{"type": "BlockStored", "block_hashes": [3], "token_ids": [1] * 16,
                            "block_size": 16, "extra_keys": [[["Z" * 32, 0]]]}], 0]).replace(
    b"Z" * 32, b"\xed\xb2\x80" * 10 + b"ab")


@SETTINGS
@given(payload=recorded(KV_SEEDS, loads=_msgpack_loads, dumps=_msgpack_dumps),
       seq=st.integers(0, (1 << 63) - 1))
@example(payload=_pack(ISSUE_KV[0]), seq=1)
@example(payload=_pack(ISSUE_KV[1]), seq=1)
@example(payload=_pack(ISSUE_KV[2]), seq=2)
@example(payload=_pack(ISSUE_KV[3]), seq=3)
@example(payload=SURROGATE_ID, seq=4)
def test_kv_batches(store, payload, seq) -> None:
    ingest = KVIngest()
    # A worker of its own: two examples with the same seq and time would share event keys.
    events = ingest.ingest(f"w{next(_workers)}", seq, payload)
    assert ingest.batches + sum(ingest.errors.values()) >= 1  # used or counted
    if ingest.errors:
        event(QUARANTINED)
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
    if ingest.errors:
        event(QUARANTINED)
    store.add_kv_events(events)


@SETTINGS
@given(frame=st.binary(min_size=0, max_size=10))
def test_sequence_frames(frame) -> None:
    try:
        seq = parse_seq(frame)
    except KVEventError as exc:
        assert exc.kind in ("truncated_frame", "oversize_number")
        event(QUARANTINED)
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
    # nested past msgspec's depth: was a RecursionError out of observed_logs (this fuzz)
    '{"message": "Cache routing dispatch", "x": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"message": "Cache routing dispatch", "evidence": "{\\"a\\": ' + "[" * 3000
    + "]" * 3000 + '}"}',
]
HUGE_LITERAL = "{" + "1:1," * 250_000 + "}"  # 1 MB that only ast.literal_eval would read
LOG_SEEDS = [*capture_lines(
    "smg_1.13_cache_trace_log.jsonl", "smg_1.13_tree_match_log.jsonl",
    "smg_1.13_warming_log.jsonl", "smg_1.13_failover_log.jsonl",
    "smg_1.13_observed_log.jsonl", "smg_1.13_stream_end_log.jsonl",
    "dynamo_1.6.1_observed_log.jsonl", "dynamo_1.6.1_stream_error_log.jsonl"),
    *(line.encode() for line in SEED_LINES)]


@SETTINGS
@given(raw=st.lists(recorded(LOG_SEEDS), min_size=1, max_size=4))
@example(raw=[line.encode() for line in ISSUE_LINES])
@example(raw=[HUGE_LITERAL.encode()] * 8)
def test_router_log_lines(store, raw) -> None:
    lines = [ln.decode("utf-8", "replace") for ln in raw]  # as the log follower reads them
    before = store._one("SELECT coalesce(max(rowid), 0) FROM traces")
    started = time.perf_counter()
    errors: dict[str, int] = {}
    decisions = router_logs.parse_lines(lines, errors)
    if errors:
        event(QUARANTINED)
    store.add_decisions(decisions)
    observed, frags = read_lines(lines, {})
    store.add_decisions(observed)
    store.add_traces(frags)
    dynamo_logs.model_mm_routing(lines)
    dynamo_logs.image_token_counts(lines)
    assert time.perf_counter() - started < 10  # 8 MB of `{1:1,…}` took 26.5 s
    # What was stored reads back: the rows added, and those merged into.
    ids = sorted({f.request_id for f in frags})
    bodies = [t for (t,) in store._rows(
        f"SELECT body FROM traces WHERE rowid > ? OR request_id IN ({','.join('?' * len(ids))})",
        (before, *ids))]
    assert len(codec.traces(bodies)) == len(bodies)


def _compact(name: str) -> bytes:
    """A capture's (first) JSON document as one compact line."""
    doc, _ = json.JSONDecoder().raw_decode((CAPTURES / name).read_text())
    return json.dumps(doc, separators=(",", ":")).encode()


TRACE_SEEDS = [_compact("smg_cache_trace_header_sample.json"),
               _compact("smg_cache_trace_sample.json")]


@SETTINGS
@given(raw=recorded(TRACE_SEEDS))
@example(raw=b'{"selections": [{"worker": 5}]}')
@example(raw=b"[" * 50_000)
def test_cache_trace_headers(raw) -> None:
    d = router_logs.cache_trace_from_header(raw.decode("latin-1"), "r")  # a header's text
    assert d.source == "header:x-smg-cache-trace"
    if "undecodable x-smg-cache-trace header" in (d.warnings or []):
        event(QUARANTINED)
    json.dumps(d.__dict__ if hasattr(d, "__dict__") else str(d), default=str)


ADMIN_SEEDS = [(CAPTURES / name).read_bytes().strip() for name in (
    "smg_http_workers.txt", "smg_grpc_workers.json", "smg_http_get_loads.txt",
    "smg_grpc_get_loads.json", "smg_http_v1_models.txt")] + [
    # Dynamo's standalone indexer answers in the shapes its docs give (not recorded live).
    b'{"scores":{"7587890000000001":{"0":48}},"frequencies":[1],"tree_sizes":{"1":3}}',
    b'{"qwen:default":[{"worker_id":7587890000000001,"event":{"event_id":1,"data":'
    b'{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":2}]}}}}]}']


@SETTINGS
@given(body=recorded(ADMIN_SEEDS))
@example(body=b'{"scores": {"w": {"0": Infinity}}}')
@example(body=b'{"workers": [{"url": "u", "labels": [1]}]}')
def test_router_admin_documents(body) -> None:
    try:
        doc = json.loads(body)  # as the collector reads the answer (httpx: json.loads)
    except (ValueError, RecursionError):  # counted bad_json (collectors/router_state.py)
        event(QUARANTINED)
        return
    refused = 0
    for parse in (router_state.parse_smg_workers, router_state.parse_get_loads,
                  router_state.parse_models, router_state.parse_indexer_scores,
                  router_state.summarize_indexer_dump):
        try:
            parse(doc)
        except ValueError:
            refused += 1
    if refused == 5:  # no parser took it
        event(QUARANTINED)


def _families(name: str, per: int = 6) -> list[bytes]:
    """A metrics capture cut into seeds of ``per`` metric families each."""
    blocks: list[list[str]] = [[]]
    for line in (CAPTURES / name).read_text().splitlines():
        if line.startswith("# HELP") and blocks[-1] and sum(
                ln.startswith("# HELP") for ln in blocks[-1]) >= per:
            blocks.append([])
        blocks[-1].append(line)
    return ["\n".join(b).encode() for b in blocks if b]


METRIC_SEEDS = [seed for name in ("smg_http_metrics.txt", "smg_grpc_metrics_kv.txt",
                                  "smg_http_engine_metrics.txt", "dyn_frontend_metrics_text.txt",
                                  "dyn_mocker_metrics.txt") for seed in _families(name)]


@SETTINGS
@given(raw=recorded(METRIC_SEEDS, edits=8))
@example(raw=b'vllm:num_requests_running{engine="0"} 1\nx_total -1\nx 1e999\n# HELP x\n'
         b'y{a="b"} NaN\nz{\n}\na b c d')
def test_exposition(raw) -> None:
    errors: dict[str, int] = {}
    ExpositionParser().parse(raw.decode("utf-8", "replace"), "t", 1.0, errors)
    if errors:
        event(QUARANTINED)


def _documented_toml() -> bytes:
    """The ``mmlens.toml`` that mmlens.config documents."""
    return CONFIG_DOC.split("```toml\n", 1)[1].split("```", 1)[0].encode()


TOML_SEEDS = [_documented_toml(),
              b'[[worker]]\nname = "w"\nkv_events = "grpc://127.0.0.1:50051"\ndp_size = 2\n',
              b'[[router]]\nname = "d"\nkind = "dynamo"\nurl = "http://127.0.0.1:8000"\n'
              b'event_plane = "tcp://127.0.0.1:5600"\n[demo]\nkv_transport = "grpc"\n']


def _toml_loads(raw: bytes) -> Any:
    return tomllib.loads(raw.decode())


def _toml_dumps(doc: Any) -> bytes:
    if not isinstance(doc, dict):
        raise TypeError("a TOML document is a table")
    return "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items()
                     if v is not None).encode()


@SETTINGS
@given(raw=recorded(TOML_SEEDS, loads=_toml_loads, dumps=_toml_dumps))
@example(raw=b'interval_s = [1]\nstore = 3')
@example(raw=b'[[worker]]\nkv_events = "tcp://127.0.0.1:99999"')
@example(raw=b'log_dirs = ["a\\u0000b"]')
@example(raw=b"interval_s = " + b"9" * 400)  # was OverflowError (this fuzz, 100k run)
def test_mmlens_toml(raw) -> None:
    try:
        validate_toml(raw.decode("utf-8", "replace"))
    except ConfigError:
        event(QUARANTINED)


READY_SEEDS = [json.dumps(line).encode()
               for line in json.loads((FIXTURES / "demo_ready_lines.json").read_text())]


@SETTINGS
@given(raw=recorded(READY_SEEDS, edits=8))
@example(raw=b'{"event": "ready", "routers": [{"url": "http://127.0.0.1:1", "log": "../x"}]}')
@example(raw=b'{"event": "ready", "routers": [{"url": "http://127.0.0.1:1", "log": "\\ud800"}]}')
def test_ready_lines(tmp_path_factory, raw) -> None:
    base = tmp_path_factory.getbasetemp()
    path = base / "ready.json"
    path.write_bytes(raw)
    try:
        apply_ready(Config(), read_ready_file(path), base)
    except ConfigError:
        event(QUARANTINED)


def _processor_seeds() -> list[bytes]:
    """The processor configs of the demo's model folders (copied from the real checkpoints')
    and each family's defaults as such a file would spell them."""
    from mmlens.demo.model_dirs import MODELS

    return [json.dumps(m.processor_config).encode() for m in MODELS.values()] + [
        b'{"patch_size": 14, "max_patches": 10, "image_size": 336}',
        b'{"crop_size": {"height": 336, "width": 336}, "image_grid_pinpoints": '
        b'[[336, 672], [672, 336]]}']


@SETTINGS
@given(family=st.sampled_from(FAMILIES), raw=recorded(_processor_seeds()),
       width=st.integers(1, 70_000), height=st.integers(1, 70_000))
@example(family=next(f for f in FAMILIES if f.name == "llama-4"),
         raw=b'{"max_patches": 1000000000000000000000000000000}', width=1000, height=700)
@example(family=next(f for f in FAMILIES if f.name == "llava-next"),
         raw=b'{"patch_size": 400}', width=1000, height=700)
def test_processor_configs(tmp_path_factory, family, raw, width, height) -> None:
    from mmlens.layout.modeldir import processor_config_of

    folder = tmp_path_factory.getbasetemp()
    (folder / "preprocessor_config.json").write_bytes(raw)
    started = time.process_time()  # CPU time: the machine may be shared
    try:  # read as a model folder's file is, then counted
        family.image_token_count(width, height, processor_config_of(folder, {}))
    except LayoutError:
        event(QUARANTINED)
    assert time.process_time() - started < 0.5  # cost independent of the values


OTLP_JSON_SEEDS = [(CAPTURES / "otel_js_otlp_export.json").read_bytes()]


@SETTINGS
@given(body=recorded(OTLP_JSON_SEEDS, edits=8))
@example(body=b"[" * 100_000)  # nested deeper than the interpreter recurses
@example(body=b'{"resourceSpans":' + b'[' * 5000 + b']' * 5000 + b'}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k",'
         b'"value":' + b'{"kvlistValue":{"values":[{"key":"k","value":' * 200
         + b'{}' + b'}]}}' * 200 + b'}]}]}]}]}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"\xff\xfe"}]}]}]}')
@example(body=b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":1e999}]}]}]}')
def test_otlp_json_bodies(store, body) -> None:
    store_spans(store, decode_export_json, body)


def store_spans(store, decode: Any, body: bytes) -> None:
    """What the OTLP receiver does with a body: decoded (or refused with a reason), its
    spans read and stored."""
    try:
        req = decode(body)
    except OtlpError as exc:
        assert str(exc)
        event(QUARANTINED)
        return
    frags, decisions = read_spans(spans_of(req))
    store.add_traces(frags)
    store.add_decisions(decisions)


OTLP_PB_SEEDS = [p.read_bytes() for p in sorted(CAPTURES.glob("*_otlp_export_*.pb"))
                 if p.stat().st_size < 8000]


@SETTINGS
@given(body=recorded(OTLP_PB_SEEDS, edits=8))
def test_otlp_protobuf_bodies(store, body) -> None:
    """The SMG 1.13 and Dynamo 1.6.1 exports as received, their bytes edited."""
    store_spans(store, decode_export, body)


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
        event(QUARANTINED)
        return
    assert len(got.events) + sum(errors.values()) == 2  # each event used or counted alone
    if errors:
        event(QUARANTINED)
    assert any(e.block_hashes == [seq + 2] for e in got.events)  # the good one always
    index = KVIngest().index
    index.apply(got.events)
    assert store.add_kv_events(got.events) == len(got.events)


PLANE = json.loads((FIXTURES / "dynamo_event_plane_1.6.1.json").read_text())
# Recorded envelopes: NATS messages, and the ZMQ broker's body frames past their header.
PLANE_SEEDS = [bytes.fromhex(m["data"]) for m in PLANE["nats_messages"]] + [
    bytes.fromhex(f[3])[5:] for f in PLANE["zmq_broker_frames"]]


def _inner(envelope: bytes) -> bytes:
    return msgspec.msgpack.decode(envelope)["payload"]


def _wrapped(payload: bytes, envelope: bytes = PLANE_SEEDS[0]) -> bytes:
    """A recorded envelope around another payload (edits inside the inner msgpack)."""
    doc = msgspec.msgpack.decode(envelope)
    doc["payload"] = payload
    return ENC.encode(doc)


@SETTINGS
@given(data=st.one_of(
    recorded(PLANE_SEEDS, loads=_msgpack_loads, dumps=_msgpack_dumps),
    recorded([_inner(m) for m in PLANE_SEEDS], loads=_msgpack_loads,
             dumps=_msgpack_dumps).map(_wrapped)))
@example(data=b"\x91" * 100_000 + b"\x00")  # was RecursionError, counted internal_error
@example(data=_wrapped(b"\x91" * 100_000 + b"\x00"))
@example(data=ENC.encode({"publisher_id": 1, "sequence": 2, "published_at": 10**19,
                          "payload": b"\x90"}))
def test_dynamo_plane_messages(data) -> None:
    from mmlens.ingest.kv_dynamo_plane import decode_nats, router_events

    errors: dict[str, int] = {}
    try:
        events = router_events(decode_nats("namespace.d.component.b.kv-events", data), errors)
    except KVEventError as exc:
        assert exc.kind in ("undecodable_msgpack", "too_deep", "bad_envelope"), exc.kind
        event(QUARANTINED)
        return
    assert all(ev.ts <= 1 << 33 for ev in events)
    if errors:
        event(QUARANTINED)
