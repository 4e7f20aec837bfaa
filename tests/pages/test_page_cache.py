"""The pages' cached reads are keyed by the store's data versions: a collector tick that wrote
nothing new leaves a revisited page on its cache (no trace is read again), a new request is on
the page at the next run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from mmlens.ui import shared
from streamlit.testing.v1 import AppTest

from mmlens.records import RequestTrace
from mmlens.store.open import open_store
from mmlens.store.sqlite import Store
from tests.core.test_store_versions import tick
from tests.pages.apptest_util import APP, frames
from tests.pages.recorded_store import Recorded


def trace(rid: str, ts: float) -> RequestTrace:
    return RequestTrace(rid, "http://127.0.0.1:30000", "smg", "m", ts, False, status=200,
                        worker="grpc://127.0.0.1:50051", prompt_tokens=64, cached_tokens=0)


@pytest.fixture
def sql(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every query the SQLite store runs from now on."""
    queries: list[str] = []
    original = Store._rows

    def logged(self: Any, query: str, args: Any = ()) -> Any:
        queries.append(query)
        return original(self, query, args)

    monkeypatch.setattr(Store, "_rows", logged)
    return queries


def test_revisit_after_an_idle_tick_reads_no_trace(tmp_path: Any, sql: list[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    db = str(tmp_path / "s.db")
    store = open_store(db)
    now = time.time()
    store.add_traces([trace(f"req-{i}", now - 60 + i) for i in range(5)])
    tick(store, now)
    monkeypatch.setenv("MMLENS_DB", db)
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    shared.forget_store_reads()
    shared._reader.clear()
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.switch_page("pages/routing.py").run()
    assert not at.exception
    assert any("FROM traces" in q for q in sql)

    def rerun_after_tick() -> list[str]:
        # the versions are read again, and a timer-based cache (3 s, before) would expire
        time.sleep(max(shared.VERSIONS_TTL_S + 0.2, 3.5))
        del sql[:]
        at.run()
        assert not at.exception
        return [q for q in sql if "FROM traces" in q and "max(" not in q]

    tick(store, now + 5)
    assert rerun_after_tick() == []
    store.add_traces([trace("req-new", now + 6)])
    assert rerun_after_tick()
    assert any("req-new" in df.to_csv() for df in frames(at))
    store.close()


def test_each_page_run_notes_its_script_time(db: Recorded, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With MMLENS_PAGE_TIMES set, every page run appends its page and script seconds (what
    benchmarks/pages_browser.py prints beside the browser's click → drawn)."""
    out = tmp_path / "times.jsonl"
    monkeypatch.setenv(shared.ENV_PAGE_TIMES, str(out))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.run()  # AppTest's switch_page runs a page's script alone, without the app's timer
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["page"] for r in runs] == ["index", "index"]
    assert all(r["wall_s"] > 0 and r["cpu_s"] >= 0 for r in runs)


def five_traces(tmp_path: Any) -> tuple[str, Store, float]:
    """A store of five traces a second apart (req-0 … req-4), nothing of it cached yet."""
    db = str(tmp_path / "s.db")
    store = open_store(db)
    now = time.time()
    store.add_traces([trace(f"req-{i}", now + i) for i in range(5)])
    shared.forget_store_reads()
    shared._reader.clear()
    return db, store, now


def newest_three(db: str, sql: list[str]) -> tuple[list[str], list[str]]:
    """The trace window's three newest ids, and the trace queries that read them."""
    shared.store_versions.clear()  # the versions are read again
    del sql[:]
    ids = [t.request_id for t in shared.recent_traces(db, 3)]
    return ids, [q for q in sql if "FROM traces" in q and "max(" not in q]


def test_new_traces_top_up_the_cached_ones(tmp_path: Any, sql: list[str]) -> None:
    """When requests arrive (and no decision), a page reads only the traces recorded since
    its newest, not the whole window again; one recorded behind the newest shows at the next
    whole read."""
    db, store, now = five_traces(tmp_path)

    def newest() -> tuple[list[str], list[str]]:
        return newest_three(db, sql)

    assert newest()[0] == ["req-4", "req-3", "req-2"]
    store.add_traces([trace("req-5", now + 5), trace("req-6", now + 6)])
    ids, queries = newest()
    assert ids == ["req-6", "req-5", "req-4"]
    assert len(queries) == 1 and "ts >= ?" in queries[0]
    store.add_traces([trace("late", now + 4.5)])
    assert newest()[0] == ["req-6", "req-5", "req-4"]
    shared.forget_store_reads()
    assert newest()[0] == ["req-6", "req-5", "late"]
    store.close()


def test_a_smaller_window_takes_the_newest_of_a_larger_one_read_at_the_same_versions(
        tmp_path: Any, sql: list[str]) -> None:
    """A page opening a window of fewer traces than another page's up-to-date window reads
    no trace: it is that window's newest (decoding them again was a first visit's most)."""
    db, store, now = five_traces(tmp_path)

    def window(limit: int) -> tuple[list[str], list[str]]:
        shared.store_versions.clear()  # the versions are read again
        sql.clear()
        ids = [t.request_id for t in shared.recent_traces(db, limit)]
        return ids, [q for q in sql if "FROM traces" in q and "max(" not in q]

    ids, queries = window(4)
    assert ids == ["req-4", "req-3", "req-2", "req-1"] and len(queries) == 1
    assert window(2) == (["req-4", "req-3"], [])  # the larger window's newest, no read
    # once the store has moved, the larger window is not current: the smaller one tops up
    store.add_traces([trace("req-5", now + 5)])
    ids, queries = window(2)
    assert ids == ["req-5", "req-4"] and len(queries) == 1 and "ts >= ?" in queries[0]
    # a window larger than every other one reads the store
    ids, queries = window(5)
    assert ids == ["req-5", "req-4", "req-3", "req-2", "req-1"] and len(queries) == 1
    store.close()


def test_verdicts_read_only_what_moved(tmp_path: Any, sql: list[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A new request reads its own verdict, not the window's again; a verdict judged again
    in place is read by its judgement time and replaces the one shown."""
    from mmlens.records import Verdict

    db = str(tmp_path / "s.db")
    store = open_store(db)
    now = time.time()
    store.add_traces([trace(f"req-{i}", now + i) for i in range(4)])
    store.add_verdicts([Verdict(f"req-{i}", now + i, "cold", "nothing cached",
                                judged_at=now + 10) for i in range(4)])
    shared.forget_store_reads()
    shared._reader.clear()
    read_ids: list[list[str]] = []
    original = Store.verdicts_for

    def counted(self: Any, request_ids: Any) -> Any:
        read_ids.append(list(request_ids))
        return original(self, request_ids)

    monkeypatch.setattr(Store, "verdicts_for", counted)

    def verdicts() -> tuple[dict[str, str], list[str]]:
        shared.store_versions.clear()
        del sql[:], read_ids[:]
        got = shared.recent_verdicts(db, 3)
        return ({rid: v.category for rid, v in got.items()},
                [q for q in sql if "FROM verdicts" in q and "max(" not in q])

    assert verdicts()[0] == {"req-3": "cold", "req-2": "cold", "req-1": "cold"}
    assert sorted(read_ids[0]) == ["req-1", "req-2", "req-3"]
    assert verdicts()[1] == []  # nothing moved: nothing read
    store.add_traces([trace("req-4", now + 4)])
    shown, _ = verdicts()
    assert shown == {"req-3": "cold", "req-2": "cold"}  # req-4 pending, req-1 out
    assert read_ids == [["req-4"]]
    store.add_verdicts([Verdict("req-4", now + 4, "hit", "all cached", judged_at=now + 20),
                        Verdict("req-2", now + 2, "false_miss", "re-judged",
                                judged_at=now + 20, version=1)])
    shown, queries = verdicts()
    assert shown == {"req-4": "hit", "req-3": "cold", "req-2": "false_miss"}
    assert read_ids == [] and len(queries) == 1 and "judged_at >= ?" in queries[0]
    store.close()


def test_an_expired_read_is_served_while_it_is_read_again_in_the_background() -> None:
    """Past its lifetime an entry whose versions hold is still served (a click after a
    minute idle waits for no read) and read again behind it; new versions are read at once;
    unshared values are copies."""
    from mmlens.ui.read_cache import VersionedCache

    store = {"x": [1]}
    reads: list[str] = []

    def read(key: str) -> list[int]:
        reads.append(key)
        return list(store[key])

    cache: VersionedCache[list[int]] = VersionedCache(read, 0.05, 4, shared=False)
    assert cache.get(("v1",), "x") == [1] and reads == ["x"]
    cache.get(("v1",), "x").append(99)  # a copy: the cached value is untouched
    assert cache.get(("v1",), "x") == [1] and reads == ["x"]
    store["x"] = [2]  # a change no version shows
    time.sleep(0.06)
    assert cache.get(("v1",), "x") == [1]  # served stale, not waited for
    deadline = time.monotonic() + 5
    while cache.refreshes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reads == ["x", "x"] and cache.get(("v1",), "x") == [2]
    store["x"] = [3]
    assert cache.get(("v2",), "x") == [3] and len(reads) == 3  # new versions: read now


def test_the_windows_whole_reads_run_behind_the_page(tmp_path: Any, sql: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the trace window's whole read is due, the page run that finds it reads only the
    new traces; the whole read runs in the background and brings the late trace (recorded
    behind the newest) at the next run."""
    db, store, now = five_traces(tmp_path)

    def newest() -> tuple[list[str], list[str]]:
        return newest_three(db, sql)

    assert newest()[0] == ["req-4", "req-3", "req-2"]
    monkeypatch.setattr(shared, "SAFETY_TTL_S", 0.0)  # the whole read is due from now on
    store.add_traces([trace("late", now + 3.5), trace("req-5", now + 5)])
    ids, queries = newest()
    assert ids == ["req-5", "req-4", "req-3"]  # topped up: the late one not seen yet
    assert queries and all("ts >= ?" in q for q in queries[:1])
    window = shared._trace_window(db, 3)
    deadline = time.monotonic() + 10
    while (window.rereading or not any("ts >= ?" not in q for q in sql)) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setattr(shared, "SAFETY_TTL_S", 60.0)
    assert newest()[0] == ["req-5", "req-4", "late"]
    store.close()


def test_a_slow_moving_read_is_served_briefly_after_a_change_and_read_behind() -> None:
    """With ``stale_s``, a read whose store changed is served from the cache while the entry
    is younger than that, and read again behind it at the new versions; an older entry is
    read at once."""
    from mmlens.ui.read_cache import VersionedCache

    value = {"n": 1}
    cache: VersionedCache[int] = VersionedCache(lambda: value["n"], 60.0, 4, shared=True,
                                                stale_s=0.5)
    assert cache.get(("v1",)) == 1
    value["n"] = 2
    assert cache.get(("v2",)) == 1  # changed, but the entry is fresh enough: served
    deadline = time.monotonic() + 5
    while cache.refreshes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get(("v2",)) == 2  # read behind the page, at the new versions
    value["n"] = 3
    time.sleep(0.55)
    assert cache.get(("v3",)) == 3  # too old to serve after a change: read now
    assert cache.refreshes == 1
