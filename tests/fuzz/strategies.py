"""Hypothesis strategies shared by the fuzz tests: JSON-ish values with the numbers that broke
parsers before (huge, non-finite, many digits), msgpack-able batches, log lines grown from real
captures, TOML documents. One budget for the whole suite (``SETTINGS``)."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# CI runs 300 examples a parser, the same ones each run; the nightly-style run sets
# MMLENS_FUZZ_EXAMPLES=100000 and MMLENS_FUZZ_RANDOM=1 (new examples each night).
EXAMPLES = int(os.environ.get("MMLENS_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    derandomize=not os.environ.get("MMLENS_FUZZ_RANDOM"), database=None,
                    suppress_health_check=list(HealthCheck))

# The Hypothesis event a fuzz test notes when its input was refused or partly set aside by
# the parser (counted by kind, quarantined): ``benchmarks/fuzz_inputs.py`` counts them.
QUARANTINED = "quarantined"
NASTY_NUMBERS = st.sampled_from([
    0, -1, 1 << 63, 1 << 64, -(1 << 64), 10**30, 10**300, 1e308, 1e-320, float("inf"),
    float("-inf"), float("nan"), True, False])
NUMBER_TEXT = st.sampled_from([
    "1.2.3", "1e999", "-1e999", "NaN", "Infinity", "9" * 5000, "-0", "1_0", "0x10", "", "1e",
    "18446744073709551616", "٣"])
KEYS = st.sampled_from([
    "message", "span", "request_id", "x_request_id", "worker", "worker_id", "overlap_blocks",
    "request_blocks", "evidence", "selections", "prediction", "dispatch_timestamp_ns",
    "matched_units", "input_units", "tokens", "width", "height", "mm_hash", "model", "type",
    "block_hashes", "token_ids", "block_size", "events", "ts", "extra_keys", "url", "workers",
    "loads", "load", "dp_rank", "data", "id", "scores", "labels", "name", "log", "metrics",
    "kv_events", "kv_replay", "dp_size", "routers", "router", "event", "fields"])
SCALARS = st.one_of(st.integers(-(1 << 70), 1 << 70), st.floats(), NASTY_NUMBERS, st.booleans(),
                    st.none(), st.text(max_size=12), NUMBER_TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=5)), max_leaves=25)
DOCS = st.dictionaries(KEYS, VALUES, max_size=8)


def _lines(name: str) -> list[str]:
    path = FIXTURES / name
    return [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


SEED_LINES = _lines("dynamo_frontend_1.6.1.jsonl") + _lines(
    "dynamo_frontend_mm_support_1.6.1.jsonl") + [
    json.dumps({"message": "Cache-aware selection", "worker": "w", "overlap_blocks": 3,
                "span": {"request_id": "r"}}),
    "Formula for worker_id=1 dp_rank=0 with 1.2 effective cached blocks: 3.5 = prefill: 1.0 "
    "request_id=r",
    "[ROUTING] Best: worker_1 dp_rank=0 with 3/4 blocks overlap request_id=x"]


@st.composite
def log_lines(draw: st.DrawFn) -> str:
    """A real line with numbers swapped for nasty ones, bytes spliced in, or a made-up one."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        doc = draw(DOCS)
        return json.dumps(doc, default=str, allow_nan=True)
    line = draw(st.sampled_from(SEED_LINES[-3:] if draw(st.booleans()) else SEED_LINES))
    if kind == 1:
        import re

        spans = [m.span() for m in re.finditer(r"-?\d+(\.\d+)?", line)]
        for _ in range(draw(st.integers(1, 3))):
            if spans:
                a, b = draw(st.sampled_from(spans))
                line = line[:a] + draw(NUMBER_TEXT) + line[b:]
                spans = [m.span() for m in re.finditer(r"-?\d+(\.\d+)?", line)]
        return line
    if kind == 2:
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.text(max_size=8)) + line[at:]
    return "{" * draw(st.integers(1, 3000)) + line


@st.composite
def kv_batches(draw: st.DrawFn) -> object:
    """Batches shaped like vLLM/SGLang's (positional or map, tagged events) with any values."""
    tag = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Teleported"])
    event = st.one_of(
        VALUES,
        st.fixed_dictionaries({"type": tag, "block_hashes": VALUES, "token_ids": VALUES,
                               "parent_block_hash": VALUES, "block_size": VALUES,
                               "extra_keys": VALUES, "medium": VALUES}),
        st.lists(VALUES, max_size=9).flatmap(lambda rest: tag.map(lambda t: [t, *rest])))
    events = st.lists(event, max_size=4)
    return draw(st.one_of(
        VALUES, st.tuples(SCALARS, events, SCALARS).map(list),
        st.fixed_dictionaries({"ts": SCALARS, "events": events,
                               "data_parallel_rank": SCALARS})))


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value == float("inf") else (
            "-inf" if value == float("-inf") else repr(value)))
    if isinstance(value, int):
        return str(value) if -(1 << 63) <= value < 1 << 63 else json.dumps(str(value))
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()
                               if v is not None) + "}"
    return json.dumps(str(value))


TOML_KEYS = st.sampled_from([
    "interval_s", "timeout_s", "log_dirs", "store", "prometheus", "router", "worker", "otlp",
    "demo", "url", "kind", "name", "log_file", "metrics_url", "kv_events", "kv_replay",
    "dp_size", "engine", "discover_workers", "event_plane", "grpc_port", "ready_file",
    "kv_transport", "retention_s", "max_mb", "topic", "api_key"])
ADDRESSES = st.sampled_from([
    "tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://:5557", "http://127.0.0.1:8000",
    "grpc://[::1]:50051", "ipc://", "nats://h", "/etc/passwd", "../../x", "tcp://[bad",
    "http://127.0.0.1:-1/metrics", "tcp://127.0.0.1:65535"])


@st.composite
def toml_docs(draw: st.DrawFn) -> str:
    value = st.one_of(SCALARS, ADDRESSES)
    table = st.dictionaries(TOML_KEYS, st.one_of(value, st.lists(value, max_size=3)),
                            max_size=6)
    top = draw(st.dictionaries(TOML_KEYS, st.one_of(value, table, st.lists(table, max_size=3)),
                               max_size=6))
    return "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in top.items()
                     if v is not None)


@st.composite
def admin_docs(draw: st.DrawFn) -> object:
    """SMG /workers, /get_loads, /v1/models and Dynamo indexer answers with any values."""
    item = st.dictionaries(KEYS, VALUES, max_size=6)
    return draw(st.one_of(
        DOCS, VALUES,
        st.fixed_dictionaries({"workers": st.lists(item.map(lambda d: {"url": "u", **d}),
                                                   max_size=3)}),
        st.fixed_dictionaries({"loads": st.lists(item.map(lambda d: {"worker": "w", **d}),
                                                 max_size=3)}),
        st.fixed_dictionaries({"scores": st.dictionaries(st.text(max_size=3), VALUES,
                                                         max_size=3)}),
        st.fixed_dictionaries({"data": st.lists(item, max_size=3)}),
        st.dictionaries(st.text(max_size=3), st.lists(item, max_size=3), max_size=2)))


OTLP_JSON_SEED = json.loads((FIXTURES / "captures" / "otel_js_otlp_export.json").read_text())
OTLP_VALUES = st.one_of(VALUES, st.sampled_from([
    "4bf92f3577b34da6a3ce929d0e0e4736", "S/kvNXezTaajzpKdDg5HNg==", "zz", "abc", "",
    "SPAN_KIND_SERVER", "STATUS_CODE_ERROR", "18446744073709551616", "-1", "1e3", "0x10",
    {"stringValue": 1}, {"intValue": "9" * 40}, {"arrayValue": {"values": [{"kvlistValue": {}}]}},
    {"bytesValue": "not base64!"}, [{"key": None}], {"value": {"doubleValue": "NaN"}}]))


@st.composite
def otlp_json_bodies(draw: st.DrawFn) -> bytes:
    """The OpenTelemetry JS capture with values swapped, keys dropped or added, or its bytes
    cut and spliced."""
    doc = json.loads(json.dumps(OTLP_JSON_SEED))
    for _ in range(draw(st.integers(1, 4))):
        node: Any = doc
        key: Any = None
        while True:  # walk down to a random container slot
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = node[key]
            if not isinstance(child, dict | list) or not child or draw(st.integers(0, 3)) == 0:
                break
            node = child
        if key is None:
            continue
        action = draw(st.integers(0, 2))
        if action == 0:
            node[key] = copy.deepcopy(draw(OTLP_VALUES))  # later steps may edit it in place
        elif action == 1 and isinstance(node, dict):
            del node[key]
        elif isinstance(node, dict):
            node[draw(st.text(max_size=8))] = copy.deepcopy(draw(OTLP_VALUES))
    body = json.dumps(doc, allow_nan=True).encode()
    if draw(st.integers(0, 4)) == 0:
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.binary(max_size=6)) + body[cut + draw(st.integers(0, 8)):]
    return body


# Byte strings that broke parsers before, spliced into recorded inputs by ``mutate``.
NASTY_BYTES = (b'"\\udc80"', b"1e999", b"[" * 3000, b'{"a":', b"\xff\xfe", b"9" * 400, b"null",
               b"-1", b"18446744073709551616", b"NaN", b'"', b"\\", b"\x00", b"{}", b"[]",
               b"5", b'"\\ud800"', b"\n\n", b"data: ", b"1" * 25, b"\xed\xb2\x80",
               b"2147483648", b"1099511627776", b"9223372036854775808", b"inf", b"1e300")
_NUMBER = re.compile(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def mutate(seed: bytes, program: bytes) -> bytes:
    """``seed`` edited by ``program``, three bytes an edit (what, where, how much): a byte
    set, a span cut, duplicated or replaced by a nasty token, a token put in, the tail cut,
    the next number swapped for a nasty token."""
    out = bytearray(seed)
    for i in range(0, len(program) - 2, 3):
        what, where, much = program[i], program[i + 1], program[i + 2]
        at = where * (len(out) + 1) // 256
        span = 1 + much % 16
        token = NASTY_BYTES[much % len(NASTY_BYTES)]
        match what % 7:
            case 0:
                if out:
                    out[min(at, len(out) - 1)] = much
            case 1:
                del out[at:at + span]
            case 2:
                out[at:at] = token
            case 3:
                out[at:at] = out[at:at + span]
            case 4:
                out[at:at + span] = token
            case 5:
                del out[at:]
            case _:
                m = _NUMBER.search(out, at) or _NUMBER.search(out)
                if m:
                    out[m.start():m.end()] = token
    return bytes(out)


def mutated(seeds: list[bytes], edits: int = 6) -> st.SearchStrategy[bytes]:
    """Recorded real inputs with a few byte-level edits. Two draws an input (which seed, one
    short byte string as the edits), not a tree of nested values: cheap enough for 100k."""
    return st.builds(mutate, st.sampled_from(seeds), st.binary(max_size=3 * edits))


_DEEP = "\x00deep\x00"  # stands for a list nested 3,000 deep (written after encoding)
NASTY_VALUES: list[Any] = [
    0, -1, 1 << 31, 1 << 40, -(1 << 40), 1 << 63, (1 << 64) - 1, 1 << 64, 10**30, 10**400,
    1e300, 1e308, float("inf"), float("-inf"), float("nan"), True, False, None, "", "\udc80",
    "\ud800", "a\x00b", "1.2.3", "1e999", "9" * 400, "ab" * 16, "x" * 5000, [], {}, [5],
    {"": None}, [[[[1]]]], _DEEP]


def _slots(doc: Any, cap: int = 4000) -> list[tuple[Any, Any]]:
    """Every (container, key) of ``doc``, depth first, at most ``cap``."""
    out: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo and len(out) < cap:
        node = todo.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node))
        for k in keys:
            out.append((node, k))
            if isinstance(node[k], dict | list):
                todo.append(node[k])
    return out


def edit_tree(doc: Any, program: bytes) -> Any:
    """``doc`` (decoded JSON, msgpack or TOML) edited in place by ``program``, three bytes an
    edit (where, what, how much): a value swapped for a nasty one, a member dropped, a
    member put in, a value wrapped in a list, turned into text (or text into a number), or
    another value copied over it. Returns the edited document."""
    root = [doc]  # the document itself is a slot too
    for i in range(0, len(program) - 2, 3):
        where, what, much = program[i], program[i + 1], program[i + 2]
        slots = _slots(root)
        node, key = slots[where * len(slots) // 256]
        nasty = NASTY_VALUES[much % len(NASTY_VALUES)]
        match what % 6:
            case 0:
                node[key] = nasty
            case 1 if node is not root:
                del node[key]
            case 2 if isinstance(node[key], dict):
                node[key][KEYS.elements[much % len(KEYS.elements)]] = nasty
            case 2 if isinstance(node[key], list):
                node[key].insert(much % (len(node[key]) + 1), nasty)
            case 3:
                node[key] = [node[key]]
            case 4:
                value = node[key]
                node[key] = len(value) if isinstance(value, str) else json.dumps(
                    value, default=str)[:64]
            case _:
                other = slots[much * len(slots) // 256]
                node[key] = copy.deepcopy(other[0][other[1]])
    return root[0]


def _json_dumps(doc: Any) -> bytes:
    text = json.dumps(doc, default=str, allow_nan=True)
    return text.replace(json.dumps(_DEEP), "[" * 3000 + "]" * 3000).encode()


def edit_recorded(seed: bytes, program: bytes, loads: Any = json.loads,
                  dumps: Any = _json_dumps) -> bytes:
    """One recorded input edited: by ``program``'s first byte, its bytes (``mutate``), its
    decoded tree (``edit_tree``, re-encoded with ``dumps``), or both (the tree, then the
    bytes). A seed ``loads`` cannot decode gets byte edits only."""
    how, program = (program[0] % 3, program[1:]) if program else (0, b"")
    if how:
        try:
            doc = loads(seed)
        except Exception:  # not a document: bytes it is
            how = 0
        else:
            half = program if how == 1 else program[:len(program) // 2]
            try:
                seed = dumps(edit_tree(doc, half))
            except (TypeError, ValueError, OverflowError, RecursionError):
                return seed  # what the encoder cannot hold (copies nested in copies)
            program = b"" if how == 1 else program[len(program) // 2:]
    return mutate(seed, program)


def recorded(seeds: list[bytes], edits: int = 6, loads: Any = json.loads,
             dumps: Any = _json_dumps) -> st.SearchStrategy[bytes]:
    """Recorded real inputs edited as bytes and as decoded documents (``edit_recorded``):
    two draws an input, as cheap as ``mutated``, and its nasty values land where a number
    or a text is due, not only between bytes."""
    return st.builds(lambda seed, program: edit_recorded(seed, program, loads, dumps),
                     st.sampled_from(seeds), st.binary(max_size=3 * edits + 1))


def capture_lines(*names: str) -> list[bytes]:
    """The non-empty lines of recorded captures (``tests/fixtures/captures``) as bytes."""
    return [ln for name in names for ln in (FIXTURES / "captures" / name).read_bytes(
        ).splitlines() if ln.strip()]
