"""The tap's parsers are total: whatever a client or a router sends, an exchange becomes a record
that either reads back from the store or is what the recorder quarantines; the nvext rewrite
removes exactly the members it was asked to and nothing else; image headers never raise."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st
from mmlens.collectors.tap_record import unreadable

from mmlens.ingest.nvext_fields import strip_members
from mmlens.ingest.tap_parse import Exchange, exchange_trace
from mmlens.layout.image_header import header_size
from tests.fuzz.strategies import FIXTURES, NASTY_VALUES, QUARANTINED, SETTINGS, recorded

pytestmark = pytest.mark.fuzz
_ids = itertools.count()

DEEP = "[" * 3000 + "]" * 3000
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


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
    else:
        event(QUARANTINED)


CAPTURES = FIXTURES / "captures"
# What a router may put in nvext: recorded-shaped values and the nasty ones (not the deep
# marker: json.loads would not give it back as it was).
NV_VALUES = st.one_of(st.sampled_from([v for v in NASTY_VALUES
                                       if v != "\x00deep\x00" and v == v]),
                      st.dictionaries(st.sampled_from(["prefill_ms", "ttft", "x"]),
                                      st.floats(allow_nan=False), max_size=2))
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
@given(body=recorded(REQUEST_SEEDS), chunks=st.lists(recorded(SSE_SEEDS), max_size=4),
       trace=recorded(TRACE_SEEDS), sse=st.booleans(), worker=st.sampled_from(
           ["w", "grpc://127.0.0.1:18410", "\udc80", "", "7587890000000001"]))
@example(body=b'{"model":"m","x":' + DEEP.encode() + b"}", chunks=[], trace=b"{}", sse=False,
         worker="w")
@example(body=b'{"model":"\\udc80","messages":[{"role":"user","content":[{"type":"image_url",'
         b'"image_url":{"url":"http://h/\\udc80.png"}}]}]}', chunks=[], trace=b"{}", sse=False,
         worker="w")
@example(body=b"{}", chunks=[b'data: {"choices": 5}\n\n', b"data: " + DEEP.encode() + b"\n\n"],
         trace=b"{}", sse=True, worker="w")
@example(body=b"{}", chunks=[], trace=b'{"selections": [{"worker": 5}]}', sse=False, worker="w")
def test_tap_exchanges(store, body, chunks, trace, sse, worker) -> None:
    """Recorded requests, SSE chunks and cache-trace headers, edited; the issue's tap inputs
    as examples."""
    record_exchange(store, body, chunks, sse, trace.decode("latin-1"), worker)


def _no_nan(name: str) -> float:
    if name == "NaN":  # it would not equal itself below
        raise ValueError(name)
    return float(name)


def _docs(seeds: list[bytes]) -> list[bytes]:
    return [s for s in seeds if s.startswith(b"{")]


NV = st.fixed_dictionaries({}, optional={"worker_id": NV_VALUES, "timing": NV_VALUES,
                                         "other": NV_VALUES})


@SETTINGS
@given(raw=recorded(REQUEST_SEEDS + _docs([c[6:] for c in SSE_SEEDS])), nvext=NV,
       drop=st.sets(st.sampled_from(["worker_id", "timing"]), min_size=1),
       spaced=st.booleans())
def test_nvext_members_are_cut_and_nothing_else(raw, nvext, drop, spaced) -> None:
    try:
        doc = json.loads(raw, parse_constant=_no_nan)
    except (ValueError, RecursionError):
        return
    if not isinstance(doc, dict):
        return
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
