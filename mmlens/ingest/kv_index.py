"""The resident-block index built from normalized KV events, and the one-process ingest
(decode → normalize → index) the collector drives."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from mmlens.ingest.block_table import new_blocks
from mmlens.ingest.kv_events import KVEventError, decode_payload, normalize_batch
from mmlens.ingest.kv_fast import fast_batch
from mmlens.ingest.prompt_end import opening, prompt_end
from mmlens.layout.content_keys import event_chain, native, pad_images, state_key
from mmlens.records import BlockHash, BlockRemoved, BlockStored, KVEvent, count_error

_MISSING: Any = object()
_MASK64 = (1 << 64) - 1
# Removed at seq; content state, and since/until seq, of its last known time resident.
Removal = tuple[int, int | None, int, int]
MAX_ORPHANS = 10_000  # stores with an unknown parent kept per stream while batches are owed
OPENED_KEPT = 100_000  # blocks that end with a generation prompt begun, remembered

# --- resident index ---------------------------------------------------------------------------


@dataclass(slots=True)
class WorkerResidency:
    """Blocks a worker (one DP rank) currently holds, from its stored/removed events.

    ``blocks`` maps each resident block hash to its content state: shape | identity << 64
    (``mmlens.layout.content_keys``), or None when its chain reaches a block never seen
    (``mmlens.ingest.block_table``: compiled where it can be).
    """

    blocks: MutableMapping[BlockHash, int | None] = field(
        default_factory=lambda: new_blocks(native is not None))
    block_images: dict[BlockHash, tuple[str, ...]] = field(default_factory=dict)
    image_blocks: dict[str, int] = field(default_factory=dict)
    stored: int = 0
    removed: int = 0
    removed_unknown: int = 0
    clears: int = 0
    restarts: int = 0
    # While the stream owes batches (``kv_late_index``): which seq last touched each block.
    marks: Watermarks | None = None

    def reset(self) -> None:
        self.blocks.clear()
        self.block_images.clear()
        self.image_blocks.clear()
        if self.marks is not None:
            self.marks = Watermarks()


@dataclass(slots=True)
class Watermarks:
    """Kept only while a stream owes batches, so a late batch cannot undo a later one:
    the seq that last stored each resident block and the one it became resident at (no
    entry: before the watermarks were switched on), the seq, content state and residency
    start of each block removed since, the last clear."""

    stored_at: dict[BlockHash, int] = field(default_factory=dict)
    since: dict[BlockHash, int] = field(default_factory=dict)
    removed_at: dict[BlockHash, Removal] = field(default_factory=dict)
    cleared_at: int = -1
    # Stores whose parent was unknown, by parent: a late parent gives them their content.
    orphans: dict[BlockHash, list[BlockStored]] = field(default_factory=dict)
    orphan_count: int = 0

    def stored(self, blocks: MutableMapping[BlockHash, int | None], hashes: list[BlockHash],
               seq: int) -> None:
        for h in hashes:
            if h not in blocks:
                self.since[h] = seq
        self.stored_at.update(dict.fromkeys(hashes, seq))

    def removed(self, h: BlockHash, seq: int, resident: bool, state: int | None) -> None:
        self.stored_at.pop(h, None)
        if resident:
            self.removed_at[h] = (seq, state, self.since.pop(h, -1), seq)
        else:  # removed again: the last time it was resident stays what it was
            _, state, since, until = self.removed_at.get(h, (seq, None, seq, seq))
            self.removed_at[h] = (seq, state, since, until)

    def orphan(self, ev: BlockStored) -> None:
        if self.orphan_count < MAX_ORPHANS:
            self.orphans.setdefault(ev.parent, []).append(ev)  # type: ignore[arg-type]
            self.orphan_count += 1


class ResidentIndex:
    """Per-worker resident blocks (hash → parent) and per-image resident block counts."""

    def __init__(self) -> None:
        self.workers: dict[tuple[str, int], WorkerResidency] = {}
        # Worker → its model's generation prompt (``prompt_end.suffix_bytes``): its one-block
        # stores get the prompt's end in them (``BlockStored.prompt_end``).
        self.prompt_suffixes: dict[str, bytes] = {}
        # (worker, block) → how many of the generation prompt's first tokens end that block
        # (``prompt_end.opening``), the newest OPENED_KEPT: a block hung off one may end a
        # prompt in its first tokens.
        self._opened: dict[tuple[str, BlockHash], int] = {}

    def residency(self, worker: str, rank: int) -> WorkerResidency:
        key = (worker, rank)
        res = self.workers.get(key)
        if res is None:
            res = self.workers[key] = WorkerResidency()
        return res

    def apply(self, events: Iterable[KVEvent]) -> None:
        evs = events if type(events) is list else list(events)
        if self.prompt_suffixes:
            self._prompt_ends(evs)
        i, n = 0, len(evs)
        while i < n:
            ev = evs[i]
            res = self.residency(ev.worker, ev.rank)
            if res.marks is None and type(res.blocks) is not dict:
                # a run of one stream's stores and removals, in one compiled call
                j = native.apply_events(res, evs, i, pad_images, _u32_array)
                if j > i:
                    i = j
                    continue
            i += 1
            if ev.kind == "stored":
                self._store(res, ev)
            elif ev.kind == "removed":
                self._remove(res, ev)
            else:
                res.clears += 1
                res.reset()
                if res.marks is not None:
                    res.marks.cleared_at = ev.seq

    def _prompt_ends(self, evs: list[KVEvent]) -> None:
        suffixes, opened = self.prompt_suffixes, self._opened
        for ev in evs:
            if type(ev) is not BlockStored or not ev.block_hashes or (
                    suffix := suffixes.get(ev.worker)) is None:
                continue
            bs = ev.block_size
            if len(ev.block_hashes) == 1:
                ev.prompt_end = prompt_end(ev.token_ids, suffix, bs, opened.get(
                    (ev.worker, ev.parent), 0) if ev.parent is not None else 0)
            if bs > 0 and len(ev.token_ids) >= bs and (
                    j := opening(ev.token_ids[-bs:], suffix)):
                opened[ev.worker, ev.block_hashes[-1]] = j
                if len(opened) > OPENED_KEPT:
                    del opened[next(iter(opened))]

    def watch(self, worker: str, rank: int, on: bool) -> None:
        """Switch the watermarks of a stream on (it may owe batches) or off (it owes none)."""
        if not on:
            if (worker, rank) in self.workers:
                self.workers[worker, rank].marks = None
            return
        res = self.residency(worker, rank)
        if res.marks is None:
            res.marks = Watermarks()

    def restart(self, worker: str, rank: int) -> None:
        res = self.residency(worker, rank)
        res.restarts += 1
        res.reset()

    @staticmethod
    def _store(res: WorkerResidency, ev: BlockStored, keep: set[BlockHash] | None = None,
               state: int | None = _MISSING) -> list[int] | None:
        """``keep``: the blocks to write (a late batch's, see ``kv_late_index``); ``state``:
        the parent's content state when the caller knows it better than the index. Returns
        the blocks' content states (None: unknown)."""
        hashes = ev.block_hashes
        if not hashes:
            return None
        blocks = res.blocks
        bs = ev.block_size
        if ev.images is None and bs > 0:  # images named by the pad values of their runs
            ev.images = pad_images(ev.token_ids, bs)  # type: ignore[assignment]
        if state is _MISSING:
            state = 0 if ev.parent is None else blocks.get(ev.parent)
        if state is None and res.marks is not None and ev.parent is not None:
            res.marks.orphan(ev)  # its parent may still come late
        states: list[int] | None = None
        if state is not None and bs > 0 and len(ev.token_ids) >= len(hashes) * bs:
            states, shapes, keys = event_chain(state, ev.token_ids, ev.block_size, ev.images)
            ev.keys, ev.shapes = keys[:len(hashes)], shapes[:len(hashes)]
        written = hashes if keep is None else [h for h in hashes if h in keep]
        if res.marks is not None:
            res.marks.stored(blocks, written, ev.seq)
        if keep is not None:
            unknown: list[int | None] = [None] * len(hashes)
            pairs = zip(hashes, states or unknown, strict=False)
            blocks.update((h, st) for h, st in pairs if h in keep)
        elif states is None:
            blocks.update(dict.fromkeys(hashes))  # content unknown: not matchable
        else:
            blocks.update(zip(hashes, states, strict=False))
        res.stored += len(hashes)
        if ev.images and keep is None and native is not None:
            native.add_images(res.block_images, res.image_blocks, hashes, ev.images)
        elif ev.images:
            block_images, image_blocks = res.block_images, res.image_blocks
            ids: tuple[str, ...] = ()
            for h, refs in zip(hashes, ev.images, strict=False):
                if not refs or h in block_images or (keep is not None and h not in keep):
                    continue
                if len(refs) != 1:
                    ids = tuple(dict.fromkeys(r[0] for r in refs))
                elif ids != (refs[0][0],):  # an image's blocks share one tuple
                    ids = (refs[0][0],)
                block_images[h] = ids
                for ident in ids:
                    image_blocks[ident] = image_blocks.get(ident, 0) + 1
        if ev.images and type(blocks) is not dict:  # the table looks up only marked blocks
            blocks.mark_images([h for h in hashes if h in res.block_images])  # type: ignore
        return states

    @staticmethod
    def _remove(res: WorkerResidency, ev: BlockRemoved) -> None:
        blocks, marks = res.blocks, res.marks
        hashes = ev.block_hashes
        if marks is None and type(blocks) is not dict:  # the common case, in one compiled call
            ev.keys, removed, unknown = blocks.remove(  # type: ignore[attr-defined]
                hashes, res.block_images, res.image_blocks)
            res.removed += removed
            res.removed_unknown += unknown
            return
        if marks is None:  # the same in Python
            states = list(map(blocks.pop, hashes, repeat(_MISSING, len(hashes))))
            missing = states.count(_MISSING)
            res.removed_unknown += missing
            res.removed += len(states) - missing
            # A state within 64 bits is a text-only chain: its content key is its shape.
            ev.keys = [st if st <= _MASK64 else state_key(st) for st in states
                       if st is not _MISSING and st is not None]
            if res.block_images:
                gone = hashes if not missing else [
                    h for h, st in zip(hashes, states, strict=True) if st is not _MISSING]
                forget_all_images(res, gone)
            return
        keys: list[int] = []
        for h in hashes:
            state = blocks.pop(h, _MISSING)
            marks.removed(h, ev.seq, state is not _MISSING, None if state is _MISSING
                          else state)
            if state is _MISSING:
                res.removed_unknown += 1
                continue
            res.removed += 1
            if state is not None:
                keys.append(state_key(state))
            forget_images(res, h)
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


def _u32_array(tokens: Iterable[int]) -> array:
    return array("I", tokens)


def forget_images(res: WorkerResidency, h: BlockHash) -> None:
    """A block left: its images lose one resident block each."""
    if res.block_images:
        forget_all_images(res, (h,))


def forget_all_images(res: WorkerResidency, hashes: Iterable[BlockHash]) -> None:
    """Blocks left: their images lose one resident block each."""
    image_blocks = res.image_blocks
    for ids in map(res.block_images.pop, hashes, repeat(None)):
        if ids:
            for ident in ids:
                left = image_blocks.get(ident, 0) - 1
                if left > 0:
                    image_blocks[ident] = left
                else:
                    image_blocks.pop(ident, None)


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
                     apply: Callable[[list[KVEvent]], object] | None = None,
                     ) -> tuple[float | None, list[KVEvent]]:
        """``ingest`` plus the batch time (None for a batch that could not be read);
        ``apply`` puts the events on the index (default: in stream order)."""
        errors = self.errors if errors is None else errors
        fast = fast_batch(payload, worker, seq, default_rank)
        if fast is not None:
            ts, _, events = fast
        else:
            try:
                ts, _, events = normalize_batch(
                    decode_payload(payload), worker, seq, default_rank, errors)
            except KVEventError as exc:
                count_error(errors, exc.kind, str(exc), f"{worker}#{default_rank} seq {seq}")
                return None, []
        events = apply_each(self.index.apply if apply is None else apply, events, errors)
        self.batches += 1
        self.events += len(events)
        return ts, events


def apply_each(apply: Callable[[list[KVEvent]], object], events: list[KVEvent],
               errors: dict[str, int]) -> list[KVEvent]:
    """``apply`` the batch; should it fail (bad input of a kind the parser did not foresee),
    event by event, so one event the index cannot take (counted ``unindexable_event``, left
    out) does not take its batch with it. The events before the bad one are applied twice
    then: a store or removal seen again changes no block, only the index's event counters."""
    try:
        apply(events)
        return events
    except Exception:
        pass
    kept = []
    for ev in events:
        try:
            apply([ev])
        except Exception as exc:
            count_error(errors, "unindexable_event", f"{type(exc).__name__}: {exc}",
                        f"{ev.worker}#{ev.rank} seq {ev.seq} event {ev.idx}")
            continue
        kept.append(ev)
    return kept
