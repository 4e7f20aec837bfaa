"""The pages' cache of store reads: each value kept with the store versions it was read at.

An entry whose versions still hold is served. One older than its lifetime (a change no version
shows must appear within it) is served too, while a background thread reads it again
(stale-while-revalidate): coming back to a page after a minute on a store that did not change
draws it from the cache instead of waiting for every read of the page again. Values are kept
as pickles and each hit gets its own copy (as ``st.cache_data`` does), or, when ``shared``, as
the objects themselves (request records, which pages treat as read-only).

A read whose answer moves slowly (per-minute rollups, five minutes of counters) may also be
served up to ``stale_s`` old after the store changed, and read again behind the page: on a
fleet the collectors write every second, so a version-keyed entry is otherwise never hit."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Entry:
    versions: Hashable
    value: Any  # the object when shared, else its pickle
    read_at: float


class VersionedCache(Generic[T]):
    def __init__(self, read: Callable[..., T], ttl_s: float, max_entries: int,
                 shared: bool, stale_s: float = 0.0) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.max_entries = max_entries
        self.shared = shared
        self.lock = threading.Lock()
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.refreshing: set[Hashable] = set()
        self.refreshes = 0  # background reads done (tests, benchmarks)

    def get(self, versions: Hashable, *args: Any) -> T:
        """``read(*args)``, from the cache while ``versions`` hold, or while the entry is
        younger than ``stale_s`` (then read again behind it at the new versions)."""
        with self.lock:
            entry = self.entries.get(args)
            if entry is not None:
                age = time.monotonic() - entry.read_at
                same = entry.versions == versions
                if same or age < self.stale_s:
                    self.entries.move_to_end(args)
                    if (not same or age >= self.ttl_s) and args not in self.refreshing:
                        self.refreshing.add(args)
                        threading.Thread(target=self._refresh, args=(versions, args),
                                         daemon=True, name="mmlens-cache-refresh").start()
                    return self._out(entry.value)
        value = self.read(*args)
        self._put(versions, args, value)
        return value

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def _put(self, versions: Hashable, args: tuple[Any, ...], value: T) -> None:
        kept = value if self.shared else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.entries[args] = _Entry(versions, kept, time.monotonic())
            self.entries.move_to_end(args)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)

    def _out(self, kept: Any) -> T:
        return kept if self.shared else pickle.loads(kept)

    def _refresh(self, versions: Hashable, args: tuple[Any, ...]) -> None:
        try:
            self._put(versions, args, self.read(*args))
            self.refreshes += 1
        except Exception as exc:  # the entry stays; the next expiry tries again
            log.info("background re-read failed: %s: %s", type(exc).__name__, exc)
        finally:
            with self.lock:
                self.refreshing.discard(args)
