"""What every page shares: the store reader, cached queries, clear empty/error states."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pandas as pd
import streamlit as st
from mmlens.ui.read_cache import VersionedCache

from mmlens.analysis.affinity import multi_resident, worker_image_sets
from mmlens.analysis.alert_states import AlertTracker, TrackedAlert
from mmlens.analysis.availability.view import AvailabilityView, view_model
from mmlens.analysis.block_labels import block_labels
from mmlens.analysis.decisions import merged
from mmlens.analysis.fleet import KEEP, fleet_hit_rates, fold_timeline
from mmlens.analysis.liveness import WorkersView, liveness_names, worker_liveness, workers_view
from mmlens.analysis.overview import Alert
from mmlens.analysis.request_view import rebuild_parts
from mmlens.analysis.rollups import (
    MINUTE_S,
    hit_lines_of,
    hit_rates_of_sums,
    prefer_rollups,
    timeline_of,
)
from mmlens.analysis.routing_table import candidate_rows, gate_rows, policy_text, score_rows
from mmlens.analysis.timeseries import HIT_NAMES
from mmlens.analysis.views.affinity import multi_resident_rows, worker_rows
from mmlens.analysis.views.cache import ResidentBar
from mmlens.analysis.views.cache import resident_bars as _resident_bars
from mmlens.analysis.views.common import short_worker as short_worker
from mmlens.analysis.views.common import verdict_css
from mmlens.analysis.views.common import worker_label as worker_label
from mmlens.analysis.views.common import worker_names as _worker_names
from mmlens.figures.cache import inspector_link as request_link
from mmlens.figures.cache import prefix_tree_figure
from mmlens.figures.html_table import MAX_ROWS as MAX_TABLE_ROWS
from mmlens.figures.html_table import html_table, scrolling
from mmlens.figures.inserted import inserting_html
from mmlens.figures.metric_row import Metric, metric_row
from mmlens.ingest.metrics_normalize import NormalizedMetrics
from mmlens.layout.imageinfo import ImageInfo, probe_image
from mmlens.layout.modeldir import resolve_model
from mmlens.records import KVEventRow, MetricSample, RequestTrace, ResidentSummary, Verdict
from mmlens.state import Snapshot
from mmlens.store.open import NoStoreYet, StoreError
from mmlens.store.open import label as store_label
from mmlens.store.reader import StoreReader, open_reader
from mmlens.store.snapshot import build_snapshot, with_health

log = logging.getLogger(__name__)
ENV_DB = "MMLENS_DB"
# A file the app appends each page run's script time to (benchmarks/pages_browser.py puts
# the server's share of a click beside the browser's).
ENV_PAGE_TIMES = "MMLENS_PAGE_TIMES"
REFRESH_S = 5
T = TypeVar("T")


@contextlib.contextmanager
def script_timer(page: str) -> Iterator[None]:
    """Note the page run's wall and CPU seconds (this thread's) in ``$MMLENS_PAGE_TIMES``,
    when set; a run that ends by switching page or stopping counts too."""
    out = os.environ.get(ENV_PAGE_TIMES)
    if not out:
        yield
        return
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        line = json.dumps({"page": page, "wall_s": time.perf_counter() - wall,
                           "cpu_s": time.thread_time() - cpu, "ts": time.time()})
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def db_path() -> str | None:
    return st.session_state.get("db_path") or os.environ.get(ENV_DB)


@st.cache_resource(show_spinner=False)
def _reader(path: str) -> StoreReader:
    return open_reader(path)


def reader_for(path: str) -> StoreReader:
    """The shared reader of a store known to exist (no messages: safe in cached functions)."""
    return _reader(path)


def require_reader() -> str:
    """Every data page's prologue: the store's path, or the page stops after saying why there
    is no store to read."""
    r = reader()
    if r is None:
        st.stop()
    return r.path


def reader() -> StoreReader | None:
    """The shared read-only store, or None after telling the user why there is none."""
    path = db_path()
    if not path:
        st.info("No store configured. Start the dashboard with `mmlens dashboard --demo` (or "
                "set `MMLENS_DB` to the store `mmlens collect` writes).")
        return None
    try:
        return _reader(path)
    except NoStoreYet:
        st.info("No data yet: the collectors have not created the store. It appears within "
                "a few seconds of `mmlens collect` starting.")
        return None
    except StoreError as exc:
        st.warning(f"The store cannot be read: {exc}")
        return None


# Where page_guard notes each exception it turned into a message, so that page tests fail on
# one instead of passing on an error box (the last few only: a session lives long).
CAUGHT_KEY = "_mmlens_page_guard_caught"
CAUGHT_KEEP = 20


@contextlib.contextmanager
def page_guard(what: str) -> Iterator[None]:
    """No page ever shows a traceback: failures become one clear message."""
    try:
        yield
    except (StoreError, ValueError, OSError, KeyError) as exc:
        st.error(f"{what}: {exc}")
        _note_caught(what, exc)
    except Exception as exc:  # the last line of defence: say what failed, not where
        st.error(f"{what} failed: {type(exc).__name__}: {exc}")
        _note_caught(what, exc)


def _note_caught(what: str, exc: Exception) -> None:
    caught = [*st.session_state.get(CAUGHT_KEY, []), f"{what}: {type(exc).__name__}: {exc}"]
    st.session_state[CAUGHT_KEY] = caught[-CAUGHT_KEEP:]


# --- cached queries (keyed by store path and the versions of the tables they read) --------

# A cached read lives until a table it reads changes (``mmlens.store.versions``), so coming
# back to a page after a minute redraws it from the cache when the store has nothing new;
# VERSIONS_TTL_S bounds how often the versions themselves are read (all sessions share them),
# SAFETY_TTL_S how stale an entry whose change no version shows may be served (it is read
# again in the background once older).
VERSIONS_TTL_S = 1.0
SAFETY_TTL_S = 60.0
# Reads of per-minute rollups and of windows of minutes (hit rates, KV timelines, liveness)
# may be served this old after the store changed, while read again behind the page: on a
# fleet the collectors write every second, and these are the reads a page waits for most.
# Requests, verdicts and decisions are always shown as stored.
SLOW_MOVING_S = float(REFRESH_S)

# Queries returning request records are cached as shared objects, not copies: st.cache_data
# pickles its value on every hit, which for 500 traces costs ~150 ms per page run. Pages and
# analysis treat records as read-only.
records_cache = st.cache_resource


@st.cache_data(ttl=VERSIONS_TTL_S, show_spinner=False, max_entries=4)
def store_versions(path: str) -> dict[str, tuple[Any, ...]]:
    return _reader(path).data_versions()


def _versions_of(path: str, tables: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
    found = store_versions(path)
    return tuple(found.get(t, ()) for t in tables)


_store_reads: list[VersionedCache[Any]] = []


def store_cached(*tables: str, records: bool = False, max_entries: int = 8,
                 ttl: float = SAFETY_TTL_S, stale_s: float = 0.0,
                 ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Cache ``read(path, ...)`` until one of ``tables`` changes; past ``ttl`` it is read
    again in the background while the cached value is served (``read_cache``); ``stale_s``:
    after a change, served that long while read again behind the page. ``records``: the
    value is shared, not copied (see ``records_cache``)."""
    def wrap(read: Callable[..., T]) -> Callable[..., T]:
        cache: VersionedCache[T] = VersionedCache(read, ttl, max_entries, shared=records,
                                                  stale_s=stale_s)
        _store_reads.append(cache)

        @functools.wraps(read)
        def current(path: str, *args: Any) -> T:
            return cache.get(_versions_of(path, tables), path, *args)

        current.clear = cache.clear  # type: ignore[attr-defined]
        current.cache = cache  # type: ignore[attr-defined]
        return current
    return wrap


def forget_store_reads() -> None:
    """Drop every cached read (after this session wrote to the store itself)."""
    st.cache_data.clear()
    for cache in _store_reads:
        cache.clear()
    for read in (recent_traces, recent_verdicts):
        read.clear()  # type: ignore[attr-defined]


@store_cached("traces", "decisions", "verdicts", "samples", "worker_minutes", "meta",
              "quarantine", records=True)
def _snapshot(path: str, n_traces: int) -> Snapshot:
    # health: read fresh on every run (``snapshot``), so not here
    return build_snapshot(_reader(path), n_traces=n_traces, count_kv_events=False,
                          metrics=overview_metrics(path), resident=False, health=[],
                          traces=recent_traces(path, n_traces),
                          verdicts=recent_verdicts(path, n_traces))


def snapshot(path: str, n_traces: int = 200) -> Snapshot:
    """The Overview's snapshot (no resident summaries; see ``overview_metrics``); its
    collector health (rewritten every tick) read fresh."""
    return with_health(_snapshot(path, n_traces), _reader(path).health())


@store_cached("samples", stale_s=SLOW_MOVING_S)
def router_metrics(path: str) -> NormalizedMetrics:
    """The last 5 min of the routers' own series, normalized (no engine series)."""
    return _reader(path).router_metrics()


# Router series the Overview does not show (the Routing page does): the per-worker request
# counts, on a fleet the bulk of the routers' samples, and Dynamo's per-stage overheads,
# found by a name prefix that no index serves (a scan of the window's every sample).
NOT_ON_OVERVIEW = ("smg_worker_requests_total", "dynamo_router_overhead_")


@store_cached("samples", "worker_minutes", stale_s=SLOW_MOVING_S)
def overview_metrics(path: str, window_s: float = 300.0) -> NormalizedMetrics:
    """The last ``window_s`` normalized; on a fleet the routers' series and each worker's hit
    rate from its rollup minutes (one row per worker), not every worker's raw counters."""
    r = _reader(path)
    sums = r.worker_hit_sums(window_s)
    if sums is None or not prefer_rollups(window_s, len(sums)):
        return r.normalized(window_s)
    metrics = r.router_metrics(window_s, skip=NOT_ON_OVERVIEW)
    metrics.hit_rates += hit_rates_of_sums(sums)
    return metrics


@store_cached("meta", max_entries=16)
def meta(path: str, key: str) -> Any:
    return _reader(path).meta(key)


@store_cached("meta")
def worker_names(path: str) -> dict[str, str]:
    """The config's worker names (w1, w2) by the URLs routers and events use for them."""
    return _worker_names(_reader(path).meta("targets"))


@store_cached("traces", "verdicts", records=True, max_entries=256)
def verdict(path: str, request_id: str) -> Verdict | None:
    """A request's stored verdict (None: not judged yet)."""
    return _reader(path).verdict(request_id)


class _TraceWindow:
    """One cached list of the newest traces, topped up with the traces recorded since its
    newest rather than read and decoded again whole each time one arrives (on a busy store,
    between any two clicks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[RequestTrace] = []
        self.versions: tuple[Any, ...] | None = None
        self.read_at = 0.0
        self.rereading = False


def _reread_soon(window: Any, read: Callable[[], T], merge: Callable[[T], None]) -> None:
    """A window's whole read, due every ``SAFETY_TTL_S``, in the background (one at a time):
    the page run that finds it due serves the window topped up as usual; ``merge`` folds the
    whole read in under the window's lock once it is done."""
    if window.rereading:
        return
    window.rereading = True

    def run() -> None:
        try:
            value = read()
            with window.lock:
                merge(value)
                window.read_at = time.monotonic()
        except Exception as exc:  # the window stays as topped up; the next run tries again
            log.info("background window read failed: %s: %s", type(exc).__name__, exc)
        finally:
            window.rereading = False

    threading.Thread(target=run, daemon=True, name="mmlens-window-read").start()


@st.cache_resource(show_spinner=False, max_entries=16)
def _trace_window(path: str, limit: int) -> _TraceWindow:
    window = _TraceWindow()
    with _trace_windows_lock:
        _trace_windows[(path, limit)] = window
    return window


# Every trace window by (store, limit): a page whose window is to be read whole takes the
# newest of a larger window that is up to date instead (the Cache page's 500 after the
# Affinity page's 1,000: 140 ms of decoding on the 100k store, a first visit's most).
_trace_windows: dict[tuple[str, int], _TraceWindow] = {}
_trace_windows_lock = threading.Lock()


def _from_larger_window(path: str, limit: int, versions: tuple[Any, ...],
                        ) -> tuple[list[RequestTrace], float] | None:
    """The newest ``limit`` traces of a larger window of ``path`` read at ``versions`` (and
    when it was read whole), if there is one."""
    with _trace_windows_lock:
        larger = sorted(((n, w) for (p, n), w in _trace_windows.items()
                         if p == path and n > limit), key=lambda nw: nw[0])
    for _n, window in larger:  # locks only ever taken from smaller to larger: no deadlock
        if not window.lock.acquire(blocking=False):
            continue  # being read (ahead, or by another page): no page run waits for it
        try:
            if window.versions == versions and window.traces:
                return window.traces[:limit], window.read_at
        finally:
            window.lock.release()
    return None


def _forget_trace_windows() -> None:
    _trace_window.clear()
    with _trace_windows_lock:
        _trace_windows.clear()


def recent_traces(path: str, limit: int = 300) -> list[RequestTrace]:
    """The newest ``limit`` traces with their logged decisions (shared, not copied). When only
    new traces came (no decision), only those are read; a trace recorded late, behind the
    newest one, or merged in place shows after the next whole read, made in the background
    once the last is ``SAFETY_TTL_S`` old (no page run waits for it)."""
    versions = _versions_of(path, ("traces", "decisions"))
    window = _trace_window(path, limit)
    with window.lock:
        due = time.monotonic() - window.read_at >= SAFETY_TTL_S
        old = window.traces
        if versions == window.versions:
            pass
        elif old and window.versions is not None and versions[1] == window.versions[1]:
            seen = {t.request_id for t in old if t.ts == old[0].ts}
            new = [t for t in _reader(path).traces_from(old[0].ts, limit)
                   if t.request_id not in seen]
            window.traces = [*new, *old][:limit]
        elif (taken := _from_larger_window(path, limit, versions)) is not None:
            window.traces, window.read_at = taken
            due = time.monotonic() - window.read_at >= SAFETY_TTL_S
        else:
            window.traces = _reader(path).recent_traces(limit)
            window.read_at = time.monotonic()
            due = False
        window.versions = versions
        if due and window.traces:
            _reread_soon(window, lambda: _reader(path).recent_traces(limit),
                         lambda whole: _merge_traces(window, whole, limit))
        return window.traces


def _merge_traces(window: _TraceWindow, whole: list[RequestTrace], limit: int) -> None:
    """A whole read of the window, keeping what a top-up added while it ran."""
    newest = whole[0].ts if whole else float("-inf")
    ids = {t.request_id for t in whole}
    window.traces = [*(t for t in window.traces if t.ts >= newest and t.request_id not in ids),
                     *whole][:limit]


recent_traces.clear = _forget_trace_windows  # type: ignore[attr-defined]


class _VerdictWindow:
    """The stored verdicts of one trace window, kept up to date by reading only what moved:
    the verdicts of requests new to the window, and those judged since the last read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.known: dict[str, Verdict] = {}
        self.asked: set[str] = set()  # ids looked up (judged or not yet)
        self.shown: dict[str, Verdict] = {}
        self.ids: list[str] = []  # the window's requests, newest first
        self.versions: tuple[Any, ...] | None = None
        self.read_at = 0.0
        self.rereading = False


@st.cache_resource(show_spinner=False, max_entries=16)
def _verdict_window(path: str, limit: int) -> _VerdictWindow:
    return _VerdictWindow()


# Verdicts judged since the last read, past which the window is read whole instead.
REJUDGED_MAX = 5_000


def recent_verdicts(path: str, limit: int = 300) -> dict[str, Verdict]:
    """The stored verdicts of ``recent_traces(path, limit)`` (a request not judged yet has
    none: pending), shared, not copied. A new request's verdict is read alone; a change of
    the verdicts' version reads the verdicts judged at or after the previous one (the job
    re-judges in place, moving ``judged_at``); everything is read whole in the background
    every ``SAFETY_TTL_S``."""
    traces = recent_traces(path, limit)
    versions = _versions_of(path, ("traces", "decisions", "verdicts"))
    window = _verdict_window(path, limit)
    with window.lock:
        ids = [t.request_id for t in traces]
        now = time.monotonic()
        if window.versions is not None and now - window.read_at >= SAFETY_TTL_S:
            _reread_soon(window, lambda: _reader(path).store_verdicts(ids),
                         lambda whole: _merge_verdicts(window, whole))
        if versions == window.versions:
            return window.shown
        r = _reader(path)
        fresh = window.versions is None
        if not fresh and versions[2] != window.versions[2]:
            since = window.versions[2][0] if window.versions[2] else None
            judged = [] if since is None else r.verdicts_judged_since(since, REJUDGED_MAX)
            if since is None or len(judged) >= REJUDGED_MAX:
                fresh = True
            else:
                window.known.update((v.request_id, v) for v in judged)
        if fresh:
            window.known = r.store_verdicts(ids)
            window.asked = set(ids)
            window.read_at = now
        else:
            new = [i for i in ids if i not in window.asked]
            window.known.update(r.store_verdicts(new))
            window.asked.update(new)
        window.ids = ids
        _show_verdicts(window)
        window.versions = versions
        return window.shown


def _show_verdicts(window: _VerdictWindow) -> None:
    window.shown = {i: window.known[i] for i in window.ids if i in window.known}
    keep = set(window.ids)
    window.known = {i: v for i, v in window.known.items() if i in keep}
    window.asked &= keep


def _merge_verdicts(window: _VerdictWindow, whole: dict[str, Verdict]) -> None:
    """A whole read of the window's verdicts; one judged again while it ran stays."""
    for rid, v in whole.items():
        known = window.known.get(rid)
        if known is None or v.judged_at >= known.judged_at:
            window.known[rid] = v
    window.asked.update(whole)
    _show_verdicts(window)


recent_verdicts.clear = _verdict_window.clear  # type: ignore[attr-defined]


@store_cached("verdicts", records=True, max_entries=32)
def verdicts_by_id(path: str, request_ids: tuple[str, ...]) -> dict[str, Verdict]:
    r = _reader(path)
    return r.store_verdicts(request_ids)


@store_cached("traces", "decisions", records=True, max_entries=256)
def trace_by_id(path: str, request_id: str) -> RequestTrace | None:
    return _reader(path).trace(request_id)


@store_cached("samples")
def samples(path: str, names: tuple[str, ...], window_s: float) -> list[MetricSample]:
    """The ``window_s`` of samples named ``names`` before the latest one."""
    return _reader(path).recent_samples(window_s, names)


@store_cached("samples", "worker_minutes", stale_s=SLOW_MOVING_S)
def hit_rates(path: str, window_s: float) -> tuple[dict[str, list[tuple[float, float]]], float]:
    """Prefix hit-rate lines over ``window_s`` and their bucket width: on a fleet (or a long
    window) from the rollup minutes, else from the counters' samples (``fleet_hit_rates``);
    cached as lines, not as the samples behind them (a fleet's are 100k+)."""
    folded = _reader(path).folded_minutes(window_s, "queries", KEEP)
    if folded is not None and prefer_rollups(window_s, folded[1]):
        return hit_lines_of(*folded), MINUTE_S
    return fleet_hit_rates(_reader(path).recent_series(window_s, HIT_NAMES))


@store_cached("kv_events", "worker_minutes", stale_s=SLOW_MOVING_S)
def kv_timeline(path: str, window_s: float, bucket_s: float) -> list[tuple[float, str, str, int]]:
    """KV blocks per (bucket, worker, kind), the busiest workers named and the rest summed:
    on a fleet (or a long window) per minute from the rollups, else from the events."""
    folded = _reader(path).folded_minutes(window_s, "kv", KEEP)
    if folded is not None and prefer_rollups(window_s, folded[1]):
        return timeline_of(*folded)
    return fold_timeline(_reader(path).kv_timeline(window_s, bucket_s))


# Not served stale: it carries the alerts, which must show what the store holds.
@store_cached("samples", "kv_views", "kv_state", "traces", "decisions", "verdicts")
def worker_view(path: str, window_s: float = 900.0) -> WorkersView:
    """Per worker: live or gone (since when), its KV-event transport, and the alerts."""
    r = _reader(path)
    latest = r.latest_sample_ts() or time.time()
    samples = r.last_samples(latest - window_s, liveness_names())
    routers = sorted({s.target for s in samples})
    live = worker_liveness(samples, r.scrape_times(latest - window_s, routers))
    views = r.kv_views(latest - 120.0)
    return workers_view(live, kv_state(path), views, recent_traces(path, 200),
                        recent_verdicts(path, 200), time.time())


@store_cached("samples", "kv_views")
def kv_views(path: str, window_s: float) -> list[tuple[Any, ...]]:
    r = _reader(path)
    latest = r.latest_sample_ts() or time.time()
    return r.kv_views(latest - window_s)


@store_cached("kv_events")
def recent_kv_events(path: str, limit: int) -> list[KVEventRow]:
    return _reader(path).recent_kv_events(limit)


@store_cached("kv_events", "traces", "decisions", "meta")
def prefix_tree(path: str, n_events: int, n_traces: int) -> dict[str, Any] | None:
    """The Cache page's prefix tree of the newest ``n_events`` KV events, labelled by the
    recent traces, as a figure spec (None: no events); labelling them costs more than
    drawing the tree, so the spec is kept until an event or trace arrives."""
    events = recent_kv_events(path, n_events)
    if not events:
        return None
    labels = block_labels(events, recent_traces(path, n_traces))
    return prefix_tree_figure(events, labels, worker_names(path)).to_dict()


@store_cached("availability")
def availability(path: str, window_s: float) -> AvailabilityView:
    """Available vs achieved over the last ``window_s`` of evaluated requests."""
    return view_model(*_reader(path).availability_window(window_s), window_s)


@store_cached("kv_state")
def kv_state(path: str) -> list[ResidentSummary]:
    return _reader(path).kv_state()


# The Cache and Affinity pages cache what they show of the resident summaries, not the
# summaries: on a fleet those are 1,000 workers' image sets, and st.cache_data would copy
# them on every run.
@store_cached("kv_state", "meta")
def resident_bars(path: str) -> tuple[list[ResidentBar], int]:
    return _resident_bars(_reader(path).kv_state(), worker_names(path))


@store_cached("kv_state", "meta")
def residency(path: str) -> tuple[bool, list[dict[str, Any]], list[dict[str, Any]]]:
    """Whether any worker announced blocks, the images resident on several workers and each
    worker's resident images (the Affinity page's rows)."""
    state = _reader(path).kv_state()
    names = worker_names(path)
    return (bool(state), multi_resident_rows(multi_resident(state), names),
            worker_rows(worker_image_sets(state), names))


@st.cache_resource(show_spinner=False)
def _alert_tracker(path: str) -> tuple[AlertTracker, threading.Lock]:
    return AlertTracker(), threading.Lock()


def tracked_alerts(path: str, alerts: list[Alert]) -> list[TrackedAlert]:
    """The alerts found now, as states kept per store across page runs and sessions."""
    tracker, lock = _alert_tracker(path)
    with lock:
        return tracker.update(alerts, time.time())


def ago(ts: float | None) -> str:
    if ts is None:
        return "never"
    s = max(0.0, time.time() - ts)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago"


def inspector_link(request_id: str) -> str:
    return f"/inspector?request={request_id}"


def sidebar_status() -> None:
    """Which store the pages read and how fresh it is (shown under the navigation)."""
    path = db_path()
    if not path:
        st.sidebar.caption("Store: none yet")
        return
    try:
        snap_ts = _reader(path).latest_sample_ts()
    except NoStoreYet:
        st.sidebar.caption("Store: none yet")
        return
    except (StoreError, OSError, ValueError) as exc:
        st.sidebar.caption(f"Store unreadable: {exc}")
        return
    st.sidebar.caption(f"Store `{store_label(path)}` · last scrape {ago(snap_ts)}")


# The largest trace window a page reads (the Affinity page's), read ahead once per store.
AHEAD_TRACES = 1000


@st.cache_resource(show_spinner=False, max_entries=4)
def _tokenizers_loading(path: str) -> threading.Thread:
    def load() -> None:
        try:
            # its own connection: holding the shared reader's lock for this read made a
            # session's first page wait on it (330 ms of a fleet Overview's first run)
            own = open_reader(path)
            try:
                traces = _read_ahead(path, own)
            finally:
                own.close()
            models = {p[0] for t in traces[:50] if (p := rebuild_parts(t)) is not None}
            for name in sorted(models):
                resolve_model(name)  # its tokenizer stays loaded for the process
        except Exception as exc:  # a head start only: the page that needs it says what failed
            log.info("tokenizers not loaded ahead: %s: %s", type(exc).__name__, exc)

    thread = threading.Thread(target=load, name="mmlens-tokenizers", daemon=True)
    thread.start()
    return thread


def _read_ahead(path: str, own: StoreReader) -> list[RequestTrace]:
    """The newest ``AHEAD_TRACES`` traces read on ``own``, put in the trace window of that
    size when no page has read it yet: the Affinity page's first visit would otherwise
    decode them (610 ms of its script on the 100k store, busy core), and smaller windows
    take theirs from it (``_from_larger_window``)."""
    window = _trace_window(path, AHEAD_TRACES)
    with window.lock:
        if window.versions is not None:
            return window.traces
        found = own.data_versions()
        versions = tuple(found.get(t, ()) for t in ("traces", "decisions"))
        window.traces = own.recent_traces(AHEAD_TRACES)
        window.read_at = time.monotonic()
        window.versions = versions
        return window.traces


def load_tokenizers_soon() -> threading.Thread | None:
    """Once per store and in the background, read the newest traces ahead (``_read_ahead``)
    and load the tokenizers of the layout models the recent requests name: the inspector's
    first view of a request would otherwise wait for one (~1.2 s for Qwen3's)."""
    path = db_path()
    if not path:
        return None
    try:
        _reader(path)
    except (StoreError, OSError, ValueError):
        return None
    return _tokenizers_loading(path)


EMPTY_CELL = "—"


def table(rows: Any) -> pd.DataFrame:
    """``rows`` as a frame to show: a column with gaps (None/NaN) shows them as "—", its other
    values as text, so no cell reads "None" and no column mixes numbers and text."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    for col in df.columns:
        gaps = df[col].isna()
        if gaps.any():
            df[col] = [EMPTY_CELL if gap else _cell(v)
                       for v, gap in zip(df[col], gaps, strict=True)]
    return df


def small_table(rows: Any, column_help: dict[str, str] | None = None) -> None:
    """``rows`` as a static HTML table when they fit a screen (``html_table.MAX_ROWS``), so a
    new tab showing it loads no data-frame code; longer, a data frame (it scrolls and sorts).
    ``st.html`` (its sanitizer keeps tables, tooltips and styles): no Markdown parse."""
    markup = table_markup(rows, column_help)
    if isinstance(markup, str):
        st.html(markup)


def table_markup(rows: Any, column_help: dict[str, str] | None = None) -> str | pd.DataFrame:
    """``rows`` as a static HTML table when they fit a screen; longer, the data frame shown
    (``small_table``)."""
    df = table(rows)
    if len(df) > MAX_TABLE_ROWS:
        config = {c: st.column_config.Column(c, help=h) for c, h in (column_help or {}).items()}
        st.dataframe(df, hide_index=True, width="stretch", column_config=config or None)
        return df
    return html_table([str(c) for c in df.columns], df.itertuples(index=False), column_help)


def metrics(*items: Metric) -> None:
    """Headline numbers side by side, as one static HTML row (``metric_row``), not a column
    and an ``st.metric`` each."""
    st.html(metric_row(items))


def chart(markup: str) -> None:
    """An SVG chart's markup (``mmlens.figures``), put in place by the browser's HTML parser:
    no Markdown parse of it in a fresh tab (``mmlens.figures.inserted``)."""
    st.html(inserting_html(markup), unsafe_allow_javascript=True)


def _cell(v: Any) -> str:
    # pandas turns an int column with a gap into floats: 3 must not read "3.0"
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def verdict_rows_css(df: pd.DataFrame) -> pd.DataFrame:
    """Each cell's CSS: its row's verdict colour, built once for the whole frame (a styler
    function per row cost 45-127 ms of a 100-row Routing run)."""
    verdicts = df["verdict"] if "verdict" in df.columns else [None] * len(df)
    per_row = [verdict_css(v) for v in verdicts]
    return pd.DataFrame({col: per_row for col in df.columns}, index=df.index)


def request_table(rows: list[dict[str, Any]], key: str,
                  column_config: dict[str, Any] | None = None) -> None:
    """Requests as a table, each row coloured by its verdict (misses stand out); selecting a
    row opens that request in the inspector, in this tab: one click."""
    df = table(rows)
    css = verdict_rows_css(df)
    styled = df.style.apply(lambda _: css, axis=None)
    event = st.dataframe(styled, hide_index=True, width="stretch", key=key,
                         on_select="rerun", selection_mode="single-row",
                         column_config=column_config)
    picked = list(getattr(getattr(event, "selection", None), "rows", None) or [])
    if picked and picked[0] < len(df):
        st.switch_page("pages/inspector.py",
                       query_params={"request": str(df.iloc[picked[0]]["request"])})
    st.caption("Select a row to open that request in the inspector. Red: a miss the router "
               "did not expect (false hit, count drift, fallback, eviction, error); orange: "
               "spilled; blue: cold; green: hit.")


def linked_request_table(rows: list[dict[str, Any]],
                         column_help: dict[str, str] | None = None) -> None:
    """Requests as a static table, each row coloured by its verdict (misses stand out) and
    each request's id a link that opens it in the inspector, in this tab: one click. A long
    table scrolls in its box. No data frame: a Styler's per-cell CSS cost the server 17-118 ms
    per 100 rows, and a new tab the data table's code (1.2 MB)."""
    df = table(rows)
    verdicts = df["verdict"] if "verdict" in df.columns else [None] * len(df)
    links = ({"request": [request_link(str(r)) for r in df["request"]]}
             if "request" in df.columns else {})
    chart(scrolling(html_table([str(c) for c in df.columns], df.itertuples(index=False),
                               column_help, [verdict_css(v) for v in verdicts], links)))
    st.caption("A request's id opens it in the inspector. Red: a miss the router did not "
               "expect (false hit, count drift, fallback, eviction, error); orange: spilled; "
               "blue: cold; green: hit.")


def routing_detail(trace: RequestTrace, names: dict[str, str] | None = None) -> None:
    """Candidates, scores and spill gates the router reported for one request."""
    view = merged(trace.predictions)
    st.caption(f"policy {policy_text(view)} · branch {view.branch or '—'} · from "
               f"{', '.join(view.sources) or 'nothing'}")
    candidates = candidate_rows(view, names)
    if candidates:
        st.markdown("**Candidates** — the workers the router considered, their load and health")
        small_table(candidates)
    else:
        st.caption("No candidates reported: they come from SMG's cache-trace log "
                   "(`SMG_CACHE_TRACE=1`, router log followed by `mmlens collect`) or "
                   "Dynamo's `Formula for worker_id` lines.")
    scores = score_rows(view, names)
    if scores:
        st.markdown("**Scores** — per worker, what the policy weighed (SMG: cached blocks and "
                    "expected wait; Dynamo: cost, lower wins)")
        small_table(scores)
    gates = gate_rows(view, names)
    if gates:
        st.markdown("**Spill gates** — whether load moved the request off the worker holding "
                    "its prefix (load > average × relative and > average + absolute)")
        small_table(gates)
    elif candidates:
        st.caption("No spill gate: the router had no preferred worker to keep or spill "
                   "(e.g. first sight of a prefix → least expected wait).")


def decision_detail(traces: list[RequestTrace], key: str,
                    names: dict[str, str] | None = None) -> None:
    """An expander to read one recent decision's candidates, scores and gates in full."""
    with st.expander("Candidates, scores and gates of one decision"):
        ids = [t.request_id for t in traces]
        rid = st.selectbox("Request", ids, key=key)
        trace = next((t for t in traces if t.request_id == rid), None)
        if trace is not None:
            routing_detail(trace, names)
            st.markdown(f"[Open in the inspector]({inspector_link(trace.request_id)})")


def uploaded_images(key: str) -> list[tuple[bytes, ImageInfo]]:
    """The upload widget's files that are images within the size limit; each refused file
    gets a message naming why."""
    uploads = st.file_uploader("Upload images", accept_multiple_files=True, key=key) or []
    out = []
    for up in uploads:
        data = up.getvalue()
        try:
            out.append((data, probe_image(data)))
        except ValueError as exc:
            st.error(f"{up.name} refused: {exc}")
    return out


WINDOWS_S = (300, 900, 3600, 6 * 3600)
DEFAULT_WINDOW_S = 900
REFRESH_CHOICES = (2, 5, 10, 30, 0)  # seconds; 0: paused


def time_controls() -> None:
    """One time range and one refresh rate for every page, in the sidebar (drawn by the app's
    entry point, so the choice holds from page to page)."""
    # A select box, like the refresh's: a slider is one more chunk of JavaScript for every
    # new tab to load and evaluate (60–160 ms of its main thread, demo at load 3).
    st.sidebar.selectbox(
        "Time range", WINDOWS_S, index=WINDOWS_S.index(DEFAULT_WINDOW_S), key="time_window",
        format_func=lambda s: f"{s // 60} min" if s < 3600 else f"{s // 3600} h",
        help="how far back every page's charts and tables reach")
    st.sidebar.selectbox(
        "Refresh", REFRESH_CHOICES, index=REFRESH_CHOICES.index(REFRESH_S), key="refresh_s",
        format_func=lambda s: f"every {s} s" if s else "paused",
        help="how often live panels re-read the store")


def time_window() -> int:
    """The time range every page shows, in seconds."""
    return int(st.session_state.get("time_window") or DEFAULT_WINDOW_S)


def refresh_every() -> float | None:
    """The live panels' refresh period (None: paused)."""
    s = st.session_state.get("refresh_s", REFRESH_S)
    return float(s) if s else None
