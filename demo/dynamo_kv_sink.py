"""KV events of the simulated engine, handed to Dynamo's `KvEventPublisher` (and fanned out).

Dynamo takes block hashes as signed 64-bit integers; the demo's prefix cache produces vLLM's
unsigned form. Dynamo recomputes its own per-block token hash from `token_ids`, so the ids
published here must already be in the router's pad-value form for image blocks to match.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from mmlens.demo.prefix_cache import AllCleared, Event, RemovedBlocks, StoredBlocks

_U64 = 1 << 64


def signed64(value: int) -> int:
    return value - _U64 if value >= 1 << 63 else value


class EventSink(Protocol):
    async def publish(self, events: list[Event]) -> None: ...


class DynamoKvSink:
    """Publishes demo prefix-cache events through a Dynamo `KvEventPublisher`.

    Events before `attach` (the runtime hands the publisher over after `start`) are dropped
    and counted; Dynamo's router rebuilds state from later events and its recovery dumps.
    """

    def __init__(self) -> None:
        self.publisher: Any = None
        self.counts = {"stored_blocks": 0, "removed_blocks": 0, "cleared": 0, "dropped": 0,
                       "errors": 0}
        self._lock = threading.Lock()

    def attach(self, publisher: Any) -> None:
        self.publisher = publisher

    async def publish(self, events: list[Event]) -> None:
        if not events:
            return
        if self.publisher is None:
            self.counts["dropped"] += len(events)
            return
        with self._lock:
            for ev in events:
                try:
                    self._one(ev)
                except Exception:  # a publisher error must not fail the request
                    self.counts["errors"] += 1

    def _one(self, ev: Event) -> None:
        if isinstance(ev, StoredBlocks):
            self.publisher.publish_stored(
                token_ids=list(ev.token_ids),
                num_block_tokens=[ev.block_size] * len(ev.block_hashes),
                block_hashes=[signed64(h) for h in ev.block_hashes],
                parent_hash=None if ev.parent_block_hash is None
                else signed64(ev.parent_block_hash))
            self.counts["stored_blocks"] += len(ev.block_hashes)
        elif isinstance(ev, RemovedBlocks):
            self.publisher.publish_removed([signed64(h) for h in ev.block_hashes])
            self.counts["removed_blocks"] += len(ev.block_hashes)
        elif isinstance(ev, AllCleared):
            self.counts["cleared"] += 1  # Dynamo's Python publisher has no clear-all call


class FanOut:
    """One `publish(events)` to several sinks (Dynamo, and optionally vLLM-format ZMQ)."""

    def __init__(self, sinks: Sequence[EventSink]) -> None:
        self.sinks = list(sinks)

    async def publish(self, events: list[Event]) -> None:
        for sink in self.sinks:
            await sink.publish(events)

    def __getattr__(self, name: str) -> Any:
        """Other engine notifications (e.g. `load_changed`) go to the sinks that take them;
        Dynamo learns load from the runtime itself, so the Dynamo sink ignores them."""
        if name.startswith("_"):
            raise AttributeError(name)
        methods = [getattr(s, name) for s in self.sinks if hasattr(s, name)]

        def call(*args: Any, **kwargs: Any) -> None:
            for method in methods:
                method(*args, **kwargs)

        return call
