"""A store that survives its outages: the collector's and the tap's appends (samples, KV
events, traces, decisions, views) go through ``BufferedStore``, which holds what a down store
(PostgreSQL restarted, a full disk) refused, asks again with back-off (reconnecting to
PostgreSQL first), and writes the backlog in order once the store is back. The backlog is
bounded in memory; past the bound the oldest records spill to a local file
(``mmlens.collectors.spill_file``: msgpack, read back the same way). Records are dropped, and
counted, only when the spill file cannot take them (past its bound, or its disk full).
Latest-value writes (health, meta, resident summaries) are skipped while down: the next tick
writes them again. Everything else is the store's own (``__getattr__``).

Exactly once, across kill -9: each spilled frame is written in one transaction with a meta row
saying how far its file is written (``spill:<file>``), so a replay cut short resumes after
the last frame stored. A writer that stops with a backlog spills what it holds in memory; a
writer started on the same store and spill folder adopts the files a dead one left
(``orphans``) and replays them before its own records, reported on its outage row
(``recovered_files``, ``recovered_records``).

Usage: ``BufferedStore(store, spill_dir)``, then the store's add methods on it and
``retry()`` now and then; ``outage_health`` says what it holds.
"""

from __future__ import annotations

import array
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from mmlens.collectors.spill_file import SpillFile, orphans, scope_of

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.records import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CollectorHealth,
    MetricSample,
    RoutingDecision,
)
from mmlens.store import codec
from mmlens.store.base import SQLStore

BACKOFF_S = (0.5, 30.0)
# While the store is down a retry waits this long for its lock, not the store's usual wait:
# a writer stopping (or a tap whose proxy was killed) then spills within about this long.
DOWN_LOCK_WAIT_S = 0.5
MAX_MEMORY = 200_000  # records held in memory before the oldest spill
MAX_SPILL_BYTES = 1 << 30
_KV = {"stored": BlockStored, "removed": BlockRemoved, "cleared": AllBlocksCleared}


def _plain(obj: Any) -> Any:
    if isinstance(obj, array.array):  # token ids as the fast KV path decodes them
        return obj.tolist()
    raise NotImplementedError(f"cannot spill {type(obj).__name__}")


_enc = msgspec.msgpack.Encoder(enc_hook=_plain)
_dec = msgspec.msgpack.Decoder()


def _kv_event(obj: dict[str, Any]) -> Any:
    return msgspec.convert(obj, _KV[obj["kind"]], strict=False)


# How each buffered method's records go to the spill file and back.
_SPILL: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "add_samples": (lambda s: s, lambda o: msgspec.convert(o, MetricSample, strict=False)),
    "add_kv_events": (lambda e: e, _kv_event),
    "add_kv_content": (lambda e: e, _kv_event),
    "add_kv_views": (lambda p: p, lambda o: msgspec.convert(o, ViewPoint, strict=False)),
    "add_traces": (codec.trace_body, codec.trace),
    "add_decisions": (codec.decision_body,
                      lambda o: msgspec.json.decode(o, type=RoutingDecision)),
}
APPENDS = tuple(_SPILL)
LATEST = ("set_meta", "set_health", "set_kv_state", "set_quarantined")


class BufferedStore:
    def __init__(self, store: SQLStore, spill_dir: str | Path | None = None,
                 max_memory: int = MAX_MEMORY, max_spill_bytes: int = MAX_SPILL_BYTES,
                 backoff: tuple[float, float] = BACKOFF_S, health_target: str = "outage",
                 ) -> None:
        self.store = store
        self.max_memory, self.max_spill_bytes = max_memory, max_spill_bytes
        self.backoff = backoff
        self._wait = backoff[0]
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._held: deque[tuple[str, list[Any], Any]] = deque()  # (method, records, extra)
        self._held_n = 0
        self.outage_health = CollectorHealth("store", health_target)
        self._dir = Path(spill_dir) if spill_dir else Path(tempfile.gettempdir())
        self._scope = scope_of(store_identity(store))
        # Files to write before anything held in memory: those adopted, then this process's.
        self._files: deque[SpillFile] = deque(orphans(self._dir, self._scope))
        self._spilled_n = sum(f.records(self._marker(f)) for f in self._files)
        if self._files:
            self.outage_health.count("recovered_files", len(self._files))
            self.outage_health.count("recovered_records", self._spilled_n)
        self._spill: SpillFile | None = None  # the file this process appends to
        self._lock_wait: float | None = None  # the store's own, while it is down
        self._count()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    # --- the buffered writes ------------------------------------------------------------------

    def add_samples(self, samples: Any) -> int:
        return self._append("add_samples", list(samples))

    def add_kv_events(self, events: Any) -> int:
        return self._append("add_kv_events", list(events))

    def add_kv_content(self, events: Any) -> int | None:
        return self._append("add_kv_content", list(events))

    def add_kv_views(self, points: Any) -> int:
        return self._append("add_kv_views", list(points))

    def add_traces(self, traces: Any) -> int:
        return self._append("add_traces", list(traces))

    def add_decisions(self, decisions: Any, ts: float | None = None) -> int:
        return self._append("add_decisions", list(decisions), ts)

    def set_meta(self, key: str, value: Any) -> None:
        self._latest("set_meta", key, value)

    def set_health(self, items: Any, ts: float | None = None, instance: str = "") -> None:
        self._latest("set_health", list(items), ts, instance)

    def set_kv_state(self, summary: Any, ts: float) -> None:
        self._latest("set_kv_state", summary, ts)

    def set_quarantined(self, items: Any, instance: str = "") -> None:
        self._latest("set_quarantined", items, instance)

    @property
    def backlog(self) -> int:
        """Records not in the store yet (in memory and spilled)."""
        return self._held_n + self._spilled_n

    @property
    def held_in_memory(self) -> int:
        """Records only this process holds (lost if it is killed)."""
        return self._held_n

    # --- outage handling --------------------------------------------------------------------

    def _append(self, method: str, records: list[Any], extra: Any = None) -> int:
        if not records:
            return 0
        if self.down_since is None and not self.backlog:
            try:
                return int(self._call(method, records, extra) or 0)
            except Exception as exc:
                if not self.store.is_outage(exc):
                    raise
                self._went_down(exc)
        self._hold(method, records, extra)
        return 0

    def _latest(self, method: str, *args: Any) -> None:
        if self.down_since is not None:
            self.outage_health.count(f"skipped:{method}")
            return
        try:
            getattr(self.store, method)(*args)
        except Exception as exc:
            if not self.store.is_outage(exc):
                raise
            self._went_down(exc)
            self.outage_health.count(f"skipped:{method}")

    def _call(self, method: str, records: list[Any], extra: Any) -> Any:
        fn = getattr(self.store, method)
        return fn(records) if extra is None else fn(records, extra)

    def _write(self, method: str, records: list[Any], extra: Any) -> None:
        """Write held records; ones the store refuses for their content (not an outage) are
        set aside alone, counted, instead of stalling the backlog behind them."""
        try:
            self._call(method, records, extra)
            return
        except Exception as exc:
            if self.store.is_outage(exc):
                raise
        for r in records:
            try:
                self._call(method, [r], extra)
            except Exception as exc:
                if self.store.is_outage(exc):
                    raise
                self.outage_health.count("unwritable_records")
                self.outage_health.error("unwritable", f"{method}: {type(exc).__name__}: "
                                         f"{exc}", time.time())

    def _went_down(self, exc: Exception) -> None:
        now = time.time()
        if self.down_since is None:
            self.down_since = now
            self.outage_health.count("outages")
            self._wait = self.backoff[0]
            was = self.store.lock_wait()
            if was is not None and was > DOWN_LOCK_WAIT_S:
                self._lock_wait = was
                self.store.lock_wait(DOWN_LOCK_WAIT_S)
        self.outage_health.error("store_down", f"{type(exc).__name__}: {exc}", now)
        self._retry_at = time.monotonic() + self._wait
        self._wait = min(self._wait * 2, self.backoff[1])
        self._count()

    def _hold(self, method: str, records: list[Any], extra: Any) -> None:
        self._held.append((method, records, extra))
        self._held_n += len(records)
        while self._held_n > self.max_memory and len(self._held) > 1:
            self._spill_item(self._held.popleft())
        self._count()

    def _spill_item(self, item: tuple[str, list[Any], Any]) -> None:
        method, records, extra = item
        self._held_n -= len(records)
        encode = _SPILL[method][0]
        frame = _enc.encode([method, extra, [encode(r) for r in records]])
        if self._spill is None:
            self._spill = SpillFile.new(self._dir, self._scope)
            self._files.append(self._spill)
        why = None
        if self._spill.size() + len(frame) + 12 > self.max_spill_bytes:
            why = f"the spill file is at its bound ({self.max_spill_bytes} bytes)"
        else:
            try:
                self._spill.append(frame, len(records))
            except OSError as exc:
                why = f"the spill file cannot be written: {exc}"
        if why is not None:
            self.outage_health.count("dropped_records", len(records))  # the last resort
            self.outage_health.error("backlog_full", f"{len(records)} records of {method} "
                                     f"dropped: {why}", time.time())
            return
        self._spilled_n += len(records)
        self.outage_health.count("spilled_records", len(records))

    def retry(self) -> bool:
        """Write the backlog when its back-off has passed (reconnecting first); True when
        nothing is held any more."""
        if not self.backlog and self.down_since is None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            self.store.reconnect()
            self._write_spilled()
            while self._held:
                method, records, extra = self._held[0]
                self._write(method, records, extra)
                self._held.popleft()
                self._held_n -= len(records)
                self.outage_health.count("retried_records", len(records))
        except Exception as exc:
            if not self.store.is_outage(exc):
                raise
            self._went_down(exc)
            return False
        if self.down_since is not None:
            self.outage_health.counters["last_outage_s"] = time.time() - self.down_since
            self.outage_health.ok(time.time())
            if self._lock_wait is not None:
                self.store.lock_wait(self._lock_wait)
                self._lock_wait = None
        self.down_since = None
        self._count()
        return True

    def _marker(self, spill: SpillFile) -> int:
        """Bytes of ``spill`` already in the store (0 when the store cannot say now: its
        count is then an upper bound until the replay reads the marker)."""
        try:
            found = self.store.meta(f"spill:{spill.name}")
        except Exception as exc:
            if not self.store.is_outage(exc):
                raise
            return 0
        return int(found) if isinstance(found, int) else 0

    def _write_spilled(self) -> None:
        """The spill files in order, each frame with its file's marker in one transaction;
        a file wholly written is removed, then its marker."""
        while self._files:
            spill = self._files[0]
            key = f"spill:{spill.name}"
            for end, count, frame in spill.frames(self._marker(spill)):
                method, extra, raw = _dec.decode(frame)
                records = [_SPILL[method][1](r) for r in raw]
                with self.store.atomically():
                    self._write(method, records, extra)
                    self.store.set_meta(key, end)
                self._spilled_n -= count
                self.outage_health.count("retried_records", count)
            self._files.popleft()
            if spill is self._spill:
                self._spill = None
            spill.remove()
            self.store.delete_meta(key)
        self._spilled_n = 0

    def _count(self) -> None:
        c = self.outage_health.counters
        c["backlog_records"] = self.backlog
        c["spilled_backlog_records"] = self._spilled_n
        c["down"] = int(self.down_since is not None)

    def flush_backlog(self) -> None:
        """On stop: try the backlog once more unless the store is down (a stop does not wait
        out another timeout); what is still held in memory then is spilled, for the next
        writer on this store and folder to write (what cannot be is dropped, counted)."""
        if self.down_since is None:
            self._retry_at = 0.0
            if self.retry():
                return
        if not self.backlog:
            return
        while self._held:
            self._spill_item(self._held.popleft())
        self._count()
        if self._spill is not None:
            self._spill.close()  # its lock goes with it: the next writer adopts it
        self.outage_health.error("stopped_with_backlog", f"{self._spilled_n} records left in "
                                 f"{self._dir} for the next start", time.time())


def store_identity(store: Any) -> str:
    """What names the store a backlog belongs to: its file, or its URL (password redacted)."""
    path = str(getattr(store, "path", "") or id(store))
    return path if "://" in path else os.path.realpath(path)
