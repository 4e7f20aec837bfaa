"""vLLM's KV-event wire format (msgspec msgpack) in both generations.

- current (default): each event is a msgpack map tagged `"type"` (vLLM PR #42892), with
  fields equal to their default omitted; the batch stays a positional array
  `[ts, events, data_parallel_rank]`.
- legacy: events are positional arrays whose first element is the tag (`array_like=True`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from mmlens.demo.prefix_cache import AllCleared, Event, RemovedBlocks, StoredBlocks

MEDIUM_GPU = "GPU"


# Each event's fields are declared once, in vLLM's order (the legacy array layout); the two
# wire generations below differ only in their msgspec options.
class _StoredFields(msgspec.Struct):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[tuple[str, int]] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _RemovedFields(msgspec.Struct):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class BlockStored(_StoredFields, tag=True, omit_defaults=True):
    pass


class BlockRemoved(_RemovedFields, tag=True, omit_defaults=True):
    pass


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class LegacyBlockStored(_StoredFields, tag="BlockStored", array_like=True):
    pass


class LegacyBlockRemoved(_RemovedFields, tag="BlockRemoved", array_like=True):
    pass


class LegacyAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


_GENERATIONS = {
    False: (BlockStored, BlockRemoved, AllBlocksCleared),
    True: (LegacyBlockStored, LegacyBlockRemoved, LegacyAllBlocksCleared),
}


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()


def to_wire(event: Event, legacy: bool) -> msgspec.Struct:
    stored, removed, cleared = _GENERATIONS[legacy]
    if isinstance(event, StoredBlocks):
        return stored(
            block_hashes=event.block_hashes,
            parent_block_hash=event.parent_block_hash,
            token_ids=event.token_ids,
            block_size=event.block_size,
            lora_id=None,
            medium=MEDIUM_GPU,
            lora_name=None,
            extra_keys=event.extra_keys,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )
    if isinstance(event, RemovedBlocks):
        return removed(block_hashes=event.block_hashes, medium=MEDIUM_GPU, group_idx=0)
    if isinstance(event, AllCleared):
        return cleared()
    raise TypeError(f"unknown event {event!r}")


def encode_batch(ts: float, events: list[Event], legacy: bool, dp_rank: int = 0) -> bytes:
    batch = KVEventBatch(ts=ts, events=[to_wire(e, legacy) for e in events],
                         data_parallel_rank=dp_rank)
    return _encoder.encode(batch)


# --- SGLang ---------------------------------------------------------------------------------
# SGLang's structs (python/sglang/srt/disaggregation/kv_events.py): array_like, int64 hashes,
# one BlockStored / BlockRemoved per page, no extra_keys, `attn_dp_rank` on the batch.


class SglangBlockStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SglangBlockRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[int]
    medium: str | None = None


class SglangEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


def signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def sglang_pages(event: Event) -> list[msgspec.Struct]:
    """One SGLang event per page of a demo event."""
    if isinstance(event, StoredBlocks):
        bs, out = event.block_size, []
        parent = event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            out.append(SglangBlockStored(
                [signed64(h)], None if parent is None else signed64(parent),
                event.token_ids[i * bs:(i + 1) * bs], bs, None, MEDIUM_GPU))
            parent = h
        return out
    if isinstance(event, RemovedBlocks):
        return [SglangBlockRemoved([signed64(h)], MEDIUM_GPU) for h in event.block_hashes]
    return [LegacyAllBlocksCleared()]


def encode_sglang_batch(ts: float, events: list[Event], dp_rank: int = 0) -> bytes:
    pages = [p for e in events for p in sglang_pages(e)]
    return _encoder.encode(SglangEventBatch(ts=ts, events=pages, attn_dp_rank=dp_rank))
