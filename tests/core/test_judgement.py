"""The one judgement: every category from the evidence it needs, the misreads the issue
found (a spill gate on the other worker, SMG's first-sight branch, failover), and requests
judged against the ones before them (layouts) and against KV removals."""

from __future__ import annotations

from mmlens.analysis.judgement import Evidence, Realized, judge
from mmlens.analysis.judgement.batch import Context, JudgeState
from mmlens.records import (
    ExpectedLayout,
    LayoutImage,
    LayoutSpan,
    RequestTrace,
    RoutingDecision,
    SpillGate,
    ViewCount,
)

BS = 16
A = ["a1", "a2", "a3", "a4", "a5"]
B = ["b1", "b2", "b3", "b4", "b5"]


def t(rid, ts, worker, keys, cached=0, prompt=None, *, expected=None, predicted=None,
      notes=(), error=None, code=None):
    prompt = prompt if prompt is not None else len(keys) * BS + 5
    lay = ExpectedLayout(block_keys=list(keys), engine_prompt_tokens=expected or prompt,
                         router_view=ViewCount(expected or prompt),
                         spans=[LayoutSpan("image", 4, 64, 0)],
                         images=[LayoutImage(64, 64, 64)], block_size=BS)
    preds = []
    if predicted is not None or notes:
        preds.append(RoutingDecision(rid, "smg", "test", overlap_blocks=predicted,
                                     warnings=list(notes)))
    return RequestTrace(rid, "http://r", "smg", "m", ts, False, worker=worker,
                        cached_tokens=cached, prompt_tokens=prompt, expected_layout=lay,
                        predictions=preds, error=error, error_code=code, latency_s=0.5,
                        status=400 if error else 200)


def judged(trace, history=(), *, removed=(), blind=frozenset()):
    """Judged as the verdict job judges: history and KV removals through its state."""
    state = JudgeState()
    state.apply_kv([(ts, w, "removed", None, [f"h{i}" for i in range(n)])
                    for ts, w, n in removed])
    return state.judge([*history, trace], [trace.request_id], frozenset(blind))[0]


def logged(rid, worker, **kw) -> RequestTrace:
    """A request known from SMG's logs alone (no cached-token count)."""
    return RequestTrace(rid, "smg", "smg", "m", 10.0, False, worker=worker, status=200,
                        origin="observed", provenance={"worker": "router_log:smg",
                                                       "status": "router_log:smg"}, **kw)


def test_hit_names_what_was_available():
    v = judged(t("r", 2, "w1", A, cached=64), [t("s", 1, "w1", A)])
    assert v.category == "hit" and (v.better_worker, v.better_blocks) == ("w1", 5)
    assert v.best_tokens == 80 and v.evidence["seed_request"] == "s"


def test_cold_and_later_requests_are_not_evidence():
    assert judged(t("r", 2, "w1", A), [t("s", 1, "w1", B)]).category == "cold"
    assert judged(t("r", 2, "w1", A), [t("s", 3, "w1", A)]).category == "cold"


def test_content_blind_false_hit():
    v = judged(t("r", 2, "w1", B, predicted=5), [t("s", 1, "w1", A)])
    assert v.category == "false_hit" and "predicted 5 blocks" in v.headline


def test_spilled_names_the_worker_that_held_more():
    v = judged(t("r", 2, "w2", A), [t("s", 1, "w1", A)])
    assert v.category == "spilled" and v.better_worker == "w1"
    assert v.best_tokens == 80 and v.realized_tokens == 0


def test_evicted_when_blocks_were_removed_before_the_replay():
    v = judged(t("r", 2, "w1", A), [t("s", 1, "w1", A)], removed=[(1.5, "w1", 5)])
    assert v.category == "evicted" and "removed 5 blocks" in v.headline
    later = judged(t("r", 2, "w1", A), [t("s", 1, "w1", A)], removed=[(3.0, "w1", 5)])
    assert later.category == "unexplained"


def test_count_drift_points_at_the_first_divergent_block():
    v = judged(t("r", 2, "w1", A, prompt=93, expected=85), [t("s", 1, "w1", A)])
    assert v.category == "count_drift" and v.evidence["difference"] == 8
    assert v.evidence["first_divergent_block"] == (4 + 64) // 16


def test_text_prefix_fallback_from_router_warnings():
    v = judged(t("r", 2, "w2", A, notes=["mm-routing: failed to fetch image dims; MM routing "
                                         "entry skipped"]), [t("s", 1, "w1", A)])
    assert v.category == "fallback" and "failed to fetch image dims" in v.headline


def test_events_blind():
    v = judged(t("r", 2, "w2", A), [t("s", 1, "w1", A)], blind={"w1"})
    assert v.category == "events_blind"


def test_errors_say_what_to_change():
    v = judged(t("r", 2, None, A, error="503", code="no_media_ref_capable_worker"))
    assert v.category == "error" and "mm_processor" in v.evidence["what_to_change"]


def test_smg_first_sight_branch_is_cold_not_a_fallback():
    d = RoutingDecision("r", "smg", "router_log:smg", worker="w1",
                        branch="expected_wait_fallback", matched_ratio=0.0)
    v = judge(Evidence(logged("r", "w1", predictions=[d]), Realized(0, None, "kv_events")))
    assert v.category == "cold" and v.evidence["branch"] == "expected_wait_fallback"
    # Without the engine's side the router's view is no verdict: it may still have hit.
    v = judge(Evidence(logged("r", "w1", predictions=[d])))
    assert v.category == "unknown" and "expected_wait_fallback" in v.headline


def test_spill_gate_on_the_other_worker_is_a_spill():
    # SMG's cache trace: the gate of the preferred worker w1 fired; w2 served.
    d = RoutingDecision("r", "smg", "smg_cache_trace", worker="w2", branch="event_hit",
                        overlap_blocks=0, gates=[SpillGate("w1", 90.0, 10.0, 1.5, 64.0,
                                                           spill=True)])
    realized = judge(Evidence(logged("r", "w2", predictions=[d]),
                              Realized(0, None, "kv_events")))
    assert realized.category == "spilled" and "w1" in realized.headline
    v = judge(Evidence(logged("r", "w2", predictions=[d])))
    assert v.category == "unknown" and "spill gate on w1 fired" in v.headline


def test_failover_judges_the_serving_attempt_and_names_the_failed_one():
    first = RoutingDecision("r", "smg", "smg_cache_trace", worker="grpc://a:1",
                            branch="event_hit", overlap_blocks=13, request_blocks=14,
                            ts=10.0, attempt=0)
    second = RoutingDecision("r", "smg", "smg_cache_trace", worker="grpc://b:2",
                             branch="event_miss", overlap_blocks=0, request_blocks=14,
                             ts=10.4, attempt=1)
    rec = logged("r", "grpc://b:2", predictions=[first, second])
    v = judge(Evidence(rec, Realized(0, None, "kv_events")))
    assert v.category == "cold" and v.attempt == 1 and v.predicted_blocks == 0
    assert v.failed_attempts == [{"attempt": 0, "worker": "grpc://a:1",
                                  "predicted_blocks": 13, "branch": "event_hit"}]
    assert "attempt 0 on grpc://a:1 (predicted 13 blocks) failed" in v.headline
    # The same from log lines without attempt numbers: two dispatches, the later answered.
    for d in (first, second):
        d.attempt = None
    v = judge(Evidence(logged("r", "grpc://b:2", predictions=[first, second]),
                       Realized(0, None, "kv_events")))
    assert v.category == "cold" and [f["worker"] for f in v.failed_attempts] == ["grpc://a:1"]


def test_a_text_hit_with_cached_tokens_is_a_hit_without_any_layout():
    rec = RequestTrace("r", "dyn", "dynamo", "m", 1.0, False, worker="w1", prompt_tokens=40,
                       cached_tokens=16, status=200, origin="observed",
                       provenance={"worker": "tap", "cached_tokens": "tap",
                                   "prompt_tokens": "tap", "status": "tap"})
    v = judge(Evidence(rec))
    assert (v.category, v.realized_blocks, v.sources["realized"]) == ("hit", 1, "tap")


def test_two_readings_that_disagree_are_named_with_the_reason():
    d = RoutingDecision("r", "smg", "router_log:smg", worker="w1", overlap_blocks=10)
    got = Realized(10, None, "kv_events", (0,), "2 requests of 14 blocks on w1 at once")
    v = judge(Evidence(logged("r", "w1", predictions=[d]), got))
    assert v.category == "hit_or_false_hit" and v.reason == got.reason
    assert "10 or 0 blocks" in v.headline
    agree = Realized(10, None, "kv_events", (9,), "two like requests")
    assert judge(Evidence(logged("r", "w1", predictions=[d]), agree)).category == "hit"


def test_realized_unknown_is_unknown_with_what_is_missing():
    d = RoutingDecision("r", "smg", "router_log:smg", worker="w1", overlap_blocks=5)
    v = judge(Evidence(logged("r", "w1", predictions=[d])))
    assert v.category == "unknown" and "realized hit is unknown" in v.headline
    assert {"cached_tokens", "realized"} <= set(v.unknown)


def test_two_readings_of_a_spill_name_the_spill():
    d = RoutingDecision("r", "smg", "smg_cache_trace", worker="w2", overlap_blocks=0,
                        gates=[SpillGate("w1", 90.0, 10.0, 1.5, 64.0, spill=True)])
    got = Realized(5, None, "kv_events", (0,), "another request on w2 stored blocks of its "
                   "prompt while it ran")
    v = judge(Evidence(logged("r", "w2", predictions=[d]), got))
    assert v.category == "hit_or_spilled" and "5 or 0 blocks" in v.headline


def test_a_failed_attempts_prefill_is_no_other_requests():
    """A request in flight on a worker that died may have stored its prompt's blocks there
    before it failed over: a rival of the same length on that worker can no longer be read
    as having computed them (a swapped pair on one CI run: the one that found its prompt
    cached judged a false hit, another judged a hit)."""
    def d(rid, worker, ts, attempt, predicted):
        return RoutingDecision(rid, "smg", "smg_cache_trace", worker=worker,
                               branch="event_hit", overlap_blocks=predicted,
                               request_blocks=6, expanded_tokens=100, ts=ts, attempt=attempt)

    served = logged("served", "grpc://a:1", latency_s=0.5,
                    predictions=[d("served", "grpc://a:1", 10.1, 0, 6)])
    moved = logged("moved", "grpc://b:2", latency_s=0.6,
                   predictions=[d("moved", "grpc://a:1", 10.0, 0, 4),
                                d("moved", "grpc://b:2", 10.4, 1, 0)])
    root = [f"r{i}" for i in range(6)]
    rows = [(5.0, "grpc://a:1", "stored", None, root),  # both prompts' first six blocks
            (10.2, "grpc://a:1", "stored", "r3", ["x4", "x5"]),  # depth 4, two blocks
            (11.0, "grpc://a:1", "stored", "x5", ["x6"])]  # a decode block
    state = JudgeState()
    state.apply_kv(rows)
    v = state.judge([served, moved], ["served"])[0]
    ctx = Context()  # the verdict job's window, kept between runs: the same
    ctx.put(0, moved)
    ctx.put(1, served)
    assert state.judge_context(ctx, ["served"])[0].category == v.category
    ctx.drop(0)  # the failed attempt's run leaves the worker's runs with its request
    assert JudgeState(chains=state.chains).judge_context(
        ctx, ["served"])[0].category == "false_hit"
    # It may have found all six blocks (the segment the failed attempt's) or computed two.
    assert v.category == "hit_or_false_hit", v.headline
    # Without the failed attempt, its run alone fits the segment: a definite false hit.
    state = JudgeState()
    state.apply_kv(rows)
    assert state.judge([served], ["served"])[0].category == "false_hit"
