"""Resident content keys per worker, now and as they were at an earlier time.

Each worker (``worker`` or ``worker#rank``) holds a set of content keys
(``mmlens.layout.content_keys``); a change log per key, kept for ``horizon_s``, rewinds a
query to the moment a router decided, after later stores and evictions were applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import takewhile

Key = int


class ResidentKeys:
    def __init__(self, horizon_s: float = 900.0) -> None:
        self.horizon_s = horizon_s
        self.units: dict[str, set[Key]] = {}
        self._log: dict[Key, list[tuple[float, str, bool]]] = {}
        self._expiry: deque[tuple[float, Key]] = deque()
        self.latest = float("-inf")
        self.rewind_floor = float("-inf")  # queries before this time are not exact

    def unit(self, name: str) -> set[Key]:
        keys = self.units.get(name)
        if keys is None:
            keys = self.units[name] = set()
        return keys

    def add(self, ts: float, unit: str, keys: Iterable[Key]) -> None:
        held = self.unit(unit)
        if self.horizon_s <= 0:
            held.update(keys)
        else:
            for k in keys:
                if k not in held:
                    held.add(k)
                    self._note(ts, k, unit, True)
        self._advance(ts)

    def remove(self, ts: float, unit: str, keys: Iterable[Key]) -> None:
        held = self.units.get(unit)
        if held is None:
            return
        for k in keys:
            if k in held:
                held.discard(k)
                if self.horizon_s > 0:
                    self._note(ts, k, unit, False)
        self._advance(ts)

    def clear(self, ts: float, unit: str) -> None:
        held = self.units.get(unit)
        if held:
            self.remove(ts, unit, list(held))

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
        pool = self.units.items() if units is None else [
            (u, self.units.get(u, set())) for u in units]
        out: dict[str, int] = {}
        first = keys[0]
        for unit, held in pool:
            c = changed.get(unit)
            if c is None and first not in held:
                continue
            n = len(list(takewhile(bool, map(held.__contains__, keys))))
            if c:
                n = _rewound(keys, held, c, n)
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
        return {u: len(k) for u, k in self.units.items()}


def _rewound(keys: Sequence[Key], held: set[Key], changes: dict[int, bool], n: int) -> int:
    """The held prefix at an earlier time from the one held now (``n``) and the first change
    per key since: a key added since was absent then, one removed since was present."""
    added = [i for i, a in changes.items() if a and i < n]
    if added:
        return min(added)
    while n < len(keys):
        a = changes.get(n)
        if a is True or (a is None and keys[n] not in held):
            break
        n += 1
    return n
