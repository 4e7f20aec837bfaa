"""Judging a few requests against the minutes around them reads them as judging every
request at once does: attribution leaves out the requests whose runs do not overlap theirs
(directly or through others), on idle-gapped and never-idle busy workers alike."""

from __future__ import annotations

import random

from mmlens.analysis.judgement.attribution import SLACK_S, Served, _overlapping, attribute
from mmlens.analysis.judgement.batch import JudgeState, span_of, unit_of
from tests.busy_workers import workload


def test_attribution_of_some_requests_reads_them_as_attribution_of_all() -> None:
    rng = random.Random(3)
    for wave_s in (2.0, 0.6):  # idle gaps between waves; waves overlapping
        w = workload(480, 2, seed=11, t0=1_700_000_000.0, wave_s=wave_s)
        state = JudgeState(horizon_s=1e9)
        state.apply_kv(w.rows)
        everyone = {v.request_id: v for v in state.judge(
            w.traces, [t.request_id for t in w.traces], judged_at=0.0)}
        for _ in range(6):
            start = rng.randrange(len(w.traces) - 40)
            some = [t.request_id for t in w.traces[start:start + rng.randrange(1, 40)]]
            got = state.judge(w.traces, some, judged_at=0.0)
            assert [v.request_id for v in got] == some
            for v in got:
                assert v == everyone[v.request_id], (wave_s, v.request_id)
        assert {v.category for v in everyone.values()} >= {"hit", "false_hit"}


def test_only_the_runs_linked_to_the_wanted_ones_are_kept() -> None:
    w = workload(320, 1, seed=2, t0=100.0, wave_s=2.0)
    state = JudgeState(horizon_s=1e9)
    state.apply_kv(w.rows)
    served = [Served(t.request_id, *span_of(t), t.prompt_tokens, 16) for t in w.traces]
    first_wave = {r.request_id for r in served if r.request_id.startswith("0-0-")}
    kept = _overlapping(served, ["0-0-3"], SLACK_S)
    assert {r.request_id for r in kept} == first_wave  # the next wave starts 1 s after
    assert [r.request_id for r in kept] == [r.request_id for r in served
                                            if r.request_id in first_wave]
    # Two runs that only touch (one's end, slack included, is the other's start) are linked.
    a = Served("a", 0.0, 1.0, 40, 16)
    b = Served("b", 1.0 + 2 * SLACK_S, 2.0, 40, 16)
    c = Served("c", 2.0 + 2 * SLACK_S + 1e-6, 3.0, 40, 16)
    assert [r.request_id for r in _overlapping([c, b, a], {"a"}, SLACK_S)] == ["b", "a"]
    # The readings agree with attribution over all of them.
    unit = unit_of(w.traces[0])
    assert attribute(state.chains[unit], kept, unit, only={"0-0-3"}) == {
        k: v for k, v in attribute(state.chains[unit], served, unit).items() if k == "0-0-3"}
