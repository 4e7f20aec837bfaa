"""Fault injection against the router-log follower: one line the store cannot hold (a lone
surrogate from a ``\\udc80`` escape inside SMG's cache-trace evidence) among 300 is set aside
alone and named; the other 299 decisions are stored, also after a restart of the collector."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, RouterTarget
from mmlens.store.reader import StoreReader
from mmlens.store.sqlite import Store
from tests.faults.harness import collect_process, wait_for
from tests.faults.test_store_outages import fill, small_disk
from tests.fixtures_path import capture

pytestmark = pytest.mark.faults
RID = "mmlens-04299d8794744c2f"


def smg_lines(n: int, bad_at: int) -> list[str]:
    """``n`` recorded SMG 1.13 cache-trace lines, one request id each; line ``bad_at`` has a
    ``\\udc80`` escape in its evidence's policy."""
    base = capture("smg_1.13_cache_trace_log.jsonl").splitlines()[0]
    assert RID in base and '\\"policy\\":\\"cache_aware\\"' in base
    lines = [base.replace(RID, f"mmlens-{i:016x}") for i in range(n)]
    lines[bad_at] = lines[bad_at].replace('\\"policy\\":\\"cache_aware\\"',
                                          '\\"policy\\":\\"cache\\\\udc80\\"')
    return lines


def collect(log: Path, db: Path, chunks: list[list[str]]) -> CollectorRunner:
    cfg = Config(routers=[RouterTarget("smg", "smg", "http://127.0.0.1:9", log_file=str(log),
                                       discover_workers=False)], retention_s=1e10)
    store = Store(db)
    runner = CollectorRunner(cfg, store, http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(503))))
    try:
        runner.setup()
        for chunk in chunks:
            with log.open("a") as f:
                f.write("".join(line + "\n" for line in chunk))
            runner.tick()
        runner.flush()
    finally:
        runner.close()
        store.close()
    return runner


def stored_decisions(db: Path) -> list[str]:
    reader = StoreReader(db)
    try:
        return reader._locked(lambda s: [r for (r,) in s._rows(
            "SELECT request_id FROM decisions")])
    finally:
        reader.close()


def test_a_line_the_store_cannot_hold_is_set_aside_alone(tmp_path: Path) -> None:
    log, db = tmp_path / "smg.log", tmp_path / "m.db"
    log.write_text("")
    lines = smg_lines(300, bad_at=150)
    runner = collect(log, db, [lines[:100], lines[100:200], lines[200:]])
    ids = stored_decisions(db)
    assert len(ids) == len(set(ids)) == 299 and f"mmlens-{150:016x}" not in ids
    assert runner.store_health.errors == {"unwritable_decision": 1}
    reader = StoreReader(db)
    try:
        named = reader.quarantined()
        (row,) = [h for h in reader.health() if (h.collector, h.target) == ("store", "writes")]
    finally:
        reader.close()
    print(f"\nSMG log \\udc80: published 300 decisions, stored {len(ids)}, "
          f"lost {299 - len(set(ids))}, duplicates {len(ids) - len(set(ids))}, quarantined "
          f"{len(named)}; store/writes errors {row.errors}, quarantined[0] {named[0]}")
    assert row.errors == {"unwritable_decision": 1}
    assert [q["where"] for q in named] == [f"request 'mmlens-{150:016x}'"]
    assert "surrogates not allowed" in named[0]["detail"]
    # A restarted collector resumes after what was read: nothing again, nothing missing.
    collect(log, db, [])
    assert sorted(stored_decisions(db)) == sorted(ids)


def _decision_ids(db: Path) -> list[str]:
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return [r for (r,) in con.execute("SELECT request_id FROM decisions")]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        con.close()


def test_kill_9_in_the_middle_of_a_backlog_loses_no_decision(tmp_path: Path) -> None:
    """`mmlens collect` killed with SIGKILL while it reads a 60 MB log several 8 MiB reads at
    a time, then started again on the same store: every decision is stored; what the dead one
    stored after its last saved position is read again (at most one read's lines)."""
    n = 20_000
    log, db, config = tmp_path / "smg.log", tmp_path / "m.db", tmp_path / "m.toml"
    lines = smg_lines(n + 1, bad_at=n)[:n]  # one decision each, every request id its own
    log.write_text("".join(line + "\n" for line in lines))
    per_read = (8 << 20) // len(lines[0].encode())
    config.write_text(f'[store]\nretention_s = 1e10\n[[router]]\nname = "smg"\nkind = "smg"\n'
                      f'url = "http://127.0.0.1:9"\ndiscover_workers = false\n'
                      f'log_file = "{log}"\n')
    first = collect_process(config, db)
    try:
        wait_for(lambda: _decision_ids(db), 60, "the first decisions stored")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    at_kill = len(_decision_ids(db))
    assert 0 < at_kill < n  # killed in the middle of the backlog
    second = collect_process(config, db)
    try:
        wait_for(lambda: len(set(_decision_ids(db))) >= n, 120, "every decision stored")
    finally:
        second.terminate()
        second.wait(30)
    ids = _decision_ids(db)
    again = len(ids) - len(set(ids))
    print(f"\nkill -9 mid-backlog: published {n} decisions, {at_kill} stored at the kill, "
          f"{len(set(ids))} stored in the end, lost {n - len(set(ids))}, read again {again} "
          f"(one read holds {per_read} lines)")
    assert len(set(ids)) == n and set(ids) == {f"mmlens-{i:016x}" for i in range(n)}
    assert again <= per_read


def test_a_store_that_is_down_leaves_the_backlog_in_the_log(tmp_path: Path) -> None:
    """A full disk under the store: a tick reads one round of the log, not the whole backlog
    into memory and the spill file; once the store is back the rest is read, every decision
    stored once."""
    with small_disk(tmp_path / "disk", "64m") as disk:  # room for the 2,000 when back
        log, db = tmp_path / "smg.log", disk / "s.db"
        lines = smg_lines(2001, bad_at=2000)[:2000]
        log.write_text("".join(line + "\n" for line in lines))
        cfg = Config(routers=[RouterTarget("smg", "smg", "http://127.0.0.1:9",
                                           log_file=str(log), discover_workers=False)],
                     retention_s=1e10)
        runner = CollectorRunner(cfg, Store(db), http=httpx.Client(
            transport=httpx.MockTransport(lambda request: httpx.Response(503))))
        try:
            runner.setup()
            follower = runner.followers["smg"]
            follower.max_read = 64 << 10  # ~22 lines a read: the log is ~90 reads
            fill(disk)
            runner._read_logs(time.monotonic() + 30)
            assert runner.store.down_since is not None
            h = runner.log_health["smg"]
            assert 0 < h.counters["lines"] <= 2 * (64 << 10) // len(lines[0]) + 1
            assert h.counters["backlog_bytes"] > 0.9 * log.stat().st_size
            (disk / "filler").unlink()
            wait_for(runner.store.retry, 30, "the store back")
            runner._read_logs(time.monotonic() + 30)
            assert h.counters["lines"] == 2000 and h.counters["backlog_bytes"] == 0
        finally:
            runner.close()
            runner.store.close()
        ids = stored_decisions(db)
    print(f"\nSMG log, store down: published 2000 decisions, stored {len(set(ids))}, "
          f"duplicates {len(ids) - len(set(ids))}")
    assert len(ids) == len(set(ids)) == 2000
