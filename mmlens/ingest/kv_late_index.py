"""A late batch (returned by a replay after later batches were applied) on the resident index.

It must not undo what came after it: a block a later event removed or cleared is not
resurrected by a late store, a block a later event stored again is not removed by a late
removal, and a late clear leaves the blocks stored after it. The index's watermarks
(``WorkerResidency.marks``, switched on while the stream owes batches) say which seq last
touched each block; a block with no watermark was last touched before they were switched
on, so before any owed batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from mmlens.ingest.kv_index import ResidentIndex, Watermarks, WorkerResidency, forget_images
from mmlens.layout.content_keys import state_key
from mmlens.records import BlockHash, BlockRemoved, BlockStored, KVEvent


def apply_late(index: ResidentIndex, events: Iterable[KVEvent]) -> int:
    """Apply a late batch's events; returns the block changes left out as superseded.

    Without watermarks (nothing applied since they were switched off) the batch is in order.
    """
    superseded = 0
    for ev in events:
        res = index.residency(ev.worker, ev.rank)
        marks = res.marks
        if marks is None:
            index.apply([ev])
        elif ev.kind == "stored":
            superseded += _store(res, marks, ev)  # type: ignore[arg-type]
        elif ev.kind == "removed":
            superseded += _remove(res, marks, ev)  # type: ignore[arg-type]
        elif ev.seq > marks.cleared_at:
            superseded += _clear(res, marks, ev.seq)
        else:
            superseded += 1
    return superseded


def _later(marks: Watermarks, h: BlockHash, seq: int) -> bool:
    """Did an event after ``seq`` store or remove ``h``?"""
    at = marks.stored_at.get(h)
    if at is not None:
        return at > seq
    gone = marks.removed_at.get(h)
    return gone is not None and gone[0] > seq


def _store(res: WorkerResidency, marks: Watermarks, ev: BlockStored) -> int:
    hashes = ev.block_hashes
    if ev.seq < marks.cleared_at:
        keep: set[BlockHash] = set()
    else:
        keep = {h for h in hashes if not _later(marks, h, ev.seq)}
    state: int | None = 0
    if ev.parent is not None:
        state = res.blocks.get(ev.parent)
        if state is None and ev.parent not in res.blocks:
            # the parent was resident then and removed since: its content is still known
            state = marks.removed_at.get(ev.parent, (0, None))[1]
    ResidentIndex._store(res, ev, keep, state)
    for h in keep:
        marks.removed_at.pop(h, None)
    return len(hashes) - len(keep)


def _remove(res: WorkerResidency, marks: Watermarks, ev: BlockRemoved) -> int:
    keys: list[int] = []
    superseded = 0
    for h in ev.block_hashes:
        state = res.blocks.get(h)
        if state is None:
            state = marks.removed_at.get(h, (0, None))[1]
        if state is not None:
            keys.append(state_key(state))  # what the block held when it was removed
        if ev.seq < marks.cleared_at or _later(marks, h, ev.seq):
            superseded += 1
            continue
        if h in res.blocks:
            del res.blocks[h]
            marks.stored_at.pop(h, None)
            forget_images(res, h)
            res.removed += 1
        else:
            res.removed_unknown += 1
        marks.removed_at[h] = (ev.seq, state)  # an older late store must not bring it back
    ev.keys = keys
    return superseded


def _clear(res: WorkerResidency, marks: Watermarks, seq: int) -> int:
    """Everything not stored after ``seq`` goes; older watermarks are covered by the clear."""
    res.clears += 1
    stays = {h for h, at in marks.stored_at.items() if at > seq}
    for h in [h for h in res.blocks if h not in stays]:
        del res.blocks[h]
        forget_images(res, h)
    marks.stored_at = {h: marks.stored_at[h] for h in stays}
    marks.removed_at = {h: v for h, v in marks.removed_at.items() if v[0] > seq}
    marks.cleared_at = seq
    return len(stays)
