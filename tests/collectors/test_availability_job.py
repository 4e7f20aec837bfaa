"""The availability job over a store: keyed KV events and traces in, one row per request out,
read back as records and as the aggregate columns."""

from __future__ import annotations

import pytest
from mmlens.collectors.availability_job import AvailabilityJob
from mmlens.collectors.runner import CollectorRunner

from mmlens.analysis.availability.aggregate import Cells, cell_sums, headline
from mmlens.config import Config
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.records import BlockRemoved, BlockStored
from mmlens.store.availability import KeyedRow
from mmlens.store.open import open_store
from mmlens.store.tail import IdTail
from tests.conftest import new_database
from tests.core.test_availability import (
    BLUE,
    FULL,
    RED,
    engine_stored,
    laid_out,
    smg_decision,
    trace,
)


def test_job_evaluates_settled_requests_once(store_db: str) -> None:
    store = open_store(store_db)
    layout, summary, _ = laid_out(RED)
    stored = engine_stored(layout, "w1", 100.2, "engine-red")
    index = ResidentIndex()
    index.apply([stored])
    store.add_kv_events([stored])
    store.add_kv_events([stored])  # a batch stored twice is kept once
    a1 = trace("a1", summary, 100.0, "w1", 0)
    a2 = trace("a2", summary, 101.0, "w2", 0, decisions=[
        smg_decision("a2", "w2", None, spill_from="w1", branch="spill")])
    store.add_traces([a1, a2])
    job = AvailabilityJob(store, settle_s=5.0)
    assert job.run(now=101.2) == []  # nothing has settled yet
    done = {a.request_id: a for a in job.run(now=110.0)}
    assert set(done) == {"a1", "a2"}
    assert done["a2"].available == {"w1": FULL} and done["a2"].causes == {"load_spill": 96}
    assert job.run(now=111.0) == []  # evaluated once
    # Eviction rows carry the keys the index knew for the removed blocks.
    removed = BlockRemoved("w1", 0, 2, 120.0, stored.block_hashes)
    index.apply([removed])
    store.add_kv_events([removed])
    a3 = trace("a3", summary, 121.0, "w2", 0)
    store.add_traces([a3])
    assert job.run(now=130.0)[0].available == {}
    rows = store.availability_rows(0.0)
    assert {r.request_id for r in rows} == {"a1", "a2", "a3"}
    h = headline(Cells.from_rows(store.cells(0.0)))
    assert h.requests == 3 and h.avoidable_tokens == 96 and h.causes == {"load_spill": 96}
    store.close()


def test_a_request_evaluated_before_its_kv_events_is_evaluated_again_when_they_land(
        store_db: str) -> None:
    """A flush evaluates at once; the worker's events naming the image land after: the row is
    replaced by one with the image named, and the cells count the request once."""
    store = open_store(store_db)
    layout, summary, _ = laid_out(RED)
    store.add_traces([trace("a1", summary, 100.0, "w1", 0)])
    job = AvailabilityJob(store)
    first = job.run(now=100.6, settle_s=0.0)
    assert [a.identities_resolved for a in first] == [False]
    assert job.run(now=101.0, settle_s=0.0) == [] and job.revised == 0  # no new events
    late = engine_stored(layout, "w1", 100.2, "engine-red")
    ResidentIndex().apply([late])  # the keys the collector's index gives it at ingest
    store.add_kv_events([late])
    assert job.run(now=101.5, settle_s=0.0) == []  # nothing new to evaluate...
    assert job.revised == 1 and job.unresolved == {}  # ...but a1 again, now named
    (row,) = store.availability_rows(0.0)
    assert row.request_id == "a1" and row.identities_resolved
    assert row.to_json() != first[0].to_json()
    stored_cells = {(t, r, m, w): s for t, r, m, w, s in store.cells(0.0)}
    assert stored_cells == cell_sums([row])  # the old row's sums taken out, the new one's in
    store.close()


def test_a_request_whose_window_holds_a_later_requests_image_block_is_named(
        store_db: str) -> None:
    """vLLM stores a prompt's blocks when it allocates them: B, started on w1 while A ran,
    stored its blue block inside A's service, so A's window holds two image names. B's
    window holds only its own; once B is named, A's own block is the one left."""
    store = open_store(store_db)
    red, red_summary, _ = laid_out(RED)
    blue, blue_summary, _ = laid_out(BLUE)
    events = [engine_stored(red, "w1", 100.02, "engine-red"),
              engine_stored(blue, "w1", 100.32, "engine-blue")]
    ResidentIndex().apply(events)
    store.add_kv_events(events)
    store.add_traces([trace("a", red_summary, 100.0, "w1", 0),
                      trace("b", blue_summary, 100.3, "w1", 0)])
    job = AvailabilityJob(store)
    assert {a.request_id for a in job.run(now=101.0, settle_s=0.0)} == {"a", "b"}
    assert job.unresolved == {} and job.revised == 1
    assert all(r.identities_resolved for r in store.availability_rows(0.0))
    assert sorted(job.tracker.identities.aliases.values()) == [["engine-blue"], ["engine-red"]]
    store.close()


@pytest.mark.parametrize("late_events", [True, False])
def test_an_unresolved_request_is_given_up_after_the_lookback(store_db: str,
                                                              late_events: bool) -> None:
    """Also where no KV events come at all (a router-only deployment names no image): what
    the job holds stays bounded."""
    store = open_store(store_db)
    layout, summary, _ = laid_out(RED)
    store.add_traces([trace("a1", summary, 100.0, "w1", 0)])
    job = AvailabilityJob(store, lookback_s=30.0)
    job.run(now=100.6, settle_s=0.0)
    assert set(job.unresolved) == {"a1"}
    if late_events:
        late = engine_stored(layout, "w1", 100.2, "engine-red")
        ResidentIndex().apply([late])
        store.add_kv_events([late])
    job.run(now=200.5, settle_s=0.0)
    assert job.unresolved == {} and job.revised == 0
    assert [r.identities_resolved for r in store.availability_rows(0.0)] == [False]
    store.close()


def _keyed(worker: str, seq: int, key: int) -> BlockStored:
    return BlockStored(worker, 0, seq, 1000.0 + seq, [key], None, [1] * 16, 16, keys=[key])


def test_a_row_committed_after_higher_ids_were_read_is_applied_once(postgres, monkeypatch,
                                                                    ) -> None:
    """PostgreSQL hands out ids at INSERT and transactions commit in another order: shard A
    holds id n uncommitted while shard B commits n+1…; the lead reads those, then A commits.
    A's row is applied once, and the lead's health counts it."""
    db = new_database(postgres)
    a, b, reader = open_store(db), open_store(db), open_store(db)
    a.add_kv_events([_keyed("wa", 0, 10)])  # each writer's partition exists before the race
    b.add_kv_events([_keyed("wb", 0, 20)])
    applied: list[int] = []
    read = reader.kv_keyed_tail

    def counted(tail: IdTail) -> list[KeyedRow]:
        rows = read(tail)
        applied.extend(k for r in rows for k in r.keys)
        return rows

    monkeypatch.setattr(reader, "kv_keyed_tail", counted)
    runner = CollectorRunner(Config(), reader)
    runner._evaluate_availability(2000.0)
    with a._tx():  # shard A's batch: the lower id, not committed yet
        a.add_kv_events([_keyed("wa", 1, 11)])
        b.add_kv_events([_keyed("wb", i, 20 + i) for i in range(1, 4)])
        runner._evaluate_availability(2000.0)
        assert sorted(applied) == [10, 20, 21, 22, 23]  # read past A's id
    ids = dict(reader._rows(f"SELECT seq, {reader.key} FROM kv_events WHERE worker = 'wa'"))
    assert ids[1] < max(i for (i,) in reader._rows(f"SELECT {reader.key} FROM kv_events"))
    runner._evaluate_availability(2000.0)
    runner._evaluate_availability(2000.0)
    assert sorted(applied) == [10, 11, 20, 21, 22, 23]  # A's late row once, nothing twice
    units = runner.availability.tracker.index.units
    assert units["wa"] == {10, 11} and units["wb"] == {20, 21, 22, 23}
    assert runner.availability_health.counters["late_kv_rows"] == 1
    runner.http.close()
    for s in (a, b, reader):
        s.close()
