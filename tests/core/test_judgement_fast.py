"""The fast ways through the judgement store what the plain ways would: one dispatch's
prediction read without merging, and the verdict job over a store (KV rows and decisions
read back, verdicts written in batches) judging a generated busy cluster exactly as one pass
over all its requests at once."""

from __future__ import annotations

import dataclasses
import itertools
import json

from mmlens.collectors.verdict_job import VerdictJob

from mmlens.analysis.judgement.attempts import _merged, _one, attempts
from mmlens.analysis.judgement.batch import JudgeState, span_of
from mmlens.records import RoutingDecision, SpillGate
from mmlens.store.codec import verdict_body
from mmlens.store.open import open_store
from tests.busy_workers import workload


def test_one_dispatch_reads_as_the_merge_of_one_decision() -> None:
    gates = ([], [SpillGate("w2", spill=False)], [SpillGate(None, spill=True),
                                                   SpillGate("w2", spill=True)])
    for (branch, overlap, credited, bs, gate, warnings, attempt) in itertools.product(
            ("event_hit", "event_spill", None), (None, 0, 7), (None, 40), (None, 0, 16, 32),
            gates, ([], ["text-prefix fallback"]), (None, 1)):
        d = RoutingDecision("r", "smg", "router_log:smg", worker="w1", branch=branch,
                            overlap_blocks=overlap, request_blocks=9, block_size=bs,
                            expanded_tokens=None if bs else 300, warnings=warnings,
                            gates=gate, credited_units=credited, attempt=attempt)
        assert _one(d, attempt) == _merged([d], attempt)


def test_the_job_on_a_store_stores_the_verdicts_of_one_pass_over_all(store_db: str) -> None:
    w = workload(960, 2, seed=5, t0=1_700_000_000.0)
    state = JudgeState(horizon_s=1e9)
    state.apply_kv(w.rows)
    expected = {v.request_id: v for v in state.judge(
        w.traces, [t.request_id for t in w.traces], judged_at=0.0)}
    categories = {v.category for v in expected.values()}
    assert {"hit", "false_hit"} <= categories and categories & {"hit_or_false_hit",
                                                                 "hit_or_cold"}
    store = w.stored(open_store(store_db))
    job = VerdictJob(store)
    last = max(span_of(t)[1] for t in w.traces)
    now = w.traces[0].ts
    while now < last + job.settle_s + 10.0:
        job.run(now)
        now += 5.0
    stored = store.verdicts_for(list(expected))
    assert set(stored) == set(expected)
    for rid, v in expected.items():
        got = dataclasses.replace(stored[rid], judged_at=0.0)
        assert got == v, rid
    assert all(attempts(t)[0].attempt is None for t in w.traces)
    # The stored body is the JSON the verdict's ``as_json`` gives.
    for v in list(expected.values())[:200]:
        assert json.loads(verdict_body(v)) == json.loads(json.dumps(v.as_json()))
