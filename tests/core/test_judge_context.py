"""Judging against a context kept between calls (``JudgeState.judge_context``, changed
request by request as the verdict job's window is) gives the verdicts of ``judge`` over the
same requests listed whole, on random windows of busy workers: requests put, put again
(a fresh decode) and dropped between calls, workers on the router's host or not, log line
order and exact dispatches known or not, image identities in requests and KV events."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.analysis.judgement.attribution import SLACK_S, _overlapping
from mmlens.analysis.judgement.batch import Context, JudgeState, span_of
from mmlens.records import ImageInfo, RequestTrace
from tests.busy_workers import workload


def _variant(data: st.DataObject) -> tuple[list[RequestTrace], list[tuple]]:
    w = workload(data.draw(st.sampled_from((64, 128))), data.draw(st.integers(1, 2)),
                 seed=data.draw(st.integers(0, 10**6)), t0=1000.0,
                 wave_s=data.draw(st.sampled_from((2.0, 0.6))), num_blocks=20_000)
    traces, rows = list(w.traces), [tuple(r) for r in w.rows]
    if data.draw(st.booleans(), "remote workers"):  # clocks apart: the order's bound
        rename = {u: f"grpc://10.0.0.{i}:50051" for i, u in enumerate(
            sorted({t.worker for t in traces if t.worker}))}
        traces = [dataclasses.replace(t, worker=rename[t.worker]) for t in traces]
        rows = [(r[0], rename[r[1]], *r[2:]) for r in rows]
    if data.draw(st.booleans(), "log order"):
        lines = sorted([(span_of(t)[0], 0, i) for i, t in enumerate(traces)]
                       + [(span_of(t)[1], 1, i) for i, t in enumerate(traces)])
        seq: dict[tuple[int, int], int] = {(k, i): n for n, (_, k, i) in enumerate(lines)}
        exact = data.draw(st.sets(st.integers(0, len(traces) - 1)), "exact dispatches")
        traces = [dataclasses.replace(
            t, sent_seq=seq[0, i], ended_seq=seq[1, i], predictions=[
                dataclasses.replace(p, source="smg:cache_trace") if i in exact else p
                for p in t.predictions]) for i, t in enumerate(traces)]
    if data.draw(st.booleans(), "images"):
        told = data.draw(st.sets(st.integers(0, len(traces) - 1)), "told")
        traces = [dataclasses.replace(t, images=[ImageInfo("data", identities={
            "sha": f"{i % 3:016x}"})]) if i in told else t for i, t in enumerate(traces)]
        marked = data.draw(st.sets(st.integers(0, len(rows) - 1)), "rows with images")
        rows = [(*r, [f"{i % 4:016x}"]) if i in marked else r for i, r in enumerate(rows)]
    return traces, rows


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_context_kept_between_calls_judges_as_the_whole_list(data: st.DataObject) -> None:
    traces, rows = _variant(data)
    plain, kept = JudgeState(horizon_s=1e9), JudgeState(horizon_s=1e9)
    plain.apply_kv(rows)
    kept.apply_kv(rows)
    ctx = Context()
    window: dict[int, RequestTrace] = {}
    for _ in range(data.draw(st.integers(1, 4), "calls")):
        lo = data.draw(st.integers(0, len(traces) - 1))
        for row in range(lo, min(len(traces), lo + data.draw(st.integers(1, 64)))):
            window[row] = traces[row]
            ctx.put(row, traces[row])
        for row in data.draw(st.sets(st.sampled_from(sorted(window)), max_size=8), "again"):
            window[row] = dataclasses.replace(window[row])  # a fresh decode of its row
            ctx.put(row, window[row])
        for row in data.draw(st.sets(st.sampled_from(sorted(window)), max_size=8), "drop"):
            del window[row]
            ctx.drop(row)
        if not window:
            continue
        todo = [window[r].request_id for r in data.draw(
            st.lists(st.sampled_from(sorted(window)), min_size=1, max_size=24), "todo")]
        listed = [window[r] for r in sorted(window, key=lambda r: (window[r].ts, r))]
        expected = plain.judge(listed, todo, judged_at=0.0)
        assert kept.judge_context(ctx, todo, judged_at=0.0) == expected
        # Each unit's runs near the judged ones are those attribution keeps of all of them.
        for runs in ctx.runs.values():
            at = [e.key for r in todo if (e := ctx.entry(r)) is not None]
            assert runs.near(at, SLACK_S) == _overlapping(runs.everyone(), todo, SLACK_S)
