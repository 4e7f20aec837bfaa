"""A paged prefix cache that behaves like vLLM's block pool, and the events it emits.

- Blocks are keyed by a chained hash of (parent hash, block token ids, extra keys); image
  identity enters through `extra_keys` = [(identifier, item offset - block start)], so two
  different images with identical placeholder ids never share a block.
- Only full blocks are cached and announced (`BlockStored`). A hit emits nothing.
- As vLLM's scheduler does (``allocate_slots`` → ``cache_full_blocks``), a prompt's full
  blocks are cached and announced when they are allocated, before they are computed: a
  request allocated after it finds them. Blocks are not de-duplicated: a block computed
  again (a whole prompt cached recomputes its last block) is cached and announced beside
  the one already there (``BlockPool``: "we don't check if there is already an identical
  block in the cache"), and each block id is removed on its own.
- Freed blocks keep their hash in an LRU free queue; `BlockRemoved` is emitted only when a
  cached free block is popped for reuse (lazy eviction), as vLLM does.
- As in vLLM, a prompt never hits entirely: the last prompt token is always recomputed.
- SGLang's radix cache (``SglangPrefixCache``) inserts a prompt once its prefill ran and
  keeps one copy of a prefix: what another request computed meanwhile is not announced.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

U64 = (1 << 64) - 1


@dataclass(frozen=True)
class MediaSpan:
    """One image inside a prompt: its identifier and placeholder range."""

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True)
class StoredBlocks:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    extra_keys: list[list[tuple[str, int]] | None]


@dataclass(frozen=True)
class RemovedBlocks:
    block_hashes: list[int]


@dataclass(frozen=True)
class AllCleared:
    pass


Event = StoredBlocks | RemovedBlocks | AllCleared


@dataclass
class Allocation:
    """Blocks held by one running request."""

    block_ids: list[int]
    hashes: list[int]
    extra_keys: list[list[tuple[str, int]] | None]
    hit_blocks: int
    cached_tokens: int
    tokens: list[int]
    stored_upto: int = 0  # number of leading blocks already announced/cached


def block_extra_keys(
    start: int, end: int, media: Sequence[MediaSpan]
) -> list[tuple[str, int]] | None:
    keys = [
        (m.identifier, m.offset - start)
        for m in sorted(media, key=lambda m: m.offset)
        if m.offset < end and m.offset + m.length > start
    ]
    return keys or None


def chain_hash(parent: int | None, tokens: Sequence[int], extra: object, seed: bytes) -> int:
    payload = msgspec.msgpack.encode([parent, list(tokens), extra])
    digest = hashlib.sha256(seed + payload).digest()
    return int.from_bytes(digest, "big") & U64  # vLLM's int form: low 64 bits, unsigned


@dataclass
class PrefixCache:
    block_size: int = 16
    num_blocks: int = 4096
    seed: bytes = b"mmlens-demo"
    # hash -> its block ids, the first found by a lookup (vLLM keeps every copy)
    cached: dict[int, dict[int, None]] = field(default_factory=dict)
    block_hash: dict[int, int] = field(default_factory=dict)  # block id -> hash
    ref_count: dict[int, int] = field(default_factory=dict)
    free: OrderedDict[int, None] = field(default_factory=OrderedDict)
    # vLLM caches a prompt's blocks when it allocates them (and keeps duplicates); False:
    # once they are computed, one copy of each (SGLang's radix tree)
    stores_at_allocation: bool = True

    def __post_init__(self) -> None:
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))

    def hashes_for(self, tokens: Sequence[int], media: Sequence[MediaSpan]) -> tuple[
        list[int], list[list[tuple[str, int]] | None]
    ]:
        hashes: list[int] = []
        extras: list[list[tuple[str, int]] | None] = []
        parent: int | None = None
        bs = self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            extra = self.extra_keys(start, start + bs, media)
            parent = self.chain(parent, tokens[start : start + bs], extra)
            hashes.append(parent)
            extras.append(extra)
        return hashes, extras

    def extra_keys(self, start: int, end: int, media: Sequence[MediaSpan],
                   ) -> list[tuple[str, int]] | None:
        return block_extra_keys(start, end, media)

    def chain(self, parent: int | None, tokens: Sequence[int], extra: object) -> int:
        return chain_hash(parent, tokens, extra, self.seed)

    def usage(self) -> float:
        used = sum(1 for c in self.ref_count.values() if c > 0)
        return used / self.num_blocks

    def _first(self, h: int) -> int:
        return next(iter(self.cached[h]))

    def _take_free(self, events: list[Event]) -> int:
        if not self.free:
            raise MemoryError("KV cache is full")
        block_id, _ = self.free.popitem(last=False)
        old = self.block_hash.pop(block_id, None)
        ids = None if old is None else self.cached.get(old)
        if ids is not None and block_id in ids:  # one event per block id evicted
            del ids[block_id]
            if not ids:
                del self.cached[old]  # type: ignore[arg-type]
            events.append(RemovedBlocks([old]))  # type: ignore[list-item]
        return block_id

    def allocate(
        self, tokens: Sequence[int], media: Sequence[MediaSpan], events: list[Event]
    ) -> Allocation:
        hashes, extras = self.hashes_for(tokens, media)
        max_hit = (len(tokens) - 1) // self.block_size
        hits = 0
        for h in hashes[:max_hit]:
            if h not in self.cached:
                break
            hits += 1
        needed = -(-len(tokens) // self.block_size) - hits
        if needed > len(self.free) - sum(1 for h in hashes[:hits] if self._first(h) in self.free):
            raise MemoryError("KV cache is full")
        block_ids: list[int] = []
        for h in hashes[:hits]:
            bid = self._first(h)
            self.free.pop(bid, None)
            self.ref_count[bid] = self.ref_count.get(bid, 0) + 1
            block_ids.append(bid)
        for _ in range(needed):
            bid = self._take_free(events)
            self.ref_count[bid] = 1
            block_ids.append(bid)
        alloc = Allocation(block_ids, hashes, extras, hits, hits * self.block_size,
                           list(tokens), stored_upto=hits)
        if self.stores_at_allocation:
            self.commit(alloc, events)
        return alloc

    def commit(self, alloc: Allocation, events: list[Event]) -> None:
        """Cache the allocation's newly full blocks (vLLM: when allocated; SGLang: after
        its prefill step, keeping one copy of a block another request computed meanwhile)."""
        bs = self.block_size
        new = range(alloc.stored_upto, len(alloc.hashes))
        stored: list[int] = []
        for i in new:
            h = alloc.hashes[i]
            bid = alloc.block_ids[i]
            if h in self.cached and not self.stores_at_allocation:
                continue
            self.cached.setdefault(h, {})[bid] = None
            self.block_hash[bid] = h
            stored.append(i)
        if stored:
            first = stored[0]
            events.append(StoredBlocks(
                block_hashes=[alloc.hashes[i] for i in stored],
                parent_block_hash=alloc.hashes[first - 1] if first > 0 else None,
                token_ids=[t for i in stored for t in alloc.tokens[i * bs : (i + 1) * bs]],
                block_size=bs,
                extra_keys=[alloc.extra_keys[i] for i in stored],
            ))
        alloc.stored_upto = len(alloc.hashes)

    def extend(self, alloc: Allocation, new_tokens: Sequence[int], events: list[Event]) -> None:
        """Append decode tokens; blocks they fill are cached like prompt blocks."""
        alloc.tokens.extend(new_tokens)
        bs = self.block_size
        while len(alloc.block_ids) * bs < len(alloc.tokens):
            bid = self._take_free(events)
            self.ref_count[bid] = 1
            alloc.block_ids.append(bid)
        parent = alloc.hashes[-1] if alloc.hashes else None
        while (len(alloc.hashes) + 1) * bs <= len(alloc.tokens):
            start = len(alloc.hashes) * bs
            parent = self.chain(parent, alloc.tokens[start : start + bs], None)
            alloc.hashes.append(parent)
            alloc.extra_keys.append(None)
        self.commit(alloc, events)

    def release(self, alloc: Allocation) -> None:
        # Tail blocks are freed first, so they are evicted before the shared prefix.
        for bid in reversed(alloc.block_ids):
            self.ref_count[bid] -= 1
            if self.ref_count[bid] == 0:
                del self.ref_count[bid]
                if bid in self.block_hash:
                    self.free[bid] = None
                else:
                    self.free[bid] = None
                    self.free.move_to_end(bid, last=False)  # uncached blocks go first

    def reset(self, events: list[Event]) -> None:
        self.cached.clear()
        self.block_hash.clear()
        events.append(AllCleared())


class SglangPrefixCache(PrefixCache):
    """SGLang's page hashes: ``sha256(previous page digest ‖ uint32-le token ids)``, the event
    value being the digest's first 8 bytes as a signed int64 (kept unsigned here, signed on
    the wire). No extra keys: SGLang writes each image's pad value into the token ids."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.stores_at_allocation = False
        self.digests: dict[int, bytes] = {}

    def extra_keys(self, start: int, end: int, media: Sequence[MediaSpan]) -> None:
        return None

    def chain(self, parent: int | None, tokens: Sequence[int], extra: object) -> int:
        h = hashlib.sha256(self.digests.get(parent, b"") if parent is not None else b"")
        h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
        digest = h.digest()
        value = int.from_bytes(digest[:8], "big")
        self.digests[value] = digest
        return value
