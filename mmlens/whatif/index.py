"""A router's index of which worker holds which block (key → workers), and the prefix match
a request gets from it: per worker, the consecutive leading blocks found.

Workers are kept as bit masks (worker w is bit w): following a prefix is one ``&`` per
block, with no set made per step."""

from __future__ import annotations

from collections.abc import Iterable


def workers_of(mask: int) -> set[int]:
    """The workers whose bits are set in ``mask``."""
    out = set()
    while mask:
        low = mask & -mask
        out.add(low.bit_length() - 1)
        mask ^= low
    return out


class BlockIndex:
    """Block key → the workers holding it (SMG's event index and token tree, Dynamo's radix
    tree with KV events). A removal drops the worker from the key whatever else it holds
    under the same key (SMG dedups content-blind keys: two images' blocks are one entry)."""

    __slots__ = ("holders",)

    def __init__(self) -> None:
        self.holders: dict[int, int] = {}  # key → mask of workers

    def __len__(self) -> int:
        return len(self.holders)

    def add(self, worker: int, keys: Iterable[int]) -> None:
        holders = self.holders
        get = holders.get
        bit = 1 << worker
        for k in keys:
            holders[k] = get(k, 0) | bit

    def remove(self, worker: int, key: int) -> None:
        holders = self.holders
        mask = holders.get(key)
        if mask is not None:
            mask &= ~(1 << worker)
            if mask:
                holders[key] = mask
            else:
                del holders[key]

    def groups(self, keys: tuple[int, ...]) -> list[tuple[int, set[int]]]:
        """(depth, the workers whose consecutive match of ``keys`` ends there), shallowest
        first; workers with no match are in none."""
        return [(d, workers_of(m)) for d, m in self.group_masks(keys)]

    def group_masks(self, keys: tuple[int, ...]) -> list[tuple[int, int]]:
        """As ``groups``, each group a worker mask."""
        get = self.holders.get
        cur = get(keys[0], 0) if keys else 0
        if not cur:
            return []
        out: list[tuple[int, int]] = []
        depth = 1
        for k in keys[1:]:
            nxt = get(k, 0)
            both = cur & nxt
            if both != cur:
                out.append((depth, cur ^ both))
                if not both:
                    return out
                cur = both
            depth += 1
        out.append((depth, cur))
        return out

    def overlaps(self, keys: tuple[int, ...]) -> dict[int, int]:
        """Worker → consecutive leading blocks of ``keys`` it holds (workers with none are
        absent)."""
        return {w: d for d, ws in self.groups(keys) for w in ws}

    def deepest(self, keys: tuple[int, ...]) -> tuple[int, set[int]]:
        """The longest match and the workers that have it (0 and none: no match)."""
        get = self.holders.get
        cur = get(keys[0], 0) if keys else 0
        if not cur:
            return 0, set()
        depth = 1
        for k in keys[1:]:
            both = cur & get(k, 0)
            if not both:
                break
            cur = both
            depth += 1
        return depth, workers_of(cur)


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

    def group_masks(self, keys: tuple[int, ...], now: float) -> list[tuple[int, int]]:
        return [(d, sum(1 << w for w in ws)) for d, ws in self.groups(keys, now)]

    def overlaps(self, keys: tuple[int, ...], now: float) -> dict[int, int]:
        return {w: d for d, ws in self.groups(keys, now) for w in ws}
