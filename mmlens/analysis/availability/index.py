"""Resident content keys per worker, now and as they were at an earlier time.

Each worker (``worker`` or ``worker#rank``) holds content keys
(``mmlens.layout.content_keys``); a change log per key, kept for ``horizon_s``, rewinds a
query to the moment a router decided, after later stores and evictions were applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

Key = int


class ResidentKeys:
    """One map from each resident key to the units holding it (a bitmap, one bit per unit in
    order of first store), so a request's leading blocks are matched on every unit at once:
    one lookup per key instead of one per key and unit."""

    def __init__(self, horizon_s: float = 900.0) -> None:
        self.horizon_s = horizon_s
        self._holders: dict[Key, int] = {}
        self._bits: dict[str, int] = {}
        self._names: list[str] = []
        self._counts: list[int] = []
        self._log: dict[Key, list[tuple[float, str, bool]]] = {}
        self._expiry: deque[tuple[float, Key]] = deque()
        self.latest = float("-inf")
        self.rewind_floor = float("-inf")  # queries before this time are not exact

    def _bit(self, unit: str) -> int:
        bit = self._bits.get(unit)
        if bit is None:
            bit = self._bits[unit] = 1 << len(self._names)
            self._names.append(unit)
            self._counts.append(0)
        return bit

    @property
    def units(self) -> dict[str, set[Key]]:
        """Each unit's keys (built on demand: a pass over every resident key)."""
        out: dict[str, set[Key]] = {u: set() for u in self._names}
        names = self._names
        for k, mask in self._holders.items():
            for i in _bit_indexes(mask):
                out[names[i]].add(k)
        return out

    def add(self, ts: float, unit: str, keys: Iterable[Key]) -> None:
        bit = self._bit(unit)
        holders = self._holders
        log = self.horizon_s > 0
        added = 0
        for k in keys:
            mask = holders.get(k, 0)
            if not mask & bit:
                holders[k] = mask | bit
                added += 1
                if log:
                    self._note(ts, k, unit, True)
        self._counts[bit.bit_length() - 1] += added
        self._advance(ts)

    def remove(self, ts: float, unit: str, keys: Iterable[Key]) -> None:
        bit = self._bits.get(unit)
        if bit is None:
            return
        holders = self._holders
        log = self.horizon_s > 0
        removed = 0
        for k in keys:
            mask = holders.get(k, 0)
            if mask & bit:
                mask ^= bit
                if mask:
                    holders[k] = mask
                else:
                    del holders[k]
                removed += 1
                if log:
                    self._note(ts, k, unit, False)
        self._counts[bit.bit_length() - 1] -= removed
        self._advance(ts)

    def clear(self, ts: float, unit: str) -> None:
        bit = self._bits.get(unit)
        if bit is not None and self._counts[bit.bit_length() - 1]:
            self.remove(ts, unit, [k for k, mask in self._holders.items() if mask & bit])

    def _note(self, ts: float, key: Key, unit: str, added: bool) -> None:
        self._log.setdefault(key, []).append((ts, unit, added))
        self._expiry.append((ts, key))

    def _advance(self, ts: float) -> None:
        if ts <= self.latest:
            return
        self.latest = ts
        cutoff = ts - self.horizon_s
        expiry = self._expiry
        while expiry and expiry[0][0] < cutoff:
            old, key = expiry.popleft()
            entries = self._log.get(key)
            if entries is not None:
                kept = [e for e in entries if e[0] > old]
                if kept:
                    self._log[key] = kept
                else:
                    del self._log[key]
            self.rewind_floor = old

    def _changes_after(self, keys: Sequence[Key], at: float) -> dict[str, dict[int, bool]]:
        """Per unit, per index into ``keys``: whether the unit's first change to that key
        after ``at`` added it (so it was absent at ``at``) or removed it (present)."""
        out: dict[str, dict[int, tuple[float, bool]]] = {}
        log = self._log
        for i, k in enumerate(keys):
            entries = log.get(k)
            if not entries:
                continue
            for ts, unit, added in entries:  # units' clocks differ: entries are not sorted
                if ts > at:
                    per = out.setdefault(unit, {})
                    if i not in per or ts < per[i][0]:
                        per[i] = (ts, added)
        return {u: {i: added for i, (_, added) in per.items()} for u, per in out.items()}

    def overlaps(self, keys: Sequence[Key], at: float | None = None,
                 units: Iterable[str] | None = None) -> dict[str, int]:
        """Per unit holding the first key: how many leading ``keys`` it held (at ``at``);
        ``units`` limits the answer to those."""
        if not keys:
            return {}
        changed: dict[str, dict[int, bool]] = {}
        if at is not None and at < self.latest and self._log:
            changed = self._changes_after(keys, at)
        bits = self._bits
        if units is None:
            pool = (1 << len(self._names)) - 1
        else:
            pool = 0
            for u in units:
                pool |= bits.get(u, 0)
        lead = _leading(self._holders, keys, pool)
        for u in changed:
            i = bits[u].bit_length() - 1
            if pool >> i & 1:
                lead.setdefault(i, 0)
        out: dict[str, int] = {}
        holders, names = self._holders, self._names
        for i in sorted(lead):
            unit, n = names[i], lead[i]
            c = changed.get(unit)
            if c:
                bit = 1 << i
                n = _rewound(keys, lambda k, bit=bit: bool(holders.get(k, 0) & bit), c, n)
            if n:
                out[unit] = n
        return out

    def held_through(self, keys: Sequence[Key], unit: str, since: float, until: float,
                     base: int | None = None) -> int:
        """Leading ``keys`` that ``unit`` held at ``since`` (``base``, when known) and lost
        none of until ``until`` (re-stored blocks do not hide an eviction in between)."""
        if base is None:
            base = self.overlaps(keys, since, units=(unit,)).get(unit, 0)
        for i, k in enumerate(keys[:base]):
            for ts, u, added in self._log.get(k, ()):
                if u == unit and not added and since < ts <= until:
                    return i
        return base

    def resident_blocks(self) -> dict[str, int]:
        return dict(zip(self._names, self._counts, strict=True))


def _bit_indexes(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _leading(holders: dict[Key, int], keys: Sequence[Key], pool: int) -> dict[int, int]:
    """Per unit (bit index) of ``pool`` holding ``keys[0]`` now: how many leading keys it
    holds."""
    lead: dict[int, int] = {}
    mask = pool
    if not mask:
        return lead
    for n, k in enumerate(keys):
        still = mask & holders.get(k, 0)
        if still != mask:
            if n:
                lost = mask ^ still
                one = lost.bit_length() - 1
                if lost == 1 << one:  # the common case: one unit stops here
                    lead[one] = n
                else:
                    lead.update(dict.fromkeys(_bit_indexes(lost), n))
            mask = still
            if not mask:
                return lead
    lead.update(dict.fromkeys(_bit_indexes(mask), len(keys)))
    return lead


def _rewound(keys: Sequence[Key], held: Callable[[Key], bool], changes: dict[int, bool],
             n: int) -> int:
    """The held prefix at an earlier time from the one held now (``n``) and the first change
    per key since: a key added since was absent then, one removed since was present."""
    added = [i for i, a in changes.items() if a and i < n]
    if added:
        return min(added)
    while n < len(keys):
        a = changes.get(n)
        if a is True or (a is None and not held(keys[n])):
            break
        n += 1
    return n
