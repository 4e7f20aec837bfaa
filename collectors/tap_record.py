"""The tap's recorder: what the proxy relayed becomes a record and is stored, on a thread of
its own, after the client got its answer.

- A bounded backlog between the proxy and this thread: over it an exchange is dropped and
  counted (``dropped_backlog``); traffic is never held up.
- Per exchange: parse (``mmlens.ingest.tap_parse``), the expected layout when asked, the
  images behind http(s) URLs when ``--fetch-images`` (fetched on a loop of their own, then
  back here). A record that would not read back (the readers' own decode of its stored form)
  is quarantined alone (counted by kind, the last ones kept for a look). The store checks
  that itself on every write and says how many it took: the recorder looks for the ones it
  refused only when it took fewer, and checks every record before it is held while the
  store is down (a batch held as the store goes down is checked by the store when written).
- Writes in batches; a batch the store refuses is retried one record at a time, so one
  record the store cannot take loses nothing else. A store that is down is the ``buffer``'s
  (``mmlens.collectors.store_buffer.BufferedStore``, the collector's own): records are held
  in memory, then spilled to a file, written when it is back (on every batch and idle tick),
  and a tap started after one that died writes what that one left.
- Health is flushed after each write and, when something changed, on a timer even when no
  traffic comes (the ``recorded`` count does not lag behind an idle tap).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import aiohttp
from mmlens.collectors.tap_images import ImageFetcher

from mmlens.ingest.tap_parse import Exchange, RequestFacts, exchange_trace
from mmlens.layout.sent import SentImage
from mmlens.records import CollectorHealth, RequestTrace
from mmlens.store import codec

log = logging.getLogger("mmlens.tap")

LayoutFn = Callable[[RequestFacts, RequestTrace], None]
# Stores a batch; may return how many records of it the store took (the store leaves out the
# ones that would not read back), anything else: not told.
Write = Callable[[list[RequestTrace]], object]


class Intake(Protocol):
    """Where the recorder's loop takes its work from when it runs on the caller's thread
    (``Recorder.run``): a list of exchanges (their bytes needed only until the next
    ``get``), a fetched record, or None at the end; ``queue.Empty`` after ``timeout`` s."""

    def get(self, timeout: float) -> list[Exchange] | _Fetched | None: ...


class StoreBuffer(Protocol):
    """What the recorder needs of the store's outage buffer (``BufferedStore``)."""

    @property
    def backlog(self) -> int: ...

    def retry(self) -> bool: ...

    def flush_backlog(self) -> None: ...
MAX_BATCH = 2000
# A batch is written once this long has passed since its first exchange came (or it is
# full): one store transaction for many records, not one each (a record is in the store
# this much later, at most).
LINGER_S = 0.05
MAX_BACKLOG_BYTES = 256 << 20  # exchanges waiting to be recorded, bodies included
KEPT_QUARANTINED = 100


@dataclass(slots=True)
class _Fetched:
    """A record whose http(s) images came back from the fetch loop."""

    req: RequestFacts
    trace: RequestTrace
    got: list[tuple[int, SentImage | None]]


@dataclass(frozen=True, slots=True)
class Quarantined:
    kind: str
    request_id: str
    reason: str


def unreadable(t: RequestTrace) -> str | None:
    """Why the stored form of ``t`` would not read back (the readers' decode), or None."""
    try:
        body = codec.trace_body(t)
    except (UnicodeError, TypeError, ValueError, OverflowError) as exc:
        return f"encode: {type(exc).__name__}: {exc}"
    return None if codec.trace(body) is not None else "decode: the readers skip it"


def all_readable(batch: list[RequestTrace]) -> bool:
    """Whether every record of ``batch`` reads back, in one decode of them all (False: one
    might not, ``unreadable`` says which)."""
    try:
        bodies = [codec.trace_body(t) for t in batch]
    except (UnicodeError, TypeError, ValueError, OverflowError):
        return False
    return codec.all_read_back(bodies, codec.traces_dec)


class Recorder:
    def __init__(self, write: Write, health: CollectorHealth, *, router: str = "",
                 store_text: bool = False, layout: LayoutFn | None = None,
                 fetcher: ImageFetcher | None = None,
                 flush_health: Callable[[CollectorHealth], None] | None = None,
                 buffer: StoreBuffer | None = None, max_backlog: int = 10_000,
                 max_backlog_bytes: int = MAX_BACKLOG_BYTES,
                 health_every_s: float = 1.0, linger_s: float = LINGER_S,
                 thread: bool = True) -> None:
        self.write = write
        self.health = health
        self.router = router
        self.store_text = store_text
        self.layout = layout
        self.flush_health = flush_health
        self.buffer = buffer
        self.max_backlog = max_backlog
        self.max_backlog_bytes = max_backlog_bytes
        self._backlog_bytes = 0  # of the exchanges waiting
        self._backlog_n = 0
        self._bytes_lock = threading.Lock()
        self.health_every_s = health_every_s
        self.linger_s = linger_s
        self.quarantined: deque[Quarantined] = deque(maxlen=KEPT_QUARANTINED)
        self._q: queue.SimpleQueue[list[Exchange] | _Fetched | None] = queue.SimpleQueue()
        self._flushed: tuple[float, int] | None = None
        self._last = 0.0
        self._fetch = FetchLoop(fetcher, self._q.put) if fetcher is not None else None
        if fetcher is not None:
            fetcher.health = health  # its outcomes are the tap's
        self._closing = threading.Event()
        self._get: Callable[[float], list[Exchange] | _Fetched | None] = \
            lambda timeout: self._q.get(timeout=timeout)
        # Without a thread of its own the caller runs the loop (``run``).
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="tap-recorder", daemon=True)
            self._thread.start()

    def submit(self, ex: Exchange) -> None:
        """Called on the proxy's loop: never blocks."""
        self.submit_many([ex])

    def submit_many(self, exs: list[Exchange]) -> None:
        """Exchanges into the backlog in one hand-over (what one read of the recorder
        process's pipe brought); those past its bounds are dropped and counted."""
        kept = []
        with self._bytes_lock:
            for ex in exs:
                size = ex.size()
                if (self._closing.is_set() or self._backlog_n >= self.max_backlog
                        or self._backlog_bytes + size > self.max_backlog_bytes):
                    self.health.count("dropped_backlog")
                    continue
                self._backlog_bytes += size
                self._backlog_n += 1
                kept.append(ex)
        if kept:
            self._q.put(kept)

    def taken(self, ex: Exchange) -> None:
        """``ex`` left the backlog (its bytes may be handed over again)."""
        with self._bytes_lock:
            self._backlog_bytes -= ex.size()
            self._backlog_n -= 1

    def close(self, timeout_s: float = 30.0) -> None:
        """Record what is queued and spill what the store did not take. The store is not
        retried once closing starts, so this waits for at most the store call under way
        (bounded by the store's own lock wait and back-off) and the spill."""
        self.close_fetches(timeout_s)
        self._closing.set()
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=timeout_s)

    def close_fetches(self, timeout_s: float = 30.0) -> None:
        """Wait for the images being fetched (their records are queued then)."""
        if self._fetch is not None and not self._fetch.closed:
            self._fetch.close(min(timeout_s, 10.0))

    def run(self, intake: Intake) -> None:
        """The recorder's loop on this thread, on what ``intake`` gives, until it gives
        None; fetched records come back through ``fetched``."""
        self._get = intake.get
        self._run()

    def fetched(self) -> _Fetched | None:
        """A record whose images were fetched, if one is waiting (for an ``Intake``)."""
        try:
            item = self._q.get_nowait()
        except queue.Empty:
            return None
        return item if isinstance(item, _Fetched) else None

    # --- the recorder's thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                item = self._get(min(self.health_every_s, 0.5))
            except queue.Empty:
                self._store([])  # a batch waiting for the store, when its retry is due
                self._health()
                continue
            batch: list[RequestTrace] = []
            stop = item is None
            due = time.monotonic() + self.linger_s
            while item is not None:
                for one in item if isinstance(item, list) else (item,):
                    self._take(one, batch)
                if len(batch) >= MAX_BATCH:
                    break
                try:
                    item = self._get(max(0.0, due - time.monotonic()))
                except queue.Empty:
                    break
                stop = item is None
            self._store(batch, retry=not stop)
            if stop and self.buffer is not None:
                self.buffer.flush_backlog()  # what is still held waits in its spill file
            self._health(force=stop)
            if stop:
                return

    def _take(self, item: Exchange | _Fetched, batch: list[RequestTrace]) -> None:
        if isinstance(item, Exchange):
            self.taken(item)
        try:
            if isinstance(item, _Fetched):
                for i, sent in item.got:
                    if sent is not None:
                        item.req.add_fetched(i, sent)
                self._finish(item.req, item.trace, batch)
                return
            req, _, t = exchange_trace(item, self.router, self.store_text)
            if self._fetch is not None and req.http_images():
                self._fetch.submit(req, t)
                return
            self._finish(req, t, batch)
        except Exception as exc:
            self._quarantine("parse", "", f"{type(exc).__name__}: {exc}")

    def _finish(self, req: RequestFacts, t: RequestTrace, batch: list[RequestTrace]) -> None:
        if self.layout is not None:
            with contextlib.suppress(Exception):  # a layout the core refuses stays unknown
                self.layout(req, t)
        batch.append(t)

    def _readable(self, batch: list[RequestTrace]) -> list[RequestTrace]:
        """``batch`` without the records that would not read back (each quarantined)."""
        if all_readable(batch):
            return batch
        out = []
        for t in batch:
            why = unreadable(t)
            if why is None:
                out.append(t)
            else:
                self._quarantine("unreadable", t.request_id, why)
        return out

    def _quarantine(self, kind: str, request_id: str, reason: str) -> None:
        self.quarantined.append(Quarantined(kind, request_id, reason[:300]))
        self.health.count("quarantined")
        self.health.error(f"quarantined_{kind}", f"{request_id}: {reason}", time.time())

    def _store(self, batch: list[RequestTrace], retry: bool = True) -> None:
        """Write ``batch`` (the buffer holds it when the store is down) and, with ``retry``,
        what the buffer held before, when its back-off allows."""
        if self.buffer is not None and retry and not self._closing.is_set():
            with contextlib.suppress(Exception):  # a store that fails even so stays held
                self.buffer.retry()
        if batch and self.buffer is not None and self.buffer.backlog:
            batch = self._readable(batch)  # held for later: nothing checks it till then
        if batch:
            try:
                took = self.write(batch)
                if type(took) is int and took < len(batch) and not (
                        self.buffer is not None and self.buffer.backlog):
                    batch = self._readable(batch)  # which it left out (merged ones: none)
                self._stored(len(batch))
            except Exception:  # one at a time: a record the store refuses is set aside alone
                for t in batch:
                    try:
                        self.write([t])
                        self._stored(1)
                    except Exception as exc:
                        self._quarantine("store_rejected", t.request_id,
                                         f"{type(exc).__name__}: {exc}")
        self.health.counters["store_backlog"] = self.buffer.backlog if self.buffer else 0

    def _stored(self, n: int) -> None:
        self.health.count("recorded", n)
        self.health.ok(time.time())

    def _health(self, force: bool = False) -> None:
        """The health row written when anything on it changed (at most every
        ``health_every_s`` unless ``force``)."""
        if self.flush_health is None:
            return
        state = (sum(self.health.counters.values()), sum(self.health.errors.values()))
        if state == self._flushed and not force:
            return
        now = time.monotonic()
        if not force and self._flushed is not None and now - self._last < self.health_every_s:
            return
        snapshot = replace(self.health, counters=dict(self.health.counters),
                           errors=dict(self.health.errors))
        try:
            self.flush_health(snapshot)
            self._flushed, self._last = state, now
        except Exception:
            log.debug("tap: health write failed", exc_info=True)


class FetchLoop:
    """``--fetch-images``: a thread running the fetches on its own event loop (the proxy's
    loop never waits for an image); each record goes back to the recorder when its images
    are in (or refused)."""

    def __init__(self, fetcher: ImageFetcher, done: Callable[[_Fetched], None]) -> None:
        self.fetcher = fetcher
        self.done = done
        self.loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tap-fetch",
                                        daemon=True)
        self._thread.start()
        self.closed = False

    def submit(self, req: RequestFacts, t: RequestTrace) -> None:
        fut = asyncio.run_coroutine_threadsafe(self._fetch(req, t), self.loop)
        self._tasks.add(fut)
        fut.add_done_callback(self._tasks.discard)

    async def _fetch(self, req: RequestFacts, t: RequestTrace) -> None:
        if self._session is None:
            self._session = self.fetcher.session()
        todo = req.http_images()
        got = await asyncio.gather(*(self.fetcher.describe(self._session, url)
                                     for _, url in todo), return_exceptions=True)
        self.done(_Fetched(req, t, [(i, s if isinstance(s, SentImage) else None)
                                    for (i, _), s in zip(todo, got, strict=True)]))

    def close(self, timeout_s: float) -> None:
        self.closed = True
        deadline = time.monotonic() + timeout_s
        for fut in list(self._tasks):  # records still fetching: give them their deadline
            with contextlib.suppress(Exception):
                fut.result(max(0.0, deadline - time.monotonic()))

        async def shut() -> None:
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
