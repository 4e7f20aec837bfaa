"""The verdict job keeps its window decoded between runs and reads only what the store
gained since: on a busy store written as the traffic happens, it stores exactly the
verdicts of one pass over every request at once, and so does a job restarted midway (empty
memory); a request rewritten in place before it is judged (a merge) is judged as stored."""

from __future__ import annotations

import dataclasses

from mmlens.collectors.verdict_job import VerdictJob

from mmlens.analysis.judgement.attribution import SLACK_S
from mmlens.analysis.judgement.batch import JudgeState, span_of
from mmlens.records import BlockStored
from mmlens.store.open import open_store
from tests.busy_workers import Workload, workload

TICK_S = 5.0


def _one_pass(w: Workload) -> dict:
    state = JudgeState(horizon_s=1e9)
    state.apply_kv(w.rows)
    return {v.request_id: v for v in state.judge(
        w.traces, [t.request_id for t in w.traces], judged_at=0.0)}


def _traffic(store_db: str, w: Workload, restart_at: float | None) -> dict:
    """Write the traffic as it happens (a trace and its decision at its end, KV events at
    their time), run the job each tick; a fresh job from ``restart_at`` on."""
    store = open_store(store_db)
    traces, decisions = w.logged()
    by_id = {d.request_id: d for d in decisions}
    feed = sorted([(span_of(t)[1], 0, t) for t in traces] + [(e.ts, 1, e) for e in w.events],
                  key=lambda r: r[0])
    job = VerdictJob(store)
    last = max(span_of(t)[1] for t in w.traces)
    now, at = w.traces[0].ts + TICK_S, 0
    while now < last + job.settle_s + 2 * TICK_S:
        batch = []
        while at < len(feed) and feed[at][0] <= now:
            batch.append(feed[at])
            at += 1
        store.add_kv_events([r for _, kind, r in batch if kind == 1])
        new = [r for _, kind, r in batch if kind == 0]
        store.add_decisions([by_id[t.request_id] for t in new])
        store.add_traces(new)
        if restart_at is not None and now >= restart_at:
            job, restart_at = VerdictJob(store), None
        job.run(now)
        now += TICK_S
    out = store.verdicts_for([t.request_id for t in w.traces])
    store.close()
    return out


def test_the_job_reading_only_what_is_new_stores_the_verdicts_of_one_pass(
        store_db: str) -> None:
    w = workload(480, 2, seed=9, t0=1_700_000_000.0, wave_s=0.8)  # never idle
    expected = _one_pass(w)
    assert {"hit", "false_hit"} <= {v.category for v in expected.values()}
    middle = w.traces[len(w.traces) // 2].ts
    for restart_at in (None, middle):
        stored = _traffic(store_db, w, restart_at)
        assert set(stored) == set(expected)
        for rid, v in expected.items():
            assert dataclasses.replace(stored[rid], judged_at=0.0) == v, (restart_at, rid)
        store = open_store(store_db)
        store._exec("DELETE FROM verdicts")  # the next run starts from an unjudged store
        store.close()


def test_a_request_rewritten_before_it_is_judged_is_judged_as_stored_now(
        store_db: str) -> None:
    store = open_store(store_db)
    w = workload(32, 1, seed=4, t0=1000.0)
    traces, decisions = w.logged()
    store.add_decisions(decisions)
    store.add_kv_events(w.events)
    first = traces[0]
    store.add_traces([first])
    job = VerdictJob(store, settle_s=30.0)
    assert job.run(first.ts + 1.0) == []  # read into the window, not settled yet
    # The engine's own count arrives for it (the tap, a worker span): merged into its row.
    told = dataclasses.replace(first, cached_tokens=48, origin="observed", predictions=[],
                               provenance={**first.provenance, "cached_tokens": "tap"},
                               sources=["tap"])
    store.add_traces([told])
    (v,) = [v for v in job.run(first.ts + 60.0) if v.request_id == first.request_id]
    assert (v.realized_blocks, v.evidence["realized_source"]) == (3, "tap")
    store.close()


def test_late_kv_rows_rejudge_only_the_requests_that_ran_then_on_that_worker(
        store_db: str) -> None:
    w = workload(320, 2, seed=6, t0=1_700_000_000.0, wave_s=2.0)
    store = w.stored(open_store(store_db))
    job = VerdictJob(store)
    last = max(span_of(t)[1] for t in w.traces)
    job.run(last + job.settle_s + 1.0)
    assert job.judged == len(w.traces)
    late_at = w.traces[100]
    unit, at = late_at.worker, span_of(late_at)[0] + 0.25
    ran = {t.request_id for t in w.traces if t.worker == unit
           and span_of(t)[0] - SLACK_S <= at <= span_of(t)[1] + SLACK_S}
    seq = max(e.seq for e in w.events if e.worker == unit) + 1
    store.add_kv_events([BlockStored(unit, 0, seq, at, [10**12 + 1], None, list(range(16)),
                                     16)])
    again = job.run(last + job.settle_s + 2.0)
    assert {v.request_id for v in again} == ran and job.rejudged == len(ran)
    assert 0 < len(ran) <= 16 < len(w.traces)  # a wave at most: no rescan of the store
    store.close()
