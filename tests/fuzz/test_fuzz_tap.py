"""The tap's parsers are total: whatever a client or a router sends, an exchange becomes a record
that either reads back from the store or is what the recorder quarantines; the nvext rewrite
removes exactly the members it was asked to and nothing else; image headers never raise."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mmlens.collectors.tap_record import unreadable

from mmlens.ingest.nvext_fields import strip_members
from mmlens.ingest.tap_parse import Exchange, exchange_trace
from mmlens.layout.image_header import header_size
from tests.fuzz.strategies import DOCS, FIXTURES, SETTINGS, VALUES, mutated

pytestmark = pytest.mark.fuzz
_ids = itertools.count()

DEEP = "[" * 3000 + "]" * 3000
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
URLS = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=64).map(lambda b: "data:image/png;base64," + base64.b64encode(
        PNG_HEAD + b).decode()),
    st.sampled_from(["data:image/png;base64,!!", "data:,x", "http://h/\udc80.png", ""]))
PARTS = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("image_url"),
                           "image_url": st.one_of(st.fixed_dictionaries({"url": URLS}), URLS)}),
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(), VALUES)}),
    VALUES), max_size=4)
CHATS = st.fixed_dictionaries({"model": st.one_of(st.text(max_size=8), VALUES),
                               "stream": VALUES,
                               "messages": st.one_of(VALUES, st.lists(st.fixed_dictionaries(
                                   {"role": st.just("user"),
                                    "content": st.one_of(st.text(), PARTS)}), max_size=3))})
BODIES = st.one_of(CHATS.map(lambda d: json.dumps(d, default=str).encode()), st.binary(),
                   DOCS.map(lambda d: json.dumps(d, default=str).encode()))
CHUNKS = st.lists(st.one_of(
    DOCS.map(lambda d: b"data: " + json.dumps(d, default=str).encode() + b"\n\n"),
    st.binary(max_size=40), st.just(b"data: [DONE]\n\n")), max_size=5)


@SETTINGS
@given(body=BODIES, chunks=CHUNKS, sse=st.booleans(), trace=DOCS, worker=st.text(max_size=8))
@example(body=b'{"model":"m","x":' + DEEP.encode() + b"}", chunks=[], sse=False, trace={},
         worker="w")
@example(body=b'{"model":"\\udc80","messages":[{"role":"user","content":[{"type":"image_url",'
         b'"image_url":{"url":"http://h/\\udc80.png"}}]}]}', chunks=[], sse=False, trace={},
         worker="w")
@example(body=b"{}", chunks=[b'data: {"choices": 5}\n\n', b"data: " + DEEP.encode() + b"\n\n"],
         sse=True, trace={}, worker="w")
@example(body=b"{}", chunks=[], sse=False, trace={"selections": [{"worker": 5}]}, worker="w")
def test_tap_exchanges(store, body, chunks, sse, trace, worker) -> None:
    record_exchange(store, body, chunks, sse, json.dumps(trace, default=str), worker)


def record_exchange(store, body: bytes, chunks: list[bytes], sse: bool, trace: str,
                    worker: str) -> None:
    """What the recorder does with one exchange: the record it makes reads back from the
    store, or is one the recorder quarantines (``unreadable``)."""
    ex = Exchange(1.0, 0.0, body, None, 200, {
        "content-type": "text/event-stream" if sse else "application/json",
        "x-smg-routed-worker-id": worker, "x-smg-cache-trace": trace}, sse=sse)
    for i, c in enumerate(chunks):
        ex.add(0.001 * i, c, 1 << 20, 1 << 20)
    _, _, t = exchange_trace(ex, "u")
    if unreadable(t) is None:  # what the recorder stores: it reads back
        t.request_id, t.response_id, t.aliases = f"fuzz-{next(_ids)}", None, []
        store.add_traces([t])
        assert store.trace(t.request_id) is not None


CAPTURES = FIXTURES / "captures"
# Recorded inputs: SSE chunks of a real Dynamo stream, a real SMG cache-trace header, and
# chat requests in the OpenAI shape mmlens' scenarios send (text, data URL, http URL).
_STREAM = (CAPTURES / "dyn_stream_sample.txt").read_text().splitlines()
SSE_SEEDS = [*(ln.encode() + b"\n\n" for ln in _STREAM if ln.startswith("data: ")),
             b"data: [DONE]\n\n"]
TRACE_SEEDS = [json.dumps(json.loads((CAPTURES / "smg_cache_trace_header_sample.json"
                                      ).read_text()), separators=(",", ":")).encode()]
REQUEST_SEEDS = [json.dumps({"model": "Qwen/Qwen3-VL-2B-Instruct", "max_tokens": 4,
                             "stream": stream, "messages": [{"role": "user", "content": [
                                 {"type": "image_url", "image_url": {"url": url}},
                                 {"type": "text", "text": "What is in the image?"}]}]},
                            separators=(",", ":")).encode()
                 for stream in (False, True)
                 for url in ("data:image/png;base64," + base64.b64encode(PNG_HEAD + bytes(
                     [0, 0, 0, 16, 0, 0, 0, 16, 8, 2, 0, 0, 0])).decode(),
                             "http://127.0.0.7:18407/media/ab/a.png")]


@SETTINGS
@given(body=mutated(REQUEST_SEEDS), chunks=st.lists(mutated(SSE_SEEDS), max_size=4),
       trace=mutated(TRACE_SEEDS), sse=st.booleans())
def test_tap_exchanges_mutated_from_recorded(store, body, chunks, trace, sse) -> None:
    record_exchange(store, body, chunks, sse, trace.decode("latin-1"), "w")


NV = st.fixed_dictionaries({}, optional={"worker_id": VALUES, "timing": VALUES,
                                         "other": VALUES})


@SETTINGS
@given(doc=DOCS, nvext=NV, drop=st.sets(st.sampled_from(["worker_id", "timing"]), min_size=1),
       spaced=st.booleans())
def test_nvext_members_are_cut_and_nothing_else(doc, nvext, drop, spaced) -> None:
    doc = {**doc, "nvext": nvext}
    seps = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(doc, separators=seps, default=str).encode()
    want = {k: v for k, v in json.loads(text).items()}
    kept = {k: v for k, v in want["nvext"].items() if k not in drop}
    if kept:
        want["nvext"] = kept
    elif any(k in drop for k in want["nvext"]):
        del want["nvext"]
    assert json.loads(strip_members(text, frozenset(drop))) == want


@SETTINGS
@given(raw=st.binary(max_size=200))
@example(raw=b"\xff\xd8" + b"\xff\xc0\x00\x11\x08" + b"\xff" * 10 + b"\xff\xd9")
@example(raw=b"RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f")
def test_image_headers_never_raise(raw) -> None:
    for data in (raw, PNG_HEAD + raw, b"GIF89a" + raw, b"BM" + raw):
        size = header_size(data)
        assert size is None or (size[0] > 0 and size[1] > 0)


@SETTINGS
@given(raw=st.binary(max_size=80), drop=st.sets(st.sampled_from(["worker_id", "timing"])))
def test_nvext_rewrite_of_garbage_returns_it_unchanged_or_shorter(raw, drop) -> None:
    out = strip_members(raw, frozenset(drop))
    assert out == raw or len(out) < len(raw)
