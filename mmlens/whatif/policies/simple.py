"""SMG's content-free policies: ``round_robin``, ``random`` (seeded) and
``consistent_hashing`` (a ring of the workers; the key is the request's
``x-smg-routing-key`` header, which recorded traffic does not carry: without it SMG picks a
random healthy worker, and so does this model unless ``routing_key`` names what a client
would have sent)."""

from __future__ import annotations

import bisect

import xxhash

from mmlens.whatif.blocks import Prompt
from mmlens.whatif.policies.base import Choice, Loads, Policy

PARAMS: dict[str, object] = {"routing_key": "none", "vnodes": 160}
"""``routing_key``: none (SMG's fallback: random) | prefix (the first block's key, as a client
keying on its system prompt would) | whole (the whole prompt's key); ``vnodes`` per worker on
the ring (a model choice: the ring's real layout is not documented)."""


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, n_workers: int, block_size: int, seed: int = 0) -> None:
        super().__init__(n_workers, block_size, seed)
        self.next = 0

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        w = self.next
        self.next = (w + 1) % self.n
        return Choice(w, "round_robin", 0)


class Random(Policy):
    name = "random"

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        return Choice(self.rng.randrange(self.n), "random", 0)


class ConsistentHashing(Policy):
    name = "consistent_hashing"

    def __init__(self, n_workers: int, block_size: int, seed: int = 0,
                 routing_key: str = "none", vnodes: int = 160) -> None:
        super().__init__(n_workers, block_size, seed)
        if routing_key not in ("none", "prefix", "whole"):
            raise ValueError(f"routing_key must be none, prefix or whole, not {routing_key!r}")
        self.routing_key = routing_key
        ring = sorted((xxhash.xxh3_64_intdigest(f"worker-{w}#{v}".encode()), w)
                      for w in range(n_workers) for v in range(int(vnodes)))
        self.points = [h for h, _ in ring]
        self.owners = [w for _, w in ring]

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        if self.routing_key == "none" or not keys:
            return Choice(self.rng.randrange(self.n), "random_fallback", 0)
        key = keys[0] if self.routing_key == "prefix" else keys[-1]
        i = bisect.bisect(self.points, key) % len(self.points)
        return Choice(self.owners[i], "routing_key_hit", 0)
