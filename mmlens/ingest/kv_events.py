"""KV-cache events from vLLM and SGLang workers: decode and normalize (the resident index is
``kv_index``, the sequence bookkeeping ``kv_stream``).

Wire facts this module relies on (see the workers reference):
- payload = msgpack of a batch, positional ``[ts, events, dp_rank]`` or a map
  ``{ts, events, data_parallel_rank | attn_dp_rank}``;
- an event is an array whose first element is its tag (legacy ``array_like``) or a map with
  the tag under ``"type"`` (vLLM ≥ PR #42892, SGLang ≥ #37482); missing map keys mean None;
- vLLM int hashes are unsigned 64-bit, SGLang's are signed int64 (both normalized to
  unsigned here); ``bytes`` hashes (32-byte digests) are kept as lowercase hex;
- ``extra_keys`` holds one entry per block; image identity is an ``[identifier, offset]`` pair
  (vLLM main) or a bare identifier string (older vLLM).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from mmlens.records import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    ImageRef,
    KVEvent,
    count_error,
)

MASK64 = (1 << 64) - 1
MAX_SEQ = (1 << 63) - 1
MIN_INT64 = -(1 << 63)
MAX_TOKEN_ID = (1 << 32) - 1
MAX_BLOCK_SIZE = 1 << 16
# An image's offset relative to its block (content keys pack it as int32), and a batch time
# (seconds; past 2^33, the year 2242, no clock of a worker is right and PostgreSQL's
# monthly partitions cannot be named).
MAX_OFFSET = (1 << 31) - 1
MAX_TS = float(1 << 33)
END_SEQ = (-1).to_bytes(8, "big", signed=True)

_decoder = msgspec.msgpack.Decoder()


class KVEventError(ValueError):
    """A batch or event that cannot be used; ``kind`` is the health-counter key."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind


# --- decoding -------------------------------------------------------------------------------


def decode_payload(payload: bytes) -> Any:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        if "UTF-8" not in str(exc):
            raise KVEventError("undecodable_msgpack", str(exc)) from None
        # One string of the batch is not UTF-8 (an image id with a lone surrogate's escape):
        # read it with the bytes escaped, so only the event holding it is set aside.
        return _decode_escaped(payload, exc)
    except RecursionError:  # msgspec refuses nesting deeper than the interpreter allows
        raise KVEventError("too_deep", "payload nested too deeply") from None


def _decode_escaped(payload: bytes, exc: Exception) -> Any:
    import msgpack

    try:
        return msgpack.unpackb(payload, raw=False, unicode_errors="surrogateescape",
                               strict_map_key=False)
    except Exception:  # anything else wrong with it too: the batch is undecodable
        raise KVEventError("undecodable_msgpack", str(exc)) from None


def parse_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence frame of a PUB message (below 2^63: SQLite's INTEGER)."""
    if len(frame) != 8:
        raise KVEventError("truncated_frame", f"sequence frame of {len(frame)} bytes")
    seq = int.from_bytes(frame, "big")
    if seq > MAX_SEQ:
        raise KVEventError("oversize_number", f"sequence number {seq}")
    return seq


def batch_ts(payload: bytes) -> float | None:
    """The time of a batch, None when it cannot be read (replay bookkeeping)."""
    try:
        return split_batch(decode_payload(payload))[0]
    except KVEventError:
        return None


def split_batch(obj: Any) -> tuple[float, list[Any], int | None]:
    """``(ts, events, dp_rank)`` from a positional or map-encoded batch."""
    if isinstance(obj, list):
        if len(obj) < 2 or not isinstance(obj[1], list):
            raise KVEventError("bad_batch", "positional batch without an events list")
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    elif isinstance(obj, dict):
        found = obj.get("events")
        if not isinstance(found, list):
            raise KVEventError("bad_batch", "map batch without an events list")
        events = found
        ts = obj.get("ts")
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    else:
        raise KVEventError("bad_batch", f"batch is a {type(obj).__name__}")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not 0 <= ts <= MAX_TS:
        raise KVEventError("bad_number", f"batch ts {ts!r}")
    if rank is not None and (not isinstance(rank, int) or rank < 0 or rank > 65535):
        raise KVEventError("bad_number", f"dp rank {rank!r}")
    return float(ts), events, rank


# --- normalization ----------------------------------------------------------------------------


def normalize_hash(value: Any) -> BlockHash:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int) and not isinstance(value, bool):
        if value < MIN_INT64 or value > MASK64:
            raise KVEventError("oversize_number", f"block hash {value}")
        return value & MASK64
    raise KVEventError("bad_event", f"block hash of type {type(value).__name__}")


def normalize_hashes(values: Any) -> list[BlockHash]:
    if not isinstance(values, list):
        raise KVEventError("bad_event", "block_hashes is not a list")
    if not values:
        return values
    try:
        lo, hi = min(values), max(values)
        if type(lo) is int and type(hi) is int:
            if lo >= 0 and hi <= MASK64:
                return values  # already unsigned ints: the common vLLM case, no copy
            if lo >= MIN_INT64 and hi <= MASK64:  # a float in between raises TypeError
                return [v & MASK64 for v in values]  # SGLang's signed int64
    except TypeError:
        pass  # mixed or bytes: fall through to the per-item path
    return [normalize_hash(v) for v in values]


def _check_tokens(tokens: Any) -> list[int]:
    if not isinstance(tokens, list):
        raise KVEventError("bad_event", "token_ids is not a list")
    # One C pass that rejects negatives, ids ≥ 2^32 and non-integers (4× faster than min+max).
    try:
        array("I", tokens)
    except OverflowError:
        raise KVEventError("bad_number", "token id out of range") from None
    except TypeError:
        raise KVEventError("bad_event", "non-integer token id") from None
    return tokens


def checked_text(text: str, what: str) -> str:
    """``text`` if it can be written as UTF-8 (a lone surrogate such as ``\\udc80`` cannot:
    no store, hash or JSON reader takes it)."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise KVEventError("bad_text", f"{what} {text[:40]!r}") from None
    return text


def image_ref(identifier: str, offset: int | None) -> ImageRef:
    """One image of a block, checked: its identifier UTF-8, its offset within int32."""
    if offset is not None and not -MAX_OFFSET <= offset <= MAX_OFFSET:
        raise KVEventError("oversize_number", f"image offset {offset}")
    return (checked_text(identifier, "image identifier"), offset)  # type: ignore[return-value]


def _is_hex_id(text: str) -> bool:
    if len(text) < 16:
        return False
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def image_refs(entry: Any) -> tuple[ImageRef, ...] | None:
    """Image refs of one block's ``extra_keys`` entry.

    ``[["ab12…", 4]]`` → ``(("ab12…", 4),)`` (vLLM main: identifier, offset of the item
    relative to the block start, negative when the image began in an earlier block);
    ``["ab12…"]`` → ``(("ab12…", None),)`` (older vLLM); LoRA names, cache salts and other
    plain strings are not images. Plain tuples, equal to ``ImageRef`` values.
    """
    if not entry:
        return None
    if not isinstance(entry, list):
        entry = [entry]
    if len(entry) == 1:  # the common case: one image item in the block
        item = entry[0]
        if type(item) is list and len(item) == 2 and type(item[0]) is str and type(
                item[1]) is int and -MAX_OFFSET <= item[1] <= MAX_OFFSET and item[0].isascii():
            return ((item[0], item[1]),)  # type: ignore[return-value]
    refs: list[Any] = []
    for item in entry:
        if isinstance(item, list) and item and isinstance(item[0], str):
            offset = item[1] if len(item) > 1 and isinstance(item[1], int) else None
            refs.append(image_ref(item[0], offset))
        elif isinstance(item, str) and _is_hex_id(item):
            refs.append((item, None))
        elif isinstance(item, bytes) and len(item) >= 8:
            refs.append((item.hex(), None))
    return tuple(refs) or None


def _images_of(extra_keys: Any) -> list[tuple[ImageRef, ...] | None] | None:
    if not isinstance(extra_keys, list) or extra_keys.count(None) == len(extra_keys):
        return None
    images = [image_refs(e) for e in extra_keys]
    return images if any(images) else None


_TAGS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def _at(raw: list[Any], idx: int) -> Any:
    return raw[idx] if idx < len(raw) else None


def normalize_event(raw: Any, worker: str, rank: int, seq: int, ts: float) -> KVEvent:
    """One event, array-encoded (tag first, fields in declaration order) or map-encoded.

    Positional BlockStored: tag, block_hashes, parent_block_hash, token_ids, block_size,
    lora_id, medium, lora_name, extra_keys, group_idx, …; SGLang's BlockStoredWithMetadata puts
    a dict at the lora_name position, which the type checks below drop.
    """
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str) or tag not in _TAGS:
            raise KVEventError("unknown_event_tag", repr(tag)[:60])
        if tag == "BlockStored":
            return _stored(worker, rank, seq, ts, raw.get("block_hashes"),
                           raw.get("parent_block_hash"), raw.get("token_ids", []),
                           raw.get("block_size"), raw.get("medium"), raw.get("lora_name"),
                           raw.get("extra_keys"))
        if tag == "BlockRemoved":
            return _removed(worker, rank, seq, ts, raw.get("block_hashes"), raw.get("medium"))
        return AllBlocksCleared(worker, rank, seq, ts)
    if isinstance(raw, list) and raw:
        tag = raw[0]
        if not isinstance(tag, str) or tag not in _TAGS:
            raise KVEventError("unknown_event_tag", repr(tag)[:60])
        if tag == "BlockStored":
            if len(raw) < 5:
                raise KVEventError("bad_event", f"BlockStored with {len(raw)} fields")
            return _stored(worker, rank, seq, ts, raw[1], raw[2], raw[3], raw[4],
                           _at(raw, 6), _at(raw, 7), _at(raw, 8))
        if tag == "BlockRemoved":
            if len(raw) < 2:
                raise KVEventError("bad_event", "BlockRemoved without hashes")
            return _removed(worker, rank, seq, ts, raw[1], _at(raw, 2))
        return AllBlocksCleared(worker, rank, seq, ts)
    raise KVEventError("bad_event", f"event is a {type(raw).__name__}")


def _stored(worker: str, rank: int, seq: int, ts: float, hashes: Any, parent: Any,
            tokens: Any, block_size: Any, medium: Any, lora_name: Any, extra_keys: Any,
            ) -> BlockStored:
    if type(block_size) is not int or block_size <= 0 or block_size > MAX_BLOCK_SIZE:
        raise KVEventError("bad_number", f"block_size {block_size!r}")
    return BlockStored(
        worker, rank, seq, ts, normalize_hashes(hashes),
        None if parent is None else normalize_hash(parent),
        _check_tokens(tokens), block_size,
        medium if isinstance(medium, str) else None,
        lora_name if isinstance(lora_name, str) else None,
        _images_of(extra_keys) if extra_keys else None,
    )


def _removed(worker: str, rank: int, seq: int, ts: float, hashes: Any, medium: Any,
             ) -> BlockRemoved:
    return BlockRemoved(worker, rank, seq, ts, normalize_hashes(hashes),
                        medium if isinstance(medium, str) else None)


def keyed_events(items: Iterable[Any], convert: Callable[[Any], KVEvent],
                 errors: dict[str, int] | None, where: str = "") -> list[KVEvent]:
    """``convert`` each raw event, keyed by its position in the batch (the store's key with
    worker, rank, seq and ts); bad ones are counted in ``errors`` by kind and skipped (raised
    when ``errors`` is None), named by ``where`` (the batch) and their position."""
    out: list[KVEvent] = []
    for i, raw in enumerate(items):
        try:
            rec = convert(raw)
        except KVEventError as exc:
            if errors is None:
                raise
            count_error(errors, exc.kind, str(exc), f"{where} event {i}".strip())
            continue
        rec.idx = i
        out.append(rec)
    return out


def normalize_batch(
    obj: Any, worker: str, seq: int, default_rank: int = 0,
    errors: dict[str, int] | None = None,
) -> tuple[float, int, list[KVEvent]]:
    """Normalize a decoded batch; bad events are counted in ``errors`` by kind and skipped."""
    ts, raw_events, rank = split_batch(obj)
    rank = default_rank if rank is None else rank
    # Keyed by the raw position: every collector skips the same bad events.
    out = keyed_events(raw_events, lambda raw: normalize_event(raw, worker, rank, seq, ts),
                       errors, f"{worker}#{rank} seq {seq}")
    return ts, rank, out


_MOVED = ("ResidentIndex", "KVIngest", "WorkerResidency")


def __getattr__(name: str) -> Any:
    """The index moved to ``kv_index``; imports written against this module still work."""
    if name in _MOVED:
        from mmlens.ingest import kv_index

        return getattr(kv_index, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
