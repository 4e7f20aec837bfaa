"""``mmlens tap`` through a store outage, killed: the store locked, 40 requests relayed (each
answered 200), the tap killed with SIGKILL; its recorder process sees the proxy gone and
spills what it held in memory within seconds, whatever it was doing (here: waiting out the
store's lock); the store back, a new tap on the same spill folder writes
all of it. Published / stored / lost / duplicates counted from the store's rows."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import REPO, health_rows, spilled, wait_for
from tests.live_support import free_port
from tests.observed.tap_support import Served, odd_app

pytestmark = pytest.mark.faults
N = 40
SPILL_WITHIN_S = 8.0


def tap(port: int, upstream: str, db: Path, spill: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "mmlens", "tap", "--listen",
                             f"127.0.0.1:{port}", "--upstream", upstream, "--db", str(db),
                             "--spill-dir", str(spill), "--buffer-records", "5"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rows(db: Path) -> tuple[int, int]:
    """(trace rows, distinct request ids) of the requests sent (the probes left out)."""
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT count(*), count(DISTINCT request_id) FROM traces "
                           "WHERE request_id LIKE 'r%'").fetchone()
    finally:
        con.close()


def recovered(db: Path) -> int:
    """What the taps' outage rows (one per process) say they took over from one that died."""
    return sum(r["counters"].get("recovered_records", 0) for r in health_rows(db)
               if r["target"] == "outage" and r["instance"].startswith("tap "))


def serving(url: str, rid: str) -> bool:
    try:
        return httpx.post(url + "/v1/chat/completions", json={"model": "m"}, timeout=2,
                          headers={"x-request-id": rid}).status_code == 200
    except httpx.HTTPError:
        return False


def stored(db: Path, rid: str) -> bool:
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT 1 FROM traces WHERE request_id = ?", (rid,)).fetchone() \
            is not None
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def test_a_tap_killed_with_a_backlog_is_followed_by_one_that_writes_it(tmp_path: Path,
                                                                      ) -> None:
    router = Served(odd_app(), free_port())
    db, spill = tmp_path / "tap.db", tmp_path / "spill"
    spill.mkdir()
    port = free_port()
    proc = tap(port, router.url, db, spill)
    url = f"http://127.0.0.1:{port}"
    lock = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        wait_for(lambda: serving(url, "probe-1"), 30, "the tap serving")
        wait_for(lambda: stored(db, "probe-1"), 30, "the tap recording")
        lock.execute("BEGIN EXCLUSIVE")  # the store is down for the tap
        locked = time.monotonic()
        with httpx.Client() as c:
            for i in range(N):
                r = c.post(url + "/v1/chat/completions", json={"model": "m"},
                           headers={"x-request-id": f"r{i}"})
                assert r.status_code == 200
        # Killed once the recorder's first write has waited out the store's lock wait (5 s):
        # every exchange has long left the proxy by then (one still in the proxy when it is
        # killed is lost with it: the last one was, now and then, when it was killed at once).
        time.sleep(max(0.0, locked + 6.0 - time.monotonic()))
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(10)
        # The recorder is in a retry's lock wait (0.5 s), its back-off, or (started late on a
        # loaded machine) still in its first write when its proxy dies: it stops retrying and
        # spills what it holds as soon as that call returns.
        wait_for(lambda: spilled(spill) == N, SPILL_WITHIN_S, "the recorder spilled what it held")
        spill_s = time.monotonic() - killed
        lock.execute("ROLLBACK")
        assert rows(db) == (0, 0)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = tap(port, router.url, db, spill)
        wait_for(lambda: rows(db)[1] == N, 60, "the left backlog written")
        wait_for(lambda: not list(spill.glob("*.spill")), 30, "the spill file removed")
        wait_for(lambda: recovered(db) == N, 10, "the outage row written")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        lock.close()
        router.stop()
    got = rows(db)
    print(f"\ntap killed with a backlog: published {N} stored {got[1]} lost {N - got[1]} "
          f"duplicates {got[0] - got[1]}; spilled {spill_s:.1f} s after the kill")
    assert got == (N, N)
