"""The simulated engine: admission, prefix-cache lookup, latency model, deterministic output.

Both front ends (gRPC and HTTP) hand it an already expanded prompt plus the images' spans and
iterate over its token stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.demo.kv_publisher import KvPublisher
from mmlens.demo.prefix_cache import Allocation, Event, MediaSpan, PrefixCache
from mmlens.demo.worker_metrics import WorkerMetrics


@dataclass
class LatencyModel:
    """TTFT = base + uncached tokens / prefill rate; one decode step per output token."""

    base_s: float = 0.003
    prefill_tokens_per_s: float = 40_000.0
    decode_tokens_per_s: float = 400.0
    speed: float = 1.0

    def ttft(self, uncached: int) -> float:
        return (self.base_s + uncached / self.prefill_tokens_per_s) / self.speed

    def tpot(self) -> float:
        return 1.0 / self.decode_tokens_per_s / self.speed


@dataclass
class RequestResult:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str = "stop"


class EngineError(RuntimeError):
    pass


class Engine:
    def __init__(self, cache: PrefixCache, publisher: KvPublisher, metrics: WorkerMetrics,
                 answer_ids: Sequence[int], latency: LatencyModel | None = None,
                 max_model_len: int = 131072, mm_cache_items: int = 256,
                 request_log: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cache = cache
        # Each finished request's own stats (prompt and cached tokens), as a real engine's
        # per-request log line: the ground truth tests compare mmlens' verdicts with.
        self.request_log = request_log
        self.publisher = publisher
        self.metrics = metrics
        self.answer_ids = list(answer_ids)
        self.latency = latency or LatencyModel()
        self.max_model_len = max_model_len
        self.running = 0
        self.waiting = 0
        self.active: set[str] = set()
        self._freed = asyncio.Event()  # replaced each time a request releases its blocks
        # vLLM schedules its waiting queue first come, first served: a request that waits
        # for free blocks holds back the ones that came after it
        self._admission = asyncio.Lock()
        self.aborted: set[str] = set()
        self.gen_tokens_total = 0
        self.query_tokens_total = 0
        self.hit_tokens_total = 0
        self._mm_seen: OrderedDict[str, None] = OrderedDict()
        self._mm_cache_items = mm_cache_items

    def _mm_lookup(self, media: Sequence[MediaSpan]) -> None:
        for m in media:
            self.metrics.lv(self.metrics.mm_queries).inc()
            if m.identifier in self._mm_seen:
                self.metrics.lv(self.metrics.mm_hits).inc()
                self._mm_seen.move_to_end(m.identifier)
            else:
                self._mm_seen[m.identifier] = None
                if len(self._mm_seen) > self._mm_cache_items:
                    self._mm_seen.popitem(last=False)

    def _answer(self, prompt: Sequence[int], max_tokens: int) -> tuple[list[int], str]:
        digest = hashlib.blake2b(repr(list(prompt)).encode(), digest_size=8).digest()
        start = int.from_bytes(digest, "big") % max(1, len(self.answer_ids) // 2)
        natural = self.answer_ids[start : start + 24] or self.answer_ids[:24]
        if max_tokens < len(natural):
            return natural[:max_tokens], "length"
        return natural, "stop"

    def abort(self, request_ids: list[str]) -> None:
        self.aborted.update(r for r in request_ids if r in self.active)

    def cache_hit_rate(self) -> float:
        return self.hit_tokens_total / self.query_tokens_total if self.query_tokens_total else 0.0

    def _gauges(self) -> None:
        m = self.metrics
        m.lv(m.running).set(self.running)
        m.lv(m.waiting).set(self.waiting)
        m.lv(m.kv_usage).set(self.cache.usage())

    async def _allocate(self, prompt: Sequence[int], media: Sequence[MediaSpan],
                        max_tokens: int) -> Allocation:
        """The prompt's blocks, once they fit; what was stored is published."""
        if not prompt:
            raise EngineError("prompt is empty")
        if len(prompt) + max_tokens > self.max_model_len:
            raise EngineError(
                f"prompt of {len(prompt)} tokens plus max_tokens {max_tokens} exceeds "
                f"max_model_len {self.max_model_len}")
        events: list[Event] = []
        async with self._admission:
            while True:
                try:
                    alloc = self.cache.allocate(prompt, media, events)
                    break
                except MemoryError as exc:
                    if self.running == 0:
                        raise EngineError(
                            f"prompt of {len(prompt)} tokens does not fit in the KV cache "
                            f"({self.cache.num_blocks} blocks of {self.cache.block_size})",
                        ) from exc
                    # Wait, as vLLM's scheduler does, until a running request frees blocks.
                    freed = self._freed
                    self.waiting += 1
                    self._gauges()
                    try:
                        await freed.wait()
                    finally:
                        self.waiting -= 1
            await self.publisher.publish(events)
        return alloc

    def _admit(self, request_id: str, prompt: Sequence[int], media: Sequence[MediaSpan],
               alloc: Allocation) -> RequestResult:
        """Count the request as running and its prompt's cache lookup."""
        m = self.metrics
        self._mm_lookup(media)
        self.running += 1
        self.active.add(request_id)
        self._gauges()
        self.publisher.load_changed()
        result = RequestResult(prompt_tokens=len(prompt), cached_tokens=alloc.cached_tokens)
        self.query_tokens_total += len(prompt)
        self.hit_tokens_total += alloc.cached_tokens
        m.lv(m.prefix_queries).inc(len(prompt))
        m.lv(m.prefix_hits).inc(alloc.cached_tokens)
        m.lv(m.prompt_tokens).inc(len(prompt))
        m.lv(m.prompt_tokens_cached).inc(alloc.cached_tokens)
        m.lv(m.request_prompt_tokens).observe(len(prompt))
        return result

    def _release(self, request_id: str, alloc: Allocation) -> None:
        self.cache.release(alloc)
        self.aborted.discard(request_id)
        self.active.discard(request_id)
        self.running -= 1
        self._gauges()
        self.publisher.load_changed()
        self._freed.set()
        self._freed = asyncio.Event()

    async def run(self, request_id: str, prompt: Sequence[int], media: Sequence[MediaSpan],
                  max_tokens: int) -> AsyncIterator[tuple[list[int], RequestResult]]:
        """Yield (new token ids, running result) per decode step; the last has finish set."""
        t0, started = time.monotonic(), time.time()
        alloc = await self._allocate(prompt, media, max_tokens)
        result = self._admit(request_id, prompt, media, alloc)
        admitted = time.time()
        m = self.metrics
        try:
            await asyncio.sleep(self.latency.ttft(len(prompt) - alloc.cached_tokens))
            events: list[Event] = []
            self.cache.commit(alloc, events)
            await self.publisher.publish(events)
            m.lv(m.ttft).observe(time.monotonic() - t0)
            output, finish = self._answer(prompt, max_tokens)
            for i, tok in enumerate(output):
                if request_id in self.aborted:
                    result.finish_reason = "abort"
                    break
                if i:
                    await asyncio.sleep(self.latency.tpot())
                events = []
                try:
                    self.cache.extend(alloc, [tok], events)
                except MemoryError:  # no block for the next token: stop here
                    result.finish_reason = "length"
                    break
                await self.publisher.publish(events)
                result.output_ids.append(tok)
                self.gen_tokens_total += 1
                m.lv(m.generation_tokens).inc()
                last = i == len(output) - 1
                if last:
                    result.finish_reason = finish
                yield [tok], result
            if len(result.output_ids) < len(output) or not output:
                yield [], result  # ended early (abort, no room) or nothing to say
            m.success.labels(model_name=m._lv["model_name"], engine="0",
                             finished_reason=result.finish_reason).inc()
            m.lv(m.e2e).observe(time.monotonic() - t0)
        finally:
            self._release(request_id, alloc)
            if self.request_log is not None:
                self.request_log({
                    "event": "request_finished", "request_id": request_id,
                    "prompt_tokens": result.prompt_tokens,
                    "cached_tokens": result.cached_tokens,
                    "output_tokens": len(result.output_ids),
                    "finish_reason": result.finish_reason, "arrived": started,
                    "admitted": admitted, "finished": time.time()})
