"""A router's index of which worker holds which block (key → workers), and the prefix match
a request gets from it: per worker, the consecutive leading blocks found."""

from __future__ import annotations

from collections.abc import Iterable


class BlockIndex:
    """Block key → the workers holding it (SMG's event index and token tree, Dynamo's radix
    tree with KV events). A removal drops the worker from the key whatever else it holds
    under the same key (SMG dedups content-blind keys: two images' blocks are one entry)."""

    __slots__ = ("holders",)

    def __init__(self) -> None:
        self.holders: dict[int, set[int]] = {}

    def __len__(self) -> int:
        return len(self.holders)

    def add(self, worker: int, keys: Iterable[int]) -> None:
        holders = self.holders
        for k in keys:
            s = holders.get(k)
            if s is None:
                holders[k] = {worker}
            else:
                s.add(worker)

    def remove(self, worker: int, key: int) -> None:
        s = self.holders.get(key)
        if s is not None:
            s.discard(worker)
            if not s:
                del self.holders[key]

    def groups(self, keys: tuple[int, ...]) -> list[tuple[int, set[int]]]:
        """(depth, the workers whose consecutive match of ``keys`` ends there), shallowest
        first; workers with no match are in none."""
        holders = self.holders
        if not keys:
            return []
        cur = holders.get(keys[0])
        if not cur:
            return []
        cur = set(cur)
        out: list[tuple[int, set[int]]] = []
        depth = 1
        for k in keys[1:]:
            nxt = holders.get(k)
            if not nxt:
                break
            if not cur <= nxt:
                out.append((depth, cur - nxt))
                cur &= nxt
            depth += 1
        out.append((depth, cur))
        return out

    def overlaps(self, keys: tuple[int, ...]) -> dict[int, int]:
        """Worker → consecutive leading blocks of ``keys`` it holds (workers with none are
        absent)."""
        return {w: d for d, ws in self.groups(keys) for w in ws}

    def deepest(self, keys: tuple[int, ...]) -> tuple[int, set[int]]:
        """The longest match and the workers that have it (0 and none: no match)."""
        holders = self.holders
        if not keys:
            return 0, set()
        cur = holders.get(keys[0])
        if not cur:
            return 0, set()
        depth = 1
        for k in keys[1:]:
            nxt = holders.get(k)
            if not nxt:
                break
            both = cur & nxt
            if not both:
                break
            cur = both
            depth += 1
        return depth, set(cur)


class ExpiringIndex:
    """Dynamo's approximate mode (``--no-router-kv-events``): the router records its own
    decisions, each block expiring ``ttl`` seconds after it was last routed (its default
    ``ttl`` retention policy)."""

    __slots__ = ("expiry", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.expiry: dict[int, dict[int, float]] = {}

    def __len__(self) -> int:
        return len(self.expiry)

    def add(self, worker: int, keys: Iterable[int], now: float) -> None:
        until = now + self.ttl
        expiry = self.expiry
        for k in keys:
            d = expiry.get(k)
            if d is None:
                expiry[k] = {worker: until}
            else:
                d[worker] = until

    def groups(self, keys: tuple[int, ...], now: float) -> list[tuple[int, set[int]]]:
        """As ``BlockIndex.groups``, over the blocks not expired at ``now``."""
        expiry = self.expiry
        out: list[tuple[int, set[int]]] = []
        cur: set[int] | None = None
        depth = 0
        for k in keys:
            d = expiry.get(k)
            live = {w for w, t in d.items() if t > now} if d else set()
            if cur is None:
                cur = live
            elif not cur <= live:
                out.append((depth, cur - live))
                cur &= live
            if not cur:
                break
            depth += 1
        if cur:
            out.append((depth, cur))
        return out

    def overlaps(self, keys: tuple[int, ...], now: float) -> dict[int, int]:
        return {w: d for d, ws in self.groups(keys, now) for w in ws}
