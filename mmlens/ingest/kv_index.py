"""The resident-block index built from normalized KV events, and the one-process ingest
(decode → normalize → index) the collector drives."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mmlens.ingest.kv_events import KVEventError, decode_payload, normalize_batch
from mmlens.layout.content_keys import event_chain, pad_images, state_key
from mmlens.records import BlockHash, BlockRemoved, BlockStored, KVEvent

# --- resident index ---------------------------------------------------------------------------


@dataclass(slots=True)
class WorkerResidency:
    """Blocks a worker (one DP rank) currently holds, from its stored/removed events.

    ``blocks`` maps each resident block hash to its content state: shape | identity << 64
    (``mmlens.layout.content_keys``), or None when its chain reaches a block never seen.
    """

    blocks: dict[BlockHash, int | None] = field(default_factory=dict)
    block_images: dict[BlockHash, tuple[str, ...]] = field(default_factory=dict)
    image_blocks: dict[str, int] = field(default_factory=dict)
    stored: int = 0
    removed: int = 0
    removed_unknown: int = 0
    clears: int = 0
    restarts: int = 0

    def reset(self) -> None:
        self.blocks.clear()
        self.block_images.clear()
        self.image_blocks.clear()


class ResidentIndex:
    """Per-worker resident blocks (hash → parent) and per-image resident block counts."""

    def __init__(self) -> None:
        self.workers: dict[tuple[str, int], WorkerResidency] = {}

    def residency(self, worker: str, rank: int) -> WorkerResidency:
        key = (worker, rank)
        res = self.workers.get(key)
        if res is None:
            res = self.workers[key] = WorkerResidency()
        return res

    def apply(self, events: Iterable[KVEvent]) -> None:
        for ev in events:
            res = self.residency(ev.worker, ev.rank)
            if ev.kind == "stored":
                self._store(res, ev)  # type: ignore[arg-type]
            elif ev.kind == "removed":
                self._remove(res, ev)  # type: ignore[arg-type]
            else:
                res.clears += 1
                res.reset()

    def restart(self, worker: str, rank: int) -> None:
        res = self.residency(worker, rank)
        res.restarts += 1
        res.reset()

    @staticmethod
    def _store(res: WorkerResidency, ev: BlockStored) -> None:
        hashes = ev.block_hashes
        if not hashes:
            return
        blocks = res.blocks
        state = 0 if ev.parent is None else blocks.get(ev.parent)
        bs = ev.block_size
        if ev.images is None and bs > 0:  # images named by the pad values of their runs
            ev.images = pad_images(ev.token_ids, bs)  # type: ignore[assignment]
        if state is None or bs <= 0 or len(ev.token_ids) < len(hashes) * bs:
            blocks.update(dict.fromkeys(hashes))  # content unknown: not matchable
        else:
            states, shapes, keys = event_chain(state, ev.token_ids, ev.block_size, ev.images)
            blocks.update(zip(hashes, states, strict=False))
            ev.keys, ev.shapes = keys[:len(hashes)], shapes[:len(hashes)]
        res.stored += len(hashes)
        if ev.images:
            block_images, image_blocks = res.block_images, res.image_blocks
            for h, refs in zip(hashes, ev.images, strict=False):
                if not refs or h in block_images:
                    continue
                ids = (refs[0][0],) if len(refs) == 1 else tuple(dict.fromkeys(
                    r[0] for r in refs))
                block_images[h] = ids
                for ident in ids:
                    image_blocks[ident] = image_blocks.get(ident, 0) + 1

    @staticmethod
    def _remove(res: WorkerResidency, ev: BlockRemoved) -> None:
        blocks, block_images = res.blocks, res.block_images
        keys: list[int] = []
        for h in ev.block_hashes:
            state = blocks.pop(h, _MISSING)
            if state is _MISSING:
                res.removed_unknown += 1
                continue
            res.removed += 1
            if state is not None:
                keys.append(state_key(state))
            if block_images:
                ids = block_images.pop(h, None)
                if ids:
                    for ident in ids:
                        left = res.image_blocks.get(ident, 0) - 1
                        if left > 0:
                            res.image_blocks[ident] = left
                        else:
                            res.image_blocks.pop(ident, None)
        ev.keys = keys

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per ``worker#rank``: resident blocks, blocks per image and event counters."""
        out: dict[str, dict[str, Any]] = {}
        for (worker, rank), res in self.workers.items():
            out[f"{worker}#{rank}"] = {
                "worker": worker,
                "rank": rank,
                "resident_blocks": len(res.blocks),
                "images": dict(res.image_blocks),
                "stored": res.stored,
                "removed": res.removed,
                "removed_unknown": res.removed_unknown,
                "clears": res.clears,
                "restarts": res.restarts,
            }
        return out


_MISSING: Any = object()


class KVIngest:
    """decode → normalize → index for one process; the collector adds sockets and replay."""

    def __init__(self) -> None:
        self.index = ResidentIndex()
        self.errors: dict[str, int] = {}
        self.batches = 0
        self.events = 0

    def ingest(self, worker: str, seq: int, payload: bytes, default_rank: int = 0,
               errors: dict[str, int] | None = None) -> list[KVEvent]:
        """Decode, normalize and index one batch; bad input is counted in ``errors`` (default
        ``self.errors``) by kind and skipped."""
        return self.ingest_batch(worker, seq, payload, default_rank, errors)[1]

    def ingest_batch(self, worker: str, seq: int, payload: bytes, default_rank: int = 0,
                     errors: dict[str, int] | None = None,
                     ) -> tuple[float | None, list[KVEvent]]:
        """``ingest`` plus the batch time (None for a batch that could not be read)."""
        errors = self.errors if errors is None else errors
        try:
            ts, _, events = normalize_batch(
                decode_payload(payload), worker, seq, default_rank, errors)
        except KVEventError as exc:
            errors[exc.kind] = errors.get(exc.kind, 0) + 1
            return None, []
        self.index.apply(events)
        self.batches += 1
        self.events += len(events)
        return ts, events
