"""The fast way through a well-formed KV batch: decoded into typed events with the token ids
left as msgpack bytes (turned into one ``array('I')`` per event, no int object per token).

It gives exactly the events ``normalize_batch`` gives, or None for a batch it does not take
(a map-encoded batch, a field of an unexpected type, bytes hashes, a number out of range, an
unknown tag, ...): such a batch goes the generic way, which counts each bad event alone.
``tests/core/test_kv_native.py`` holds the two ways equal. Where it is built, a compiled
reader (``_kvbatch.c``) takes the layouts engines send first, straight from the bytes, and
leaves any other batch to the msgspec way here (``typed_batch``, its reference:
``tests/core/test_kv_batch.py``).
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from mmlens.ingest.kv_events import (
    MASK64,
    MAX_BLOCK_SIZE,
    MAX_TS,
    _images_of,
    image_refs,
)
from mmlens.layout.content_keys import native
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

try:
    from mmlens.ingest._kvbatch import decode_batch as batch_native
except ImportError:
    batch_native = None

_EMPTY = msgspec.Raw(b"\x90")


class _MapStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[int]
    token_ids: msgspec.Raw
    block_size: Any
    parent_block_hash: int | None = None
    medium: Any = None
    lora_name: Any = None
    extra_keys: Any = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[int]
    medium: Any = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


class _ArrayStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: Any
    lora_id: Any = None
    medium: Any = None
    lora_name: Any = None
    extra_keys: Any = None


class _ArrayRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[int]
    medium: Any = None


class _ArrayCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


class _MapEvents(msgspec.Struct, array_like=True):
    ts: float
    events: list[_MapStored | _MapRemoved | _MapCleared]
    rank: Any = None


class _ArrayEvents(msgspec.Struct, array_like=True):
    ts: float
    events: list[_ArrayStored | _ArrayRemoved | _ArrayCleared]
    rank: Any = None


_DECODERS = (msgspec.msgpack.Decoder(_MapEvents), msgspec.msgpack.Decoder(_ArrayEvents))
_token_list = msgspec.msgpack.Decoder(list[int])


def tokens_of(raw: msgspec.Raw) -> array | None:
    """The token ids of a msgpack array as ``array('I')``; None unless every one is an int in
    [0, 2^32)."""
    out = array("I")
    if native is not None:
        buf = native.u32_tokens(raw)
        if buf is None:
            return None
        out.frombytes(buf)
        return out
    try:
        out.fromlist(_token_list.decode(raw))
    except (msgspec.DecodeError, OverflowError):
        return None
    return out


def _hashes(values: list[int]) -> list[int]:
    """Block hashes as unsigned 64-bit (SGLang's are signed; msgpack holds no int outside
    [-2^63, 2^64))."""
    if not values or min(values) >= 0:
        return values
    return [v & MASK64 for v in values]


def _images(extra: Any) -> list[Any] | None:
    if native is not None:
        return native.images_of(extra, image_refs)
    return _images_of(extra)


def fast_batch(payload: bytes, worker: str, seq: int, default_rank: int = 0,
               ) -> tuple[float, int, list[KVEvent]] | None:
    """``(ts, rank, events)`` of a well-formed batch, or None (see the module)."""
    if batch_native is not None:
        got = batch_native(payload, worker, seq, default_rank, BlockStored, BlockRemoved,
                           AllBlocksCleared, array)
        if got is not None:
            return got
    return typed_batch(payload, worker, seq, default_rank)


def typed_batch(payload: bytes, worker: str, seq: int, default_rank: int = 0,
                ) -> tuple[float, int, list[KVEvent]] | None:
    """``fast_batch`` by msgspec's typed decode."""
    batch = None
    for decoder in _DECODERS:
        try:
            batch = decoder.decode(payload)
            break
        except (msgspec.DecodeError, RecursionError):
            continue
    if batch is None:
        return None
    ts, rank = batch.ts, batch.rank
    if not 0 <= ts <= MAX_TS:
        return None
    if rank is None:
        rank = default_rank
    elif type(rank) is not int or not 0 <= rank <= 65535:
        return None
    out: list[KVEvent] = []
    for idx, raw in enumerate(batch.events):
        rec: KVEvent
        if type(raw) is _MapStored or type(raw) is _ArrayStored:
            bs = raw.block_size
            tokens = tokens_of(raw.token_ids)
            if type(bs) is not int or not 0 < bs <= MAX_BLOCK_SIZE or tokens is None:
                return None
            parent = raw.parent_block_hash
            medium, lora, extra = raw.medium, raw.lora_name, raw.extra_keys
            try:
                images = _images(extra) if extra else None
            except ValueError:  # a bad image ref: the generic way counts it
                return None
            rec = BlockStored(worker, rank, seq, ts, _hashes(raw.block_hashes),
                              None if parent is None else parent & MASK64, tokens, bs,
                              medium if type(medium) is str else None,
                              lora if type(lora) is str else None, images, idx)
        elif type(raw) is _MapRemoved or type(raw) is _ArrayRemoved:
            medium = raw.medium
            rec = BlockRemoved(worker, rank, seq, ts, _hashes(raw.block_hashes),
                               medium if type(medium) is str else None, idx)
        else:
            rec = AllBlocksCleared(worker, rank, seq, ts, idx)
        out.append(rec)
    return ts, rank, out
