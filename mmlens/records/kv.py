"""KV-event records: what engines publish about their prefix caches (stored, removed,
cleared blocks), a stored event as the store returns it, and the resident summary per rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

BlockHash = int | str
"""An engine block hash: unsigned 64-bit int, or lowercase hex when the engine sent bytes."""


class ImageRef(NamedTuple):
    """An image identifier found in a block's ``extra_keys`` and its offset in that block.

    A NamedTuple: the hot decode path builds plain ``(identifier, offset)`` tuples, which
    compare equal to ImageRef values.
    """

    identifier: str
    offset: int | None


@dataclass(slots=True)
class BlockStored:
    worker: str
    rank: int
    seq: int
    ts: float
    block_hashes: list[BlockHash]
    parent: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    # Per block: image refs found in that block's extra_keys (None = no image in the block).
    images: list[tuple[ImageRef, ...] | None] | None = None
    idx: int = 0  # position in its batch: with (worker, rank, seq, ts) the event's store key
    kind: Literal["stored"] = "stored"
    # Set by the resident index: per block, the content key (``mmlens.layout.content_keys``)
    # and the shape key; None when the parent block's content is unknown.
    keys: list[int] | None = None
    shapes: list[int] | None = None
    # Set by the resident index for a one-block store of a worker whose model it knows: the
    # block's tokens that end a prompt (``mmlens.ingest.prompt_end``), None elsewhere.
    prompt_end: int | None = None


@dataclass(slots=True)
class BlockRemoved:
    worker: str
    rank: int
    seq: int
    ts: float
    block_hashes: list[BlockHash]
    medium: str | None = None
    idx: int = 0
    kind: Literal["removed"] = "removed"
    keys: list[int] | None = None  # content keys of the removed blocks known to the index


@dataclass(slots=True)
class AllBlocksCleared:
    worker: str
    rank: int
    seq: int
    ts: float
    idx: int = 0
    kind: Literal["cleared"] = "cleared"


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""Not frozen (a frozen dataclass sets each field through object.__setattr__, the largest
per-event cost after decoding); treat them as immutable."""


@dataclass(slots=True)
class KVEventRow:
    """A stored KV event as the store returns it: one row per event, block hashes decoded
    (empty where the query did not ask for them), image identifiers of stored blocks."""

    ts: float
    worker: str
    rank: int
    seq: int
    kind: Literal["stored", "removed", "cleared"]
    n_blocks: int
    parent: BlockHash | None = None
    block_hashes: list[BlockHash] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ResidentSummary:
    """Blocks resident on one worker rank, as the KV-event index last summarized them."""

    worker: str
    rank: int
    resident_blocks: int = 0
    images: dict[str, int] = field(default_factory=dict)  # identifier → resident blocks
    stored: int = 0
    removed: int = 0
    removed_unknown: int = 0
    clears: int = 0
    restarts: int = 0
    transport: str | None = None  # how its KV events arrive: zmq, grpc, nats, zmq-broker
    updated: float | None = None

    @property
    def label(self) -> str:
        """``worker``, or ``worker#rank`` beyond rank 0."""
        return self.worker if not self.rank else f"{self.worker}#{self.rank}"
