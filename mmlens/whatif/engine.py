"""A model of an engine's paged prefix cache (vLLM's block pool, as the demo's engines run it:
``mmlens.demo.prefix_cache``): full blocks keyed by content keys, a capacity in blocks, LRU
eviction of free blocks.

- A request's hit is the longest run of its leading blocks cached when it is admitted, at
  most ``(prompt − 1) // block_size`` blocks (the last prompt token is always recomputed).
  Admission takes its prompt's blocks; its output's blocks are taken when decoding starts
  (at its prefill's end), as the engine takes them a block at a time while it decodes.
- A block a running request holds is pinned: only free blocks are evicted. A hit pins the
  cached blocks it reuses until the request ends.
- Its new prompt blocks become cached when its prefill ends (``commit``): a request admitted
  before then, even on the same worker, does not hit them. A block another request committed
  meanwhile stays the other's (this request's copy frees uncached).
- Every block its output fills is cached too (the engine hashes decoded blocks as it does
  prompt blocks): they take cache space in the LRU order until evicted. The engine is taken
  to be deterministic (greedy decoding; the demo's engines answer a prompt alike every
  time), so equal prompts' answers share their blocks: an answer's j-th block is keyed by
  the prompt's ``answer`` identity and j. An answer no other request can share (``answer``
  None) is kept as one entry that weighs its blocks. No prompt hits an answer's blocks (a
  prompt that carried an earlier answer would, which the stored layouts cannot tell); they
  are kept under negative keys and never reported to ``on_evict``.
- On release its blocks are freed tail first, so a shared prefix outlives the suffixes that
  follow it (the output's blocks go before its prompt's); a block still held by another
  running request stays pinned. Eviction takes the least recently freed block.

Not modelled: the engine's wait when every block is pinned (here the cache overfills
instead), preemption, CPU/disk offload tiers, and hash collisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Evicted = Callable[[int, int, int], None]
"""Told of each evicted block: worker, content key, blind key."""

_SPREAD = 0x9E3779B97F4A7C15  # odd: j ↦ j × _SPREAD is one-to-one on 64 bits
_MASK = (1 << 63) - 1


def output_key(answer: int, j: int) -> int:
    """The key of an answer's j-th block: negative, so never a prompt block's."""
    return -1 - ((answer ^ (j * _SPREAD)) & _MASK)


@dataclass(slots=True)
class Admission:
    worker: int
    hit_blocks: int
    hits: tuple[int, ...]  # content keys of the cached blocks it reuses (pinned)
    new: tuple[int, ...]  # content keys of the prompt blocks to commit
    new_blind: tuple[int, ...]
    held: int  # blocks it holds outside the cache (until commit, then the rest until release)
    output_blocks: int  # blocks its output takes beyond its prompt's
    output_full: int  # of the blocks past its prompt's full ones, those its output fills
    partial_prompt: bool  # the prompt ends mid-block (its output fills that block first)
    answer: int | None  # its prompt's answer identity (None: shared with no other request)
    stored: tuple[int, ...] = ()  # content keys it cached at commit (pinned)
    answered: tuple[int, ...] = ()  # keys of its output's blocks it cached (pinned)


class EngineCache:
    """One worker's cache. ``free`` maps each cached block no running request holds to its
    blind key, least recently freed first (the eviction order); ``used`` maps each cached
    block running requests hold to its blind key, and ``shared`` how many more than one
    hold it (absent: one). ``weight`` gives the blocks of an entry that stands for an
    unshared answer's blocks (absent: one); ``blocks`` counts them all."""

    __slots__ = ("blocks", "capacity", "evictions", "free", "held", "last_run", "on_evict",
                 "shared", "used", "weight", "worker")

    def __init__(self, worker: int, capacity_blocks: int, on_evict: Evicted | None = None,
                 ) -> None:
        self.worker = worker
        self.capacity = capacity_blocks
        self.free: OrderedDict[int, int] = OrderedDict()
        self.used: dict[int, int] = {}
        self.shared: dict[int, int] = {}
        self.weight: dict[int, int] = {}
        self.blocks = 0  # cached blocks, free or held
        self.held = 0  # uncached blocks running requests hold
        self.on_evict = on_evict
        self.evictions = 0
        self.last_run = -(1 << 64)  # unshared answers' entries count down from here

    def __contains__(self, key: int) -> bool:
        return key in self.free or key in self.used

    def __len__(self) -> int:
        return self.blocks

    def hit_blocks(self, content: tuple[int, ...], max_hit: int) -> int:
        free, used = self.free, self.used
        n = 0
        for key in content[:max_hit]:
            if key not in free and key not in used:
                break
            n += 1
        return n

    def admit(self, content: tuple[int, ...], blind: tuple[int, ...], tokens: int,
              output: int, block_size: int, answer: int | None = None) -> Admission:
        hits = self.hit_blocks(content, max(tokens - 1, 0) // block_size)
        free, used, shared = self.free, self.used, self.shared
        reused = content[:hits]
        for key in reused:
            b = free.pop(key, None)
            if b is None:
                shared[key] = shared.get(key, 0) + 1
            else:
                used[key] = b
        prompt_blocks = -(-tokens // block_size)
        needed = prompt_blocks - hits
        self._make_room(needed)
        self.held += needed
        return Admission(self.worker, hits, reused, content[hits:], blind[hits:], needed,
                         -(-(tokens + output) // block_size) - prompt_blocks,
                         (tokens + output) // block_size - tokens // block_size,
                         tokens % block_size != 0, answer)

    def commit(self, a: Admission) -> tuple[list[int], list[int]]:
        """The prompt's new blocks cached after prefill: the (content, blind) keys stored
        (a block another request committed first is not stored again: it stays held). Then
        the output's blocks are taken, and those it will fill cached (unless an equal
        answer's are)."""
        free, used = self.free, self.used
        stored, stored_blind = [], []
        for key, b in zip(a.new, a.new_blind, strict=True):
            if key in used or key in free:
                continue
            used[key] = b
            stored.append(key)
            stored_blind.append(b)
        a.stored = tuple(stored)
        n = len(stored)
        self.blocks += n
        self.held -= n
        a.held -= n
        if a.answer is None or self.blocks + self.held + a.output_blocks <= self.capacity:
            cached = self._answer_at_once(a)
        else:
            cached = self._answer_by_block(a)
        held = a.output_blocks - cached  # a partial prompt's last block leaves ``held`` too
        self.held += held
        a.held += held
        return stored, stored_blind

    def _answer_at_once(self, a: Admission) -> int:
        """The output's blocks when decoding them cannot evict a block an equal answer
        cached before this one filled its own (nothing can, for an unshared answer): taken
        at once, then cached. The blocks cached."""
        self._make_room(a.output_blocks)
        if not a.output_full:
            return 0
        used = self.used
        if a.answer is None:
            key = self.last_run = self.last_run - 1
            used[key] = 0
            self.weight[key] = a.output_full
            a.answered = (key,)
            self.blocks += a.output_full
            return a.output_full
        free, answer = self.free, a.answer
        answered = []
        for j in range(a.output_full):
            key = -1 - ((answer ^ (j * _SPREAD)) & _MASK)  # output_key, inlined
            if key not in used and key not in free:
                used[key] = 0
                answered.append(key)
        a.answered = tuple(answered)
        self.blocks += len(answered)
        return len(answered)

    def _answer_by_block(self, a: Admission) -> int:
        """Decoding a block at a time: a block is taken when a token starts it (the first,
        when the prompt ends mid-block, is the prompt's own last block, taken at admission)
        and cached when its last token is written, unless an equal answer's is cached."""
        assert a.answer is not None
        free, used = self.free, self.used
        answered = []
        taken = 0
        for j in range(a.output_full):
            if j or not a.partial_prompt:
                self._make_room(1)
                self.held += 1
                taken += 1
            key = output_key(a.answer, j)
            if key not in used and key not in free:
                used[key] = 0
                answered.append(key)
                self.blocks += 1
                self.held -= 1
        self._make_room(a.output_blocks - taken)  # a last block the output does not fill
        self.held -= taken - len(answered)  # ``commit`` counts them in
        a.answered = tuple(answered)
        return len(answered)

    def release(self, a: Admission) -> None:
        """Blocks freed tail first: the blocks its output filled, then the prompt's blocks it
        cached or reused, the shared prefix last of all; a partial last block and copies of
        blocks others cached free uncached."""
        self.held -= a.held
        a.held = 0
        free, used, shared = self.free, self.used, self.shared
        for key in reversed(a.answered):  # no other request holds an answer's blocks
            free[key] = used.pop(key)
        for keys in (a.stored, a.hits):
            if not shared:
                for key in reversed(keys):
                    free[key] = used.pop(key)
                continue
            for key in reversed(keys):
                if key in shared:
                    n = shared[key] - 1
                    if n:
                        shared[key] = n
                    else:
                        del shared[key]
                else:
                    free[key] = used.pop(key)

    def _make_room(self, needed: int) -> None:
        over = self.blocks + self.held + needed - self.capacity
        if over <= 0:
            return
        free, weight = self.free, self.weight
        while over > 0 and free:
            key, blind = free.popitem(last=False)
            self.evictions += 1
            self.blocks -= 1
            over -= 1
            if key >= 0:
                if self.on_evict is not None:
                    self.on_evict(self.worker, key, blind)
            elif key in weight:
                left = weight[key] - 1
                if left:  # the rest of an unshared answer's blocks stay first in line
                    weight[key] = left
                    free[key] = blind
                    free.move_to_end(key, last=False)
                else:
                    del weight[key]
