"""What SMG's log line order proves about when requests ran: a request completed before a
line that dispatched another ended by that one's exact dispatch, however whole the seconds
of its own lines are; on recorded SMG 1.13 logs, and on the judgement of two same-length
requests sent one after the other within one second."""

from __future__ import annotations

import itertools

from mmlens.analysis.judgement.batch import JudgeState, span_of
from mmlens.analysis.judgement.order import clocks_apart, ended_by_order, exact_dispatch
from mmlens.ingest.observed import fragment, merge_all
from mmlens.ingest.observed_logs import read_lines
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store.decisions import attach
from tests.fixtures_path import CAPTURES


def logged(name: str, first_seq: int | None = 1000) -> list[RequestTrace]:
    lines = (CAPTURES / name).read_text().splitlines()
    decisions, frags = read_lines(lines, first_seq=first_seq)
    traces = merge_all(frags)
    attach(traces, decisions)
    for t in traces:
        t.router = "r"
    return traces


def test_sequential_requests_end_by_the_next_ones_dispatch() -> None:
    """SMG 1.13, one request at a time, all in one second: each one's completion line comes
    before the next one's dispatch line, so it ended by the next one's exact dispatch."""
    traces = sorted(logged("smg_1.13_observed_log.jsonl"), key=lambda t: t.sent_seq or 0)
    assert len(traces) == 5 and all(t.sent_seq is not None for t in traces)
    assert len({int(span_of(t)[0]) for t in traces}) == 1  # one whole second for all
    ended = ended_by_order(traces)
    for t, nxt in itertools.pairwise(traces):
        assert t.sent_seq < t.ended_seq < nxt.sent_seq  # type: ignore[operator]
        assert ended[t.request_id] == exact_dispatch(nxt) > exact_dispatch(t)  # type: ignore
    assert traces[-1].request_id not in ended  # nothing was sent after it
    # Without line numbers nothing is claimed.
    assert ended_by_order(logged("smg_1.13_observed_log.jsonl", None)) == {}


def test_overlapping_requests_and_other_logs_bound_nothing() -> None:
    """A stream whose completion line comes after the next request's dispatch line ran
    beside it; a request in another router's log is not ordered against it."""
    traces = {t.request_id: t for t in logged("smg_1.13_stream_end_log.jsonl")}
    stream, whole = traces["acc-029"], traces["acc-030"]
    assert whole.sent_seq < stream.ended_seq  # type: ignore[operator]
    assert ended_by_order(list(traces.values())) == {}
    seq = sorted(logged("smg_1.13_observed_log.jsonl"), key=lambda t: t.sent_seq or 0)
    seq[1].router = "other"  # the next request in another log: the one after it bounds
    assert ended_by_order(seq)[seq[0].request_id] == exact_dispatch(seq[2])


def _sent(rid: str, sent_seq: int, ended_seq: int, dispatched: float, ended_by: float,
          blocks: int = 4, overlap: int = 4, worker: str = "w1") -> RequestTrace:
    """A streamed SMG request as its log tells it: an exact dispatch, its end only to the
    whole second (its completion line's)."""
    t = fragment(rid, "router_log", float(int(dispatched)), "smg", "r")
    t.worker, t.stream, t.latency_s, t.ended_by = worker, True, 0.01, ended_by
    t.sent_seq, t.ended_seq = sent_seq, ended_seq
    t.provenance.update(worker="router_log:smg", stream="router_log:smg",
                        latency_s="router_log:smg", ended_by="router_log:smg")
    d = RoutingDecision(rid, "smg", "log:cache_trace", worker=worker, branch="event_hit",
                        overlap_blocks=overlap, request_blocks=blocks, block_size=16,
                        expanded_tokens=blocks * 16 + 6)
    d.ts = dispatched
    t.predictions = [d]
    return t


def _categories(b_stored_at: float, *, a_ended_seq: int = 12, with_c: bool = False,
                w: str = "w1") -> dict[str, str]:
    """``a`` found its prompt cached and stored nothing; ``b``, sent after ``a``'s
    completion line within the same second, computed 4 blocks at ``b_stored_at``; ``c``
    (before both, another length) stored its 2 blocks 5 ms after its dispatch."""
    state = JudgeState(horizon_s=1e9)
    state.apply_kv([(90.0, w, "stored", None, [str(i) for i in range(4)]),  # a's prompt
                    (99.0, w, "stored", None, ["c0", "c1"]),
                    (b_stored_at, w, "stored", None, [f"b{i}" for i in range(4)]),
                    (130.0, w, "stored", None, ["later"])])
    traces = [_sent("a", 10, a_ended_seq, 100.10, 101.0, worker=w),
              _sent("b", 13, 15, 100.55, 101.0, worker=w)]
    if with_c:
        traces.append(_sent("c", 5, 7, 98.995, 100.0, blocks=2, overlap=0, worker=w))
    return {v.request_id: v.category for v in state.judge(
        traces, [t.request_id for t in traces], judged_at=0.0)}


def test_one_at_a_time_same_length_requests_are_told_apart_by_line_order() -> None:
    """``a``'s whole-second end covers ``b``'s chain: without the line order each may be
    either; with it, ``a``'s window ends at ``b``'s dispatch (plus the clocks' distance)."""
    told = {"a": "hit", "b": "false_hit"}
    assert _categories(100.62) == told
    # Lines out of order (or without numbers): both readings for both.
    assert set(_categories(100.62, a_ended_seq=14).values()) == {"hit_or_false_hit"}
    # 10 ms after ``b``'s dispatch is within the clocks' assumed distance: both readings...
    assert set(_categories(100.56).values()) == {"hit_or_false_hit"}
    # ...unless a request that must have stored a chain shows the worker's clock is less
    # than 5 ms ahead of the router's.
    assert _categories(100.56, with_c=True) == {**told, "c": "cold"}
    assert set(_categories(100.552, with_c=True).values()) == {"hit_or_false_hit", "cold"}
    # A worker the router reaches on a loopback address shares the router's clock.
    local = "grpc://127.0.0.1:50051"
    assert _categories(100.552, w=local) == told
    assert set(_categories(100.552, a_ended_seq=14, w=local).values()) == {"hit_or_false_hit"}


def test_workers_on_the_routers_host_share_its_clock() -> None:
    for unit in ("grpc://127.0.0.1:50051", "http://localhost:8000", "127.0.0.1:9",
                 "http://[::1]:80/v1", "grpc://127.0.0.1:50051#1"):
        assert clocks_apart(unit) == 0.0, unit
    for unit in ("grpc://10.0.0.7:50051", "w1", "grpc://127.0.0.1.example.com:1", "7587"):
        assert clocks_apart(unit) > 0.0, unit


def _found_before_dispatch(w: str, a_stored_at: float) -> dict[str, str]:
    """``a`` computed its 4 blocks at ``a_stored_at``; ``b``, the same prompt, sent at
    100.55 while ``a`` still ran, stored nothing."""
    state = JudgeState(horizon_s=1e9)
    state.apply_kv([(a_stored_at, w, "stored", None, [str(i) for i in range(4)]),
                    (130.0, w, "stored", None, ["later"])])
    traces = [_sent("a", 10, 14, 100.50, 101.0, overlap=0, worker=w),
              _sent("b", 12, 15, 100.55, 101.0, worker=w)]
    return {v.request_id: v.category for v in state.judge(
        traces, [t.request_id for t in traces], judged_at=0.0)}


def test_a_chain_stored_before_the_exact_dispatch_was_found_on_the_routers_host() -> None:
    """An engine looks a prompt up after its dispatch: on the router's own clock, blocks
    stored before the exact dispatch were there to find (``b`` a hit, not possibly computed
    beside ``a``). Elsewhere the clocks' distance leaves both readings; so does a chain
    stored after the dispatch, on any host."""
    local = "grpc://127.0.0.1:50051"
    assert _found_before_dispatch(local, 100.549) == {"a": "cold", "b": "hit"}
    assert _found_before_dispatch("grpc://10.0.0.7:50051", 100.549)["b"] == "hit_or_false_hit"
    assert _found_before_dispatch(local, 100.551)["b"] == "hit_or_false_hit"
