"""A late batch (returned by a replay after later batches were applied) on the resident index.

It must not undo what came after it: a block a later event removed or cleared is not
resurrected by a late store, a block a later event stored again is not removed by a late
removal, and a late clear leaves the blocks stored after it. The index's watermarks
(``WorkerResidency.marks``, switched on while the stream owes batches) say which seq last
touched each block; a block with no watermark was last touched before they were switched
on, so before any owed batch.

A store whose parent was unknown gets its content once the parent comes late, when the
parent was resident at the store's seq (``_rechain``): the index then is the one a loss-free
run builds. The event was handed to the store before, without content keys: a copy with the
keys a loss-free run computes goes into ``resolved`` for the store's content path (not when
one of its blocks was removed in between, see ``_resolve``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mmlens.ingest.kv_index import ResidentIndex, Watermarks, WorkerResidency, forget_images
from mmlens.layout.content_keys import event_chain, state_key
from mmlens.records import BlockHash, BlockRemoved, BlockStored, KVEvent


def apply_late(index: ResidentIndex, events: Iterable[KVEvent],
               resolved: list[BlockStored] | None = None) -> int:
    """Apply a late batch's events; returns the block changes left out as superseded.

    ``resolved`` collects stores applied before whose content the batch made known: copies
    with the content keys and shapes they get in a loss-free run (the originals were handed
    on already, maybe to another thread, and stay as they are).
    Without watermarks (nothing applied since they were switched off) the batch is in order.
    """
    resolved = [] if resolved is None else resolved
    superseded = 0
    for ev in events:
        res = index.residency(ev.worker, ev.rank)
        marks = res.marks
        if marks is None:
            index.apply([ev])
        elif ev.kind == "stored":
            superseded += _store(res, marks, ev, resolved)
        elif ev.kind == "removed":
            superseded += _remove(res, marks, ev)
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


_ABSENT: Any = object()


def _held_at(res: WorkerResidency, marks: Watermarks, h: BlockHash, seq: int) -> Any:
    """The content state ``h`` had at ``seq`` if it was resident then, else ``_ABSENT``."""
    if h in res.blocks and marks.since.get(h, -1) <= seq:  # earlier in its batch, too
        return res.blocks[h]
    gone = marks.removed_at.get(h)
    if gone is not None and gone[2] <= seq <= gone[3]:  # its removal may come after, too
        return gone[1]
    return _ABSENT


def _store(res: WorkerResidency, marks: Watermarks, ev: BlockStored,
           resolved: list[BlockStored]) -> int:
    hashes = ev.block_hashes
    if ev.seq < marks.cleared_at:
        keep: set[BlockHash] = set()
    else:
        keep = {h for h in hashes if not _later(marks, h, ev.seq)}
    state: int | None = 0
    if ev.parent is not None:
        state = _held_at(res, marks, ev.parent, ev.seq)
        state = None if state is _ABSENT else state
    states = ResidentIndex._store(res, ev, keep, state) or []
    for h in keep:
        marks.removed_at.pop(h, None)
    for h, st in zip(hashes, states, strict=False):
        if h not in keep:
            _resident_earlier(res, marks, h, st, ev.seq)
    if marks.orphans:
        _rechain(res, marks, [h for h, st in zip(hashes, states, strict=False)
                              if st is not None], resolved)
    return len(hashes) - len(keep)


def _resident_earlier(res: WorkerResidency, marks: Watermarks, h: BlockHash,
                      state: int | None, seq: int) -> None:
    """A store a later event superseded still made ``h`` resident from ``seq`` on (up to
    the next known removal): parents looked up at seqs in between find it."""
    gone = marks.removed_at.get(h)
    if h in res.blocks:
        since = marks.since.get(h, -1)
        if since > seq and (gone is None or not seq < gone[0] < since):
            marks.since[h] = seq
    elif gone is not None and gone[0] > seq:
        removed, known, since, until = gone
        marks.removed_at[h] = (removed, known if state is None else state, min(since, seq),
                               until)


def _rechain(res: WorkerResidency, marks: Watermarks, roots: list[BlockHash],
             resolved: list[BlockStored]) -> None:
    """Give orphaned stores their content: a store at seq c whose parent (a block whose
    content just became known) was resident at c; each goes into ``resolved`` with keys."""
    stack = list(roots)
    while stack:
        parent = stack.pop()
        children = marks.orphans.pop(parent, None)
        if not children:
            continue
        waiting = []
        for child in children:
            state = _held_at(res, marks, parent, child.seq)
            if state is _ABSENT or state is None:
                waiting.append(child)  # not resident then: another store may still be
                continue
            marks.orphan_count -= 1
            chain = _chain(child, state)
            if chain is not None:
                _resolve(res, marks, child, chain, stack, resolved)
        if waiting:
            marks.orphans[parent] = waiting


def _resolve(res: WorkerResidency, marks: Watermarks, child: BlockStored,
             chain: tuple[list[int], list[int], list[int]], stack: list[BlockHash],
             resolved: list[BlockStored]) -> None:
    """The orphan's blocks get their states. Its keys are handed on unless one of its blocks
    was removed since while its content was unknown: that removal went on without the key,
    and the store's key alone would leave the block resident for the availability replay."""
    c = child.seq
    states, shapes, keys = chain
    unkeyed_removal = False
    for h, st in zip(child.block_hashes, states, strict=False):
        if marks.stored_at.get(h) == c and res.blocks.get(h, 0) is None:
            res.blocks[h] = st
            stack.append(h)
        elif (g := marks.removed_at.get(h)) is not None and g[1] is None and g[0] > c:
            marks.removed_at[h] = (g[0], st, g[2], g[3])
            stack.append(h)
            unkeyed_removal = True
    if not unkeyed_removal:
        n = len(child.block_hashes)
        resolved.append(replace(child, keys=keys[:n], shapes=shapes[:n]))


def _chain(ev: BlockStored, state: int) -> tuple[list[int], list[int], list[int]] | None:
    """States, shapes and content keys of the store's blocks, as ``ResidentIndex._store``
    computes them when the parent's content is known."""
    bs = ev.block_size
    if bs <= 0 or len(ev.token_ids) < len(ev.block_hashes) * bs:
        return None
    return event_chain(state, ev.token_ids, bs, ev.images)


def _remove(res: WorkerResidency, marks: Watermarks, ev: BlockRemoved) -> int:
    keys: list[int] = []
    superseded = 0
    for h in ev.block_hashes:
        state = _held_at(res, marks, h, ev.seq)
        if state is not _ABSENT and state is not None:
            keys.append(state_key(state))  # what the block held when it was removed
        if ev.seq < marks.cleared_at or _later(marks, h, ev.seq):
            superseded += 1
            continue
        if h in res.blocks:
            del res.blocks[h]
            forget_images(res, h)
            res.removed += 1
            marks.removed(h, ev.seq, True, state)
        else:
            res.removed_unknown += 1
            marks.removed(h, ev.seq, False, None)  # an older late store must not revive it
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
    # What stays was stored again after the clear: resident from that store on.
    marks.since = {h: max(marks.since.get(h, -1), marks.stored_at[h]) for h in stays}
    marks.removed_at = {h: v for h, v in marks.removed_at.items() if v[0] > seq}
    marks.cleared_at = seq
    return len(stays)
