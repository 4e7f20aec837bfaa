"""The recorded workload the what-if models and `mmlens replay` read, built by one store read
from what each source really stores: mmlens' own traces (with and without a layout), the
tap's records (parts only) and a log-only record; every field nobody told is named unknown."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.ingest.observed import fragment, put
from mmlens.ingest.tap_parse import Exchange, exchange_trace
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace, Verdict
from mmlens.store.open import open_store
from mmlens.store.reader import StoreReader
from mmlens.whatif.workload import missing_counts

T0 = 1_800_000_000.0
RED = synthetic_png("solid", 64, 64, rgb=(200, 30, 30))
BLUE = synthetic_png("solid", 224, 224, rgb=(30, 30, 200))  # also 64 image tokens (Qwen3-VL)


def _sent(rid: str, ts: float, text: str, images: list[bytes], layout: bool = True,
          ) -> RequestTrace:
    t = RequestTrace(request_id=rid, router="http://r", router_kind="smg", model="m", ts=ts,
                     stream=False, status=200, worker="grpc://w1", prompt_tokens=81,
                     cached_tokens=64, completion_tokens=8, processing_mode="router")
    TraceSink(layout_model="qwen3-vl" if layout else None).describe(
        t, SentRequest(text, [ImagePart(d) for d in images]))
    return t


def _tapped(rid: str, ts: float) -> RequestTrace:
    url = "data:image/png;base64," + base64.b64encode(RED).decode()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is this?"}]}]}).encode()
    reply = json.dumps({"id": "c1", "usage": {"prompt_tokens": 81, "completion_tokens": 3}})
    ex = Exchange(ts=ts, t0=ts, body=body, client_request_id=rid, status=200,
                  headers={"x-smg-routed-worker-id": "grpc://w2",
                           "content-type": "application/json"})
    ex.chunks = [(0.01, reply.encode())]
    return exchange_trace(ex, "http://r")[2]


def _logged(rid: str, ts: float) -> RequestTrace:
    t = fragment(rid, "router_log", ts, "smg", "http://r")
    put(t, "worker", "grpc://w1", "router_log")
    return t


def _store(tmp_path: Path) -> Path:
    db = tmp_path / "w.db"
    store = open_store(db)
    store.add_traces([
        _sent("full-red", T0 + 1, "Describe this image.", [RED]),
        _sent("full-blue", T0 + 2, "Describe this image.", [BLUE]),
        _sent("no-layout", T0 + 3, "Describe this image.", [RED], layout=False),
        _tapped("tap-1", T0 + 4),
        _logged("log-1", T0 + 5),
        _sent("outside", T0 + 100, "late", []),
    ])
    store.add_verdicts([Verdict("full-blue", T0 + 2, "false_hit", "content-blind match")])
    store.close()
    return db


def test_each_source_gives_what_it_holds_and_names_the_rest(tmp_path: Path) -> None:
    reader = StoreReader(_store(tmp_path))
    try:
        reqs = reader.workload(T0, T0 + 10)
        span = reader.trace_span()
    finally:
        reader.close()
    assert span == (T0 + 1, T0 + 100)
    by_id = {r.request_id: r for r in reqs}
    assert [r.request_id for r in reqs] == ["full-red", "full-blue", "no-layout", "tap-1",
                                            "log-1"]
    red, blue = by_id["full-red"], by_id["full-blue"]
    # A full layout: keys per block, content-blind shapes equal for two same-size images,
    # content keys different from the image's first block on.
    assert red.keys is not None and blue.keys is not None and red.keys.block_size == 16
    assert red.keys.shapes == blue.keys.shapes
    first = red.keys.first_image_block
    assert first is not None and red.keys.content[:first] == blue.keys.content[:first]
    assert red.keys.content[first] != blue.keys.content[first]
    assert red.images[0].tokens == blue.images[0].tokens == 64
    assert red.images[0].identity != blue.images[0].identity
    assert sum(s.length for s in red.segments or ()) == len(red.keys.content) * 16 + (
        sum(s.length for s in red.segments or ()) % 16)
    assert blue.verdict == "false_hit" and red.verdict is None
    assert "verdict" in red.unknown and "keys" not in red.unknown
    # Sent without a layout model: images sized and identified, no token layout.
    plain = by_id["no-layout"]
    assert plain.keys is None and plain.segments is None and plain.images[0].tokens is None
    assert plain.images[0].identity == red.images[0].identity  # the same bytes
    assert {"keys", "segments", "images"} <= set(plain.unknown)
    # The tap: parts in characters, the worker from the router's header; SMG omits
    # prompt_tokens_details when nothing was cached, which the tap reads as 0.
    tap = by_id["tap-1"]
    assert tap.text_chars == (len("What is this?"),) and tap.keys is None
    assert tap.worker == "grpc://w2" and tap.prompt_tokens == 81 and tap.cached_tokens == 0
    assert tap.images[0].identity == red.images[0].identity and tap.images[0].tokens is None
    assert {"keys", "segments", "images"} <= set(tap.unknown)
    # A router log line alone: arrival and worker, nothing of the prompt.
    log = by_id["log-1"]
    assert log.worker == "grpc://w1" and log.images == ()
    assert {"prompt_tokens", "keys", "segments", "cached_tokens"} <= set(log.unknown)
    missing = missing_counts(reqs)
    assert missing["keys"] == 3 and missing["verdict"] == 4
