"""Store outages survived (see ``harness.outage``): the disk under a SQLite store full for a
while (a real 4 MiB tmpfs, filled, then freed), a PostgreSQL server restarted mid-collect.
Nothing lost, nothing stored twice, the outage named on the store's health row."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import new_database
from tests.faults import harness as h
from tests.live_support import LOOPBACK
from tests.servers import Postgres, postgres_bin, postgres_server

pytestmark = pytest.mark.faults


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m") -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Write a file until the disk has no room left."""
    with (disk / "filler").open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)


def outage_row(t: h.Tally) -> dict:
    (row,) = [r for r in t.health if r["collector"] == "store" and r["target"] == "outage"]
    return row


def report(name: str, t: h.Tally) -> None:
    row = outage_row(t)
    c = row["counters"]
    print(f"\n{name}: published {t.published} stored {t.stored} lost {t.lost} duplicates "
          f"{t.duplicates}; outages {c.get('outages')}, retried {c.get('retried_records')}, "
          f"spilled {c.get('spilled_records', 0)}, dropped {c.get('dropped_records', 0)}, "
          f"backlog {c.get('backlog_records')}; store/outage errors {row['errors']}")


def test_a_full_disk_for_a_while_loses_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        db = disk / "s.db"
        t = h.outage(db, tmp_path, down=lambda: fill(disk),
                     up=lambda: (disk / "filler").unlink(), events=12_000, rate=4_000.0,
                     down_s=2.0, max_memory=2_000)
        report("SQLite disk full", t)
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = outage_row(t)
    c = row["counters"]
    assert c["outages"] >= 1 and row["errors"]["store_down"] >= 1
    assert c["spilled_records"] > 0  # past the memory bound the backlog went to the file
    assert c["backlog_records"] == 0 and c.get("dropped_records", 0) == 0
    assert c["retried_records"] >= c["spilled_records"]


def stop_server(pg: Postgres) -> Callable[[], object]:
    """Stop ``pg`` (fast shutdown: every connection cut); returns what starts it again on
    the same port, data and socket directory."""
    pg_ctl = str(postgres_bin() / "pg_ctl")  # type: ignore[operator]
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*run_as, pg_ctl, "-D", str(pg.datadir), "-m", "fast", "-w", "stop"],
                   check=True, capture_output=True)
    root = pg.datadir.parent
    opts = f"-p {pg.port} -c listen_addresses={LOOPBACK} -k {root} -c fsync=off"
    return lambda: subprocess.run(
        [*run_as, pg_ctl, "-D", str(pg.datadir), "-o", opts, "-l", str(root / "log"), "-w",
         "start"], check=True, capture_output=True)


def test_postgresql_restarted_mid_collect_loses_nothing(tmp_path: Path) -> None:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL not installed")
    with postgres_server() as pg:
        url = new_database(pg)
        starts: list = []
        t = h.outage(url, tmp_path, down=lambda: starts.append(stop_server(pg)),
                     up=lambda: starts.pop()(), events=12_000, rate=4_000.0, down_s=2.0)
        report("PostgreSQL restart", t)
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = outage_row(t)
    assert row["counters"]["outages"] >= 1 and row["errors"]["store_down"] >= 1
    assert row["counters"]["backlog_records"] == 0


def test_a_collector_killed_with_a_spilled_backlog_is_followed_by_one_that_writes_it(
        tmp_path: Path) -> None:
    """PostgreSQL stopped, 12,000 events streamed, ``mmlens collect`` (1,000 records in
    memory) killed with SIGKILL, the server started again, a new collector on the same spill
    folder: the worker's replay has only the last quarter, the spill file the rest."""
    if postgres_bin() is None:
        pytest.skip("PostgreSQL not installed")
    with postgres_server() as pg:
        url = new_database(pg)
        starts: list = []
        t = h.kill9_with_backlog(url, tmp_path, down=lambda: starts.append(stop_server(pg)),
                                 up=lambda: starts.pop()())
        rows = [r for r in t.health if r["collector"] == "store" and r["target"] == "outage"]
    print(f"\nkill -9 with a spilled backlog: published {t.published} stored {t.stored} lost "
          f"{t.lost} duplicates {t.duplicates}; "
          f"recovered {[r['counters'].get('recovered_records') for r in rows]}")
    assert (t.lost, t.duplicates) == (0, 0)
    (after,) = [r for r in rows if r["counters"].get("recovered_files")]
    c = after["counters"]
    # The killed one's file: at least what the worker's replay no longer had.
    assert c["recovered_files"] == 1 and c["recovered_records"] >= t.published * 3 // 4
    assert c["backlog_records"] == 0 and c.get("dropped_records", 0) == 0
