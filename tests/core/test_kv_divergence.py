"""Router view vs engine holdings, and worker liveness: the pure analysis."""

from __future__ import annotations

from mmlens.analysis.kv_divergence import (
    ViewPoint,
    alerts,
    compare_counts,
    compare_sets,
    counted_ids,
    engine_block_sets,
    prediction_points,
    view_model,
)
from mmlens.analysis.liveness import worker_liveness, workers_view
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.records import (
    BlockRemoved,
    BlockStored,
    MetricSample,
    RequestTrace,
    ResidentSummary,
    RoutingDecision,
    Verdict,
    labels_of,
)


def test_set_differences_count_only_once_they_persist() -> None:
    engine = {"w1": {1, 2, 3}, "w2": {9}}
    router = {"w1": {1, 2, 4, 5}, "w3": {7}}
    first, diffs = compare_sets(engine, router, 10.0)
    assert [(p.worker, p.router_blocks, p.engine_blocks) for p in first] == [("w1", 4, 3)]
    assert (first[0].router_only, first[0].engine_only) == (0, 0)  # may be in flight
    engine["w1"].add(4)  # block 4's store reached the engine view late: never counted
    second, _ = compare_sets(engine, router, 11.0, diffs)
    assert (second[0].router_only, second[0].engine_only) == (1, 1)  # 5 and 3 persisted


def test_count_only_views_alert_on_blocks_the_router_believes_resident() -> None:
    points = compare_counts({"w1": 47, "w2": 10}, {"w1": 12, "w2": 10}, 5.0)
    assert [(p.worker, p.router_only, p.engine_only) for p in points] == [
        ("w1", 0, 35), ("w2", 0, 0)]
    # A content-blind index (SMG) keys two same-size images' blocks as one: it holding fewer
    # blocks than the engine is what a healthy cluster looks like, not an alarm.
    assert not alerts(points)
    older = compare_counts({"w1": 10}, {"w1": 40}, 2.0)
    found = alerts(older + compare_counts({"w1": 10}, {"w1": 40}, 5.0))
    assert len(found) == 1 and found[0].worker == "w1"
    assert "30 block(s) the router believes resident" in found[0].message
    assert found[0].since == 2.0  # the divergence held since the first of the two points
    assert not alerts(compare_counts({"w1": 46}, {"w1": 47}, 5.0))  # 1 block: below the floor


def test_event_plane_blocks_the_router_never_learned_are_lost_events() -> None:
    points = [ViewPoint(1.0, "w1", "event_plane", 10, 10, 0, 0),
              ViewPoint(2.0, "w1", "event_plane", 10, 30, 0, 20)]
    found = alerts(points)
    assert [(a.worker, a.since) for a in found] == [("w1", 2.0)]
    assert "lost or unapplied KV events" in found[0].message


def test_predictions_that_the_engine_did_not_find() -> None:
    def trace(rid, worker, ts, cached, overlap, block_size=16, error=None):
        return RequestTrace(rid, "http://r", "smg", "m", ts, False, worker=worker,
                            cached_tokens=cached, error=error, predictions=[RoutingDecision(
                                rid, "smg", "header", overlap_blocks=overlap,
                                block_size=block_size)])

    traces = [trace("a", "w1", 1.0, 0, 6), trace("b", "w1", 2.0, 80, 5),
              trace("c", "w2", 3.0, 0, 5, None, "boom"), trace("d", "w2", 4.0, None, 9)]
    points = prediction_points(traces)
    assert [(p.request_id, p.router_only, p.engine_only) for p in points] == [
        ("a", 6, 0), ("b", 0, 0)]  # an error, and a realized hit nobody told, are no points
    found = alerts(points)
    assert found and "believes resident" in found[0].message  # 6 of 11 predicted missing
    assert found[0].since == 1.0

    def judged(**categories: str) -> dict[str, Verdict]:
        return {rid: Verdict(rid, 5.0, c, c) for rid, c in categories.items()}

    # Judged evicted: the router kept blocks the engine removed, a stale view.
    assert alerts(points, counted=counted_ids(judged(a="evicted", b="hit")))
    # Judged a content-blind false hit (alerted as such), or possibly one: not counted again.
    for category in ("false_hit", "hit_or_false_hit"):
        assert not alerts(points, counted=counted_ids(judged(a=category, b="hit")))
    # Not judged yet: a content-blind false hit looks just like a stale view until its
    # verdict is stored, seconds later (a fresh demo raised a divergence alarm meanwhile).
    assert not alerts(points, counted=counted_ids(judged(b="hit")))
    vm = view_model([], traces, judged(b="hit"))
    assert len(vm.points) == 2 and not vm.alerts
    assert view_model([], traces, judged(a="evicted", b="hit")).alerts


def test_engine_block_sets_merge_ranks() -> None:
    index = ResidentIndex()
    index.apply([BlockStored("w1", 0, 0, 1.0, [1, 2], None, [], 16),
                 BlockStored("w1", 1, 0, 1.0, [3], None, [], 16),
                 BlockRemoved("w1", 0, 1, 2.0, [2])])
    assert engine_block_sets(index.workers) == {"w1": {1, 3}}


def test_view_model_rows_are_the_latest_per_source() -> None:
    vm = view_model([(1.0, "w1", "event_plane", 4, 4, 0, 0), (2.0, "w1", "event_plane", 9, 3,
                                                             6, 0)], [], {})
    assert vm.rows == [{"worker": "w1", "source": "event_plane", "router blocks": 9,
                        "engine blocks": 3, "router only": 6, "engine only": 0}]
    assert len(vm.alerts) == 1


def _sample(target: str, name: str, ts: float, value: float = 1.0, **labels: str,
            ) -> MetricSample:
    return MetricSample(target, name, labels_of(labels), value, ts)


def test_a_worker_whose_series_vanished_is_gone_since_the_next_scrape() -> None:
    reg = "dynamo_component_router_worker_registered"
    samples = [_sample("demo", reg, 10.0, router_worker_id="111"),
               _sample("demo", reg, 10.0, router_worker_id="222"),
               _sample("demo", reg, 15.0, router_worker_id="111"),
               _sample("demo", reg, 20.0, router_worker_id="111"),
               _sample("smg", "smg_worker_health", 20.0, worker="grpc://a")]
    live = {(w.router, w.worker): w for w in worker_liveness(samples)}
    assert live[("demo", "111")].state == "live"
    gone = live[("demo", "222")]
    assert (gone.state, gone.last_seen, gone.gone_since) == ("gone", 10.0, 15.0)
    # A router whose last worker left lists none of these series: its scrape times tell.
    alone = worker_liveness([_sample("smg", "smg_worker_health", 5.0, worker="grpc://a")],
                            {"smg": [5.0, 10.0]})
    assert alone[0].state == "gone" and alone[0].gone_since == 10.0


def test_workers_view_rows_and_alerts() -> None:
    live = worker_liveness([
        _sample("demo", "dynamo_component_router_worker_registered", 1.0, router_worker_id="7"),
        _sample("demo", "dynamo_frontend_model_workers", 2.0)], {"demo": [1.0, 2.0]})
    view = workers_view(live, [ResidentSummary("7", 0, 3, transport="nats")], [], [], {},
                        3.0)
    assert view.rows[0]["state"] == "gone" and view.rows[0]["KV transport"] == "nats"
    assert [a.cause for a in view.alerts] == ["worker_gone"]
