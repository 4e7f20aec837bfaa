"""Units of the Dynamo demo worker that need no running Dynamo."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mmlens.demo.dynamo_kv_sink import DynamoKvSink, FanOut, signed64
from mmlens.demo.prefix_cache import AllCleared, MediaSpan, RemovedBlocks, StoredBlocks


class FakePublisher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def publish_stored(self, **kw: Any) -> None:
        self.calls.append(("stored", kw))

    def publish_removed(self, hashes: list[int]) -> None:
        self.calls.append(("removed", hashes))


def test_signed64() -> None:
    assert signed64(0) == 0
    assert signed64((1 << 63) - 1) == (1 << 63) - 1
    assert signed64(1 << 63) == -(1 << 63)
    assert signed64((1 << 64) - 1) == -1


def test_sink_converts_and_counts() -> None:
    sink = DynamoKvSink()
    stored = StoredBlocks(block_hashes=[(1 << 64) - 1, 5], parent_block_hash=1 << 63,
                          token_ids=list(range(32)), block_size=16, extra_keys=[None, None])
    asyncio.run(sink.publish([stored]))
    assert sink.counts["dropped"] == 1  # before the runtime hands over its publisher
    pub = FakePublisher()
    sink.attach(pub)
    asyncio.run(sink.publish([stored, RemovedBlocks([1 << 63]), AllCleared()]))
    kind, kw = pub.calls[0]
    assert kind == "stored" and kw["block_hashes"] == [-1, 5]
    assert kw["parent_hash"] == -(1 << 63) and kw["num_block_tokens"] == [16, 16]
    assert kw["token_ids"] == list(range(32))
    assert pub.calls[1] == ("removed", [-(1 << 63)])
    assert sink.counts == {"stored_blocks": 2, "removed_blocks": 1, "cleared": 1,
                           "dropped": 1, "errors": 0}


def test_fanout_forwards_notifications_to_sinks_that_take_them() -> None:
    seen: list[str] = []

    class WithLoad:
        async def publish(self, events: list[Any]) -> None:
            seen.append(f"publish {len(events)}")

        def load_changed(self) -> None:
            seen.append("load")

    fan = FanOut([DynamoKvSink(), WithLoad()])
    asyncio.run(fan.publish([AllCleared()]))
    fan.load_changed()
    FanOut([DynamoKvSink()]).load_changed()  # nobody takes it: a no-op
    assert seen == ["publish 1", "load"]
    with pytest.raises(AttributeError):
        _ = fan._private


def test_engine_helpers() -> None:
    engine = pytest.importorskip("mmlens.demo.dynamo_engine", reason="needs the Dynamo extra")
    assert engine.vllm_uuid("ABCDEF0123456789") == "abcdef0123456789" + "0" * 48
    req = {"token_ids": [1], "multi_modal_data": {"image_url": [
        {"Url": "data:image/png;base64,AA=="}, {"url": "http://127.0.0.1/a.png"}, "x"]}}
    assert engine.image_urls(req) == ["data:image/png;base64,AA==", "http://127.0.0.1/a.png",
                                      "x"]
    ids = [7, 9, 9, 9, 8, 9, 9]
    spans = [MediaSpan("a", 1, 3), MediaSpan("b", 5, 2)]
    assert engine.normalize_image_runs(ids, spans, 9, [100, None]) == [7, 100, 100, 100, 8,
                                                                       9, 9]
