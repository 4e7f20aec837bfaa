"""Fault injection against the router-log follower: one line the store cannot hold (a lone
surrogate from a ``\\udc80`` escape inside SMG's cache-trace evidence) among 300 is set aside
alone and named; the other 299 decisions are stored, also after a restart of the collector."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, RouterTarget
from mmlens.store.reader import StoreReader
from mmlens.store.sqlite import Store
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
