"""KV events from a gRPC worker's ``SubscribeKvEvents`` stream (smg-grpc-proto ``KvEventBatch``).

The vLLM engine service and SGLang's scheduler service stream the same ``common.KvEventBatch``:
``sequence_number`` per batch, ``events`` (``stored`` / ``removed`` / ``cleared``), ``dp_rank``
and an ``EngineLoad``. A batch whose load has ``load_only`` set is a heartbeat that repeats the
last sequence number and carries no events. Block hashes are int64 on the wire (normalized to
unsigned here, as the ZMQ path does); ``extra_keys`` multimodal entries become image refs.

The messages are read by attribute only, so this module needs no gRPC import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmlens.ingest.kv_events import (
    MAX_BLOCK_SIZE,
    MAX_TS,
    KVEventError,
    image_ref,
    keyed_events,
    normalize_hash,
)
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored, ImageRef, KVEvent


@dataclass(frozen=True, slots=True)
class GrpcBatch:
    seq: int
    rank: int
    ts: float
    load_only: bool
    events: list[KVEvent]
    snapshot: bool = False


def _medium(msg: Any) -> str | None:
    return msg.medium if msg.HasField("medium") else None


def _block_images(block: Any) -> tuple[ImageRef, ...] | None:
    refs = [image_ref(k.multimodal.identifier, int(k.multimodal.offset))
            for k in block.extra_keys if k.WhichOneof("key") == "multimodal"]
    return tuple(refs) or None


def _stored(msg: Any, worker: str, rank: int, seq: int, ts: float) -> BlockStored:
    blocks = list(msg.blocks)
    if not blocks:
        raise KVEventError("bad_event", "stored without blocks")
    sizes = {b.block_size for b in blocks}
    size = blocks[0].block_size
    if len(sizes) != 1 or not 0 < size <= MAX_BLOCK_SIZE:
        raise KVEventError("bad_number", f"block_size {sorted(sizes)}")
    tokens: list[int] = []
    for b in blocks:
        tokens.extend(b.token_ids)
    images = [_block_images(b) for b in blocks]
    parent = msg.parent_block_hash if msg.HasField("parent_block_hash") else None
    return BlockStored(
        worker, rank, seq, ts, [normalize_hash(b.block_hash) for b in blocks],
        None if parent is None else normalize_hash(parent), tokens, size, _medium(msg),
        msg.lora_name if msg.HasField("lora_name") else None,
        images if any(images) else None)


def _event(ev: Any, worker: str, rank: int, seq: int, ts: float) -> KVEvent:
    kind = ev.WhichOneof("data")
    if kind == "stored":
        return _stored(ev.stored, worker, rank, seq, ts)
    if kind == "removed":
        return BlockRemoved(worker, rank, seq, ts,
                            [normalize_hash(h) for h in ev.removed.block_hashes],
                            _medium(ev.removed))
    if kind == "cleared":
        return AllBlocksCleared(worker, rank, seq, ts)
    raise KVEventError("unknown_event_tag", repr(kind))


def batch_events(batch: Any, worker: str, errors: dict[str, int] | None = None) -> GrpcBatch:
    """One streamed batch as records; bad events are counted in ``errors`` and skipped."""
    seq = int(batch.sequence_number)
    rank = int(batch.dp_rank) if batch.HasField("dp_rank") else 0
    if not 0 <= rank <= 65535:
        raise KVEventError("bad_number", f"dp rank {rank}")
    ts = float(batch.timestamp)
    if not 0 <= ts <= MAX_TS:
        raise KVEventError("bad_number", f"batch timestamp {ts!r}")
    load_only = batch.HasField("load") and batch.load.load_only
    out = keyed_events(batch.events, lambda ev: _event(ev, worker, rank, seq, ts), errors,
                       f"{worker}#{rank} seq {seq}")
    return GrpcBatch(seq, rank, ts, bool(load_only) and not out, out,
                     snapshot=batch.HasField("snapshot"))
