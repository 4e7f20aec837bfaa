"""A spill file a writer left behind is written by the next one, exactly once: a writer stops
with its backlog spilled (the store locked), the next is killed with SIGKILL while it writes
that backlog, a third finishes it. Samples are not idempotent in the store (no key), so a
frame written twice would be two rows: the count says lost and duplicated."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mmlens.collectors.spill_file import SpillFile, orphans, scope_of
from mmlens.collectors.store_buffer import DOWN_LOCK_WAIT_S, BufferedStore, store_identity

from mmlens.records import MetricSample
from mmlens.store.sqlite import Store
from tests.faults.harness import REPO, wait_for

pytestmark = pytest.mark.faults
N = 20_000


def child(db: Path, spill: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.faults.spill_child", str(db),
                             str(spill), *args], cwd=REPO, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})


def samples(db: Path) -> tuple[int, int]:
    """(rows, distinct values) of the samples table."""
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT count(*), count(DISTINCT value) FROM samples").fetchone()
    finally:
        con.close()


def test_a_left_backlog_is_written_once_across_a_kill_mid_replay(tmp_path: Path) -> None:
    db, spill = tmp_path / "s.db", tmp_path / "spill"
    spill.mkdir()
    writer = child(db, spill, "write", str(N))
    assert json.loads(writer.stdout.readline()) == {"ready": True}
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # the store is down for the writer
    writer.stdin.write("go\n")
    writer.stdin.flush()
    written = json.loads(writer.stdout.readline())
    writer.wait(30)
    lock.execute("ROLLBACK")
    lock.close()
    assert written["outages"] == 1 and written["spilled_records"] == N
    assert written.get("dropped_records", 0) == 0 and samples(db) == (0, 0)

    killed = child(db, spill, "replay")
    wait_for(lambda: samples(db)[0] > N // 10, 60, "the replay under way")
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    at_kill = samples(db)
    assert 0 < at_kill[0] < N, "the replay ended before it was killed: nothing tested"

    last = child(db, spill, "replay")
    done = json.loads(last.stdout.readline())
    last.wait(30)
    assert samples(db) == (N, N)  # 0 lost, 0 duplicates
    assert done["recovered_files"] == 1 and done["recovered_records"] == N - at_kill[0]
    assert done["backlog_records"] == 0 and list(spill.iterdir()) == []
    with contextlib.closing(Store(db)) as store:
        assert store._rows("SELECT key FROM meta WHERE key LIKE 'spill:%'") == []  # gone too
        (row,) = [h for h in store.health() if h.target == "outage"]
    assert row.instance == "replay" and row.counters["recovered_records"] == N - at_kill[0]


def test_a_living_writers_file_is_not_adopted(tmp_path: Path) -> None:
    """Two writers on one folder: the second never takes the first one's file (its lock is
    held), nor one of another store's."""
    store = Store(tmp_path / "a.db")
    store.db.execute("PRAGMA busy_timeout=100")
    lock = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    try:
        first = BufferedStore(store, tmp_path, max_memory=0, backoff=(0.0, 0.0))
        lock.execute("BEGIN EXCLUSIVE")
        for i in range(3):
            first.add_samples([MetricSample("t", "n", (), float(i), 1.0)])
        lock.execute("ROLLBACK")
        assert first.backlog == 3 and first.outage_health.counters["spilled_records"] == 2
        scope = scope_of(store_identity(store))
        assert orphans(tmp_path, scope) == []  # its writer is alive
        assert orphans(tmp_path, scope_of("elsewhere.db")) == []
        assert first.retry()  # the store answers again: written, the file removed
        assert first.backlog == 0 and list(tmp_path.glob("*.spill")) == []
        assert samples(tmp_path / "a.db") == (3, 3)
    finally:
        lock.close()
        store.close()


def test_a_frame_cut_short_ends_the_file(tmp_path: Path) -> None:
    f = SpillFile.new(tmp_path, "x")
    f.append(b"one", 1)
    f.append(b"two", 2)
    with f.path.open("ab") as raw:
        raw.write((100).to_bytes(8, "big") + (5).to_bytes(4, "big") + b"cut")
    assert [(c, fr) for _, c, fr in f.frames()] == [(1, b"one"), (2, b"two")]
    assert f.records() == 3
    f.close()
    (adopted,) = orphans(tmp_path, "x")
    assert adopted.records() == 3
    adopted.remove()
    assert not f.path.exists()


def test_a_down_store_is_retried_with_a_short_lock_wait_then_its_own(tmp_path: Path) -> None:
    """While the store is down a retry waits 0.5 s for its lock, not the store's usual wait
    (a writer stopping with a backlog spills that much sooner); back, the usual wait again."""
    store = Store(tmp_path / "a.db")
    store.lock_wait(1.5)
    lock = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    try:
        buffered = BufferedStore(store, tmp_path, max_memory=10, backoff=(0.0, 0.0))
        lock.execute("BEGIN EXCLUSIVE")
        buffered.add_samples([MetricSample("t", "n", (), 1.0, 1.0)])
        assert buffered.down_since is not None and store.lock_wait() == DOWN_LOCK_WAIT_S
        started = time.monotonic()
        assert not buffered.retry()
        assert time.monotonic() - started < 1.4  # not the store's 1.5 s
        lock.execute("ROLLBACK")
        assert buffered.retry() and store.lock_wait() == 1.5
        assert samples(tmp_path / "a.db") == (1, 1)
    finally:
        lock.close()
        store.close()
