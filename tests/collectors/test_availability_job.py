"""The availability job over a store: keyed KV events and traces in, one row per request out,
read back as records and as the aggregate columns."""

from __future__ import annotations

from mmlens.collectors.availability_job import AvailabilityJob

from mmlens.analysis.availability.aggregate import Cells, headline
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.records import BlockRemoved
from mmlens.store.open import open_store
from tests.core.test_availability import (
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
