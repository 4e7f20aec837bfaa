"""What every policy model shares: the fleet's loads as the router sees them, the choice a
policy makes, and the interface the replay drives."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mmlens.whatif.blocks import Prompt


@dataclass(slots=True)
class Loads:
    """Per worker (index 0..n-1): requests in flight as the router counts them (routed, not
    finished), prompt tokens still in prefill, and requests routed so far. ``order`` packs
    (in flight, reversed index) into one int per worker so the least-loaded worker is
    ``min`` over a list: on a tie the last worker registered, as SMG 1.13 chose on every
    all-idle fallback in the recorded logs (tests/fixtures/captures: 24420 of 24410/24420,
    24820 of 24810/24820)."""

    n: int
    inflight: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    processed: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    total_inflight: int = 0
    # Workers whose load changed since a policy last looked (None: no policy asked).
    touched: set[int] | None = None

    def __post_init__(self) -> None:
        for name in ("inflight", "prefill_tokens", "processed"):
            setattr(self, name, [0] * self.n)
        self.order = [self._order(w) for w in range(self.n)]

    def _order(self, w: int) -> int:
        return (self.inflight[w] << 16) | (0xFFFF - w)

    def start(self, w: int, tokens: int) -> None:
        self.inflight[w] += 1
        self.total_inflight += 1
        self.processed[w] += 1
        self.prefill_tokens[w] += tokens
        self.order[w] = self._order(w)
        if self.touched is not None:
            self.touched.add(w)

    def prefilled(self, w: int, tokens: int) -> None:
        self.prefill_tokens[w] -= tokens
        if self.touched is not None:
            self.touched.add(w)

    def finish(self, w: int) -> None:
        self.inflight[w] -= 1
        self.total_inflight -= 1
        self.order[w] = self._order(w)
        if self.touched is not None:
            self.touched.add(w)

    def least_loaded(self) -> int:
        return 0xFFFF - (min(self.order) & 0xFFFF)

    def least_loaded_of(self, workers: set[int], rng: random.Random) -> int:
        """The lowest in-flight count among ``workers``, ties at random."""
        if len(workers) == 1:
            return next(iter(workers))
        inflight = self.inflight
        best = min(map(inflight.__getitem__, workers))
        tied = sorted(w for w in workers if inflight[w] == best)
        return tied[0] if len(tied) == 1 else rng.choice(tied)


@dataclass(frozen=True, slots=True)
class Choice:
    worker: int
    branch: str  # the router's own branch word (SMG) or the model's (hit / miss)
    predicted_blocks: int  # blocks the router believed the chosen worker held


class Policy:
    """A routing policy model. ``view`` names the prompt view it routes on (``Prompt.view``);
    ``events`` says whether it learns the engines' holdings from KV events (``stored`` and
    ``removed`` are called) or only from its own decisions (``routed``)."""

    name = "policy"
    view = "content"
    events = False

    def __init__(self, n_workers: int, block_size: int, seed: int = 0) -> None:
        self.n = n_workers
        self.block_size = block_size
        self.rng = random.Random(seed)

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        raise NotImplementedError

    def stored(self, worker: int, content: list[int], blind: list[int], now: float) -> None:
        """Blocks a worker's engine cached (its KV event arrived)."""

    def removed(self, worker: int, content: int, blind: int) -> None:
        """A block a worker's engine evicted."""

    def routed(self, worker: int, p: Prompt, keys: tuple[int, ...], now: float) -> None:
        """The policy's own record of a decision it made."""

    def finished(self, worker: int, p: Prompt, keys: tuple[int, ...]) -> None:
        """A request it routed (``keys`` as routed) ended."""
