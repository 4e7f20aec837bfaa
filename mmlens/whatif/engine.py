"""A model of an engine's paged prefix cache (vLLM's block pool; the demo's engines do the
same): full blocks keyed by content keys, a capacity in blocks, LRU eviction of free blocks.

- A request's hit is the longest run of its leading blocks cached when it is admitted, at
  most ``(prompt − 1) // block_size`` blocks (the last prompt token is always recomputed).
- Its new prompt blocks become cached when its prefill ends (``commit``): a request admitted
  before then, even on the same worker, does not hit them. A block another request committed
  meanwhile stays the other's.
- Its output tokens take blocks too; their keys never recur.
- On release its blocks are freed tail first, so a shared prefix outlives the suffixes that
  follow it. Eviction takes the least recently used free block.

Not modelled: blocks pinned by running requests (a full cache of running requests makes the
engine queue or refuse; here it evicts), preemption, CPU/disk offload tiers, and hash
collisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Evicted = Callable[[int, int, int], None]
"""Told of each evicted block: worker, content key, blind key."""


@dataclass(slots=True)
class Admission:
    worker: int
    hit_blocks: int
    new: tuple[int, ...]  # content keys of the prompt blocks to commit
    new_blind: tuple[int, ...]
    held: int  # blocks it holds outside the cache (until commit, then the rest until release)


class EngineCache:
    """One worker's cache. ``cached`` maps a content key to its blind key, oldest first."""

    __slots__ = ("cached", "capacity", "evictions", "held", "on_evict", "worker")

    def __init__(self, worker: int, capacity_blocks: int, on_evict: Evicted | None = None,
                 ) -> None:
        self.worker = worker
        self.capacity = capacity_blocks
        self.cached: OrderedDict[int, int] = OrderedDict()
        self.held = 0  # blocks running requests hold outside ``cached``
        self.on_evict = on_evict
        self.evictions = 0

    def hit_blocks(self, content: tuple[int, ...], max_hit: int) -> int:
        cached = self.cached
        n = 0
        for key in content[:max_hit]:
            if key not in cached:
                break
            n += 1
        return n

    def admit(self, content: tuple[int, ...], blind: tuple[int, ...], tokens: int,
              output: int, block_size: int) -> Admission:
        hits = self.hit_blocks(content, max(tokens - 1, 0) // block_size)
        cached = self.cached
        for key in content[:hits]:
            cached.move_to_end(key)
        needed = -(-(tokens + output) // block_size) - hits
        self._make_room(needed)
        self.held += needed
        return Admission(self.worker, hits, content[hits:], blind[hits:], needed)

    def commit(self, a: Admission) -> tuple[list[int], list[int]]:
        """The prompt's new blocks cached after prefill: the (content, blind) keys stored
        (a block another request committed first is not stored again: it stays held)."""
        cached = self.cached
        stored, stored_blind = [], []
        for key, b in zip(a.new, a.new_blind, strict=True):
            if key in cached:
                continue
            cached[key] = b
            stored.append(key)
            stored_blind.append(b)
        a.held -= len(stored)
        self.held -= len(stored)
        return stored, stored_blind

    def release(self, a: Admission, prompt: tuple[int, ...]) -> None:
        """Blocks freed tail first: the prompt's blocks become the most recently used, the
        shared prefix last of all; its other blocks (partial tail, output) free uncached."""
        self.held -= a.held
        a.held = 0
        cached = self.cached
        for key in reversed(prompt):
            if key in cached:
                cached.move_to_end(key)

    def _make_room(self, needed: int) -> None:
        cached = self.cached
        over = len(cached) + self.held + needed - self.capacity
        while over > 0 and cached:
            key, blind = cached.popitem(last=False)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(self.worker, key, blind)
            over -= 1
