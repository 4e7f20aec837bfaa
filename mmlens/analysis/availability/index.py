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

    def _changes_after(self, key: Key, at: float) -> dict[str, bool] | None:
        """Per unit, whether its first change to ``key`` after ``at`` added it."""
        entries = self._log.get(key)
        if not entries:
            return None
        first: dict[str, tuple[float, bool]] = {}
        for ts, unit, added in entries:  # units' clocks differ: entries are not sorted
            if ts > at and (unit not in first or ts < first[unit][0]):
                first[unit] = (ts, added)
        return {u: added for u, (_, added) in first.items()} or None

    def overlaps(self, keys: Sequence[Key], at: float | None = None,
                 units: Iterable[str] | None = None) -> dict[str, int]:
        """Per unit holding the first key: how many leading ``keys`` it held (at ``at``);
        ``units`` limits the answer to those."""
        if not keys:
            return {}
        changed: dict[int, dict[str, bool]] = {}
        if at is not None and at < self.latest and self._log:
            for i, k in enumerate(keys):
                c = self._changes_after(k, at)
                if c:
                    changed[i] = c
        out: dict[str, int] = {}
        first = keys[0]
        pool = self.units.items() if units is None else [
            (u, self.units.get(u, set())) for u in units]
        for unit, held in pool:
            if not changed:
                if first in held:
                    out[unit] = len(list(takewhile(bool, map(held.__contains__, keys))))
                continue
            n = _held_prefix(keys, held, unit, changed)
            if n:
                out[unit] = n
        return out

    def held_through(self, keys: Sequence[Key], unit: str, since: float, until: float) -> int:
        """Leading ``keys`` that ``unit`` held at ``since`` and lost none of until ``until``
        (re-stored blocks do not hide an eviction in between)."""
        base = self.overlaps(keys, since, units=(unit,)).get(unit, 0)
        for i, k in enumerate(keys[:base]):
            for ts, u, added in self._log.get(k, ()):
                if u == unit and not added and since < ts <= until:
                    return i
        return base

    def resident_blocks(self) -> dict[str, int]:
        return {u: len(k) for u, k in self.units.items()}


def _held_prefix(keys: Sequence[Key], held: set[Key], unit: str,
                 changed: dict[int, dict[str, bool]]) -> int:
    for i, k in enumerate(keys):
        c = changed.get(i)
        was = (not c[unit]) if c is not None and unit in c else k in held
        if not was:
            return i
    return len(keys)
