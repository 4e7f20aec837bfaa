"""Alert states over time: pending, firing after the cause's hold time, resolved after it
clears; one group per cause; the requests behind each."""

from __future__ import annotations

from mmlens.analysis.alert_states import AlertTracker, counts, group_alerts
from mmlens.analysis.overview import Alert

DIVERGE_A = Alert("warning", "kv_view_divergence", "w1: 12 block(s) ...")
DIVERGE_B = Alert("warning", "kv_view_divergence", "w2: 9 block(s) ...")
FALSE_HITS = Alert("warning", "false_hits", "3 of 9 ...", "r1", ("r2", "r1", "r3"))
DOWN = Alert("error", "worker_unhealthy", "w2 is down")


def _states(tracked: list) -> list[tuple[str, str]]:
    return [(t.group.cause, t.state) for t in tracked]


def test_groups_one_per_cause_worst_first_with_their_requests() -> None:
    groups = group_alerts([DIVERGE_A, FALSE_HITS, DIVERGE_B, DOWN])
    assert [(g.cause, len(g.alerts)) for g in groups] == [
        ("worker_unhealthy", 1), ("kv_view_divergence", 2), ("false_hits", 1)]
    assert groups[2].request_ids == ["r1", "r2", "r3"]


def test_a_condition_fires_only_after_holding_and_resolves_after_clearing() -> None:
    tracker = AlertTracker({"kv_view_divergence": 30.0}, keep_s=60.0)
    assert _states(tracker.update([DIVERGE_A, FALSE_HITS], 100.0)) == [
        ("false_hits", "firing"), ("kv_view_divergence", "pending")]
    assert _states(tracker.update([DIVERGE_A, FALSE_HITS], 129.0))[1] == (
        "kv_view_divergence", "pending")
    firing = tracker.update([DIVERGE_B, FALSE_HITS], 130.0)  # another worker, same cause
    assert _states(firing) == [("false_hits", "firing"), ("kv_view_divergence", "firing")]
    assert firing[1].since == 100.0
    resolved = tracker.update([FALSE_HITS], 140.0)
    assert _states(resolved) == [("false_hits", "firing"), ("kv_view_divergence", "resolved")]
    assert resolved[1].since == 140.0 and counts(resolved) == {
        "firing": 1, "pending": 0, "resolved": 1}
    assert _states(tracker.update([FALSE_HITS], 201.0)) == [("false_hits", "firing")]


def test_a_pending_condition_that_clears_is_never_raised() -> None:
    tracker = AlertTracker({"kv_view_divergence": 30.0})
    tracker.update([DIVERGE_A], 0.0)
    assert tracker.update([], 10.0) == []
    # It comes back: its hold starts again.
    assert _states(tracker.update([DIVERGE_A], 20.0)) == [("kv_view_divergence", "pending")]


def test_the_data_can_show_a_condition_began_before_it_was_first_seen() -> None:
    tracker = AlertTracker({"worker_gone": 10.0})
    gone = Alert("warning", "worker_gone", "w2 gone since ...", since=50.0)
    assert _states(tracker.update([gone], 65.0)) == [("worker_gone", "firing")]
    fresh = Alert("warning", "worker_gone", "w2 gone since ...", since=60.0)
    assert _states(AlertTracker({"worker_gone": 10.0}).update([fresh], 65.0)) == [
        ("worker_gone", "pending")]


def test_one_spill_among_fifteen_requests_raises_nothing_three_do() -> None:
    """A load balancer spills now and then (the demo's worker-mode router places an image
    repeat by load): one spill on a fresh demo is no alert; a pattern of them is."""
    from mmlens.analysis.overview import alerts
    from mmlens.records import RequestTrace, Verdict
    from mmlens.state import Snapshot

    def run(spilled: int) -> list[str]:
        traces = [RequestTrace(f"r{i}", "http://r", "smg", "m", float(i), False, worker="w1",
                               cached_tokens=0) for i in range(15)]
        verdicts = {t.request_id: Verdict(t.request_id, t.ts or 0.0,
                                          "spilled" if i < spilled else "cold", "headline",
                                          predicted_blocks=0)
                    for i, t in enumerate(traces)}
        snap = Snapshot(traces=traces, verdicts=verdicts)
        return [a.cause for a in alerts(snap, traces, 20.0)]

    assert "spills" not in run(1) and "spills" not in run(2)
    assert "spills" in run(3)
