"""Fleet-scale views: the busiest workers by name, the rest summed, no block lost."""

from __future__ import annotations

from mmlens.analysis.fleet import (
    fleet_hit_rates,
    fold_hit_counts,
    fold_timeline,
    fold_view_points,
    fold_view_rows,
    other_label,
)
from mmlens.analysis.kv_divergence import ViewPoint, view_model
from mmlens.analysis.timeseries import (
    bucket_of,
    group_points,
    group_series,
    worker_hit_rate_series,
)
from mmlens.ingest.metric_series import to_series
from mmlens.records import MetricSample, labels_of


def test_timeline_keeps_the_busiest_workers_and_sums_the_rest() -> None:
    rows = [(float(b), f"w{w:03d}", kind, w + 1)
            for w in range(100) for b in (0, 10) for kind in ("stored", "removed")]
    folded = fold_timeline(rows, keep=3)
    assert {w for _, w, _, _ in folded} == {"w099", "w098", "w097", other_label(97)}
    assert sum(n for *_, n in folded) == sum(n for *_, n in rows)
    others = {(b, k): n for b, w, k, n in folded if w == other_label(97)}
    assert others[(0.0, "removed")] == sum(range(1, 98))
    assert fold_timeline(rows[:8], keep=3) == rows[:8]  # two workers: nothing to fold


def _counters(workers: int, scrapes: int) -> list[MetricSample]:
    """vLLM prefix counters: worker i queries 100·(i+1) tokens a scrape and hits half."""
    labels = labels_of({"engine": "0"})
    out = []
    for i in range(workers):
        for k in range(scrapes):
            q = 100.0 * (i + 1) * k
            out += [MetricSample(f"w{i:03d}", "vllm:prefix_cache_queries_total", labels, q,
                                 10.0 * k),
                    MetricSample(f"w{i:03d}", "vllm:prefix_cache_hits_total", labels, q / 2,
                                 10.0 * k)]
    return out


def test_hit_rates_keep_the_busiest_workers_and_weight_the_rest_by_tokens() -> None:
    samples = _counters(20, 6)
    series, _ = fleet_hit_rates(to_series(samples), keep=3)
    assert set(series) == {"w019", "w018", "w017", other_label(17)}
    assert all(v == 0.5 for points in series.values() for _, v in points)
    few = _counters(3, 6)
    assert fleet_hit_rates(to_series(few), keep=3) == (
        worker_hit_rate_series(few, bucket_of(few)), bucket_of(few))


def test_hit_rate_of_the_rest_is_token_weighted_not_a_mean_of_ratios() -> None:
    counts = {"a": {0.0: (0.0, 1000.0)}, "b": {0.0: (10.0, 10.0)}, "c": {0.0: (0.0, 5000.0)}}
    folded = fold_hit_counts(counts, keep=1)
    assert folded == {"c": {0.0: (0.0, 5000.0)}, other_label(2): {0.0: (10.0, 1010.0)}}


def test_view_points_fold_keeps_each_request_and_sums_compared_counts() -> None:
    points = [ViewPoint(1.0, f"w{i}", "index_gauge", 10, 8, 2 * i, 0) for i in range(5)]
    points += [ViewPoint(2.0, f"w{i}", "prediction", 4, 1, 3, 0, f"r{i}") for i in range(5)]
    folded = fold_view_points(points, keep=2)
    other = other_label(3)
    assert {p.worker for p in folded} == {"w4", "w3", other}
    gauge = [p for p in folded if p.worker == other and p.source == "index_gauge"]
    assert [(p.router_blocks, p.engine_blocks, p.router_only) for p in gauge] == [(30, 24, 6)]
    assert sorted(p.request_id for p in folded if p.worker == other
                  and p.source == "prediction") == ["r0", "r1", "r2"]
    assert fold_view_points(points[:2], keep=2) == points[:2]


def test_view_rows_fold_keeps_the_charts_workers_and_sums_the_rest_per_source() -> None:
    stored = [(1.0, f"w{i}", "index_gauge", 10, 8 + i, 2 * i, i) for i in range(5)]
    stored += [(1.0, "w0", "event_plane", None, 6, 1, 0)]
    view = view_model(stored, [], {})
    rows = fold_view_rows(view.rows, view.points, keep=2)
    kept = {p.worker for p in fold_view_points(view.points, keep=2)} - {other_label(3)}
    assert kept == {"w4", "w3"}
    assert [r for r in rows if r["worker"] in kept] == [
        r for r in view.rows if r["worker"] in kept]  # the chart's workers, as they were
    summed = {r["source"]: r for r in rows if r["worker"] == other_label(3)}
    assert summed["index_gauge"] == {
        "worker": other_label(3), "source": "index_gauge", "router blocks": 30,
        "engine blocks": 8 + 9 + 10, "router only": 0 + 2 + 4, "engine only": 0 + 1 + 2}
    # a count none of the folded rows has stays empty, not 0
    assert summed["event_plane"]["router blocks"] is None
    assert summed["event_plane"]["engine blocks"] == 6
    assert fold_view_rows(view.rows, view.points, keep=10) == view.rows


def test_series_grouped_like_samples() -> None:
    other_rank = MetricSample("w000", "vllm:prefix_cache_hits_total", labels_of({"engine": "1"}),
                              7.0, 10.0)
    samples = [*_counters(3, 4), other_rank]
    name, keys = "vllm:prefix_cache_hits_total", ("engine",)
    assert group_series(to_series(samples), name, keys) == group_points(
        (s for s in samples if s.name == name), keys)


def test_sankey_links_name_the_busiest_workers_and_sum_the_rest() -> None:
    from mmlens.analysis.affinity import ImageAffinity, sankey_links

    affinities = [ImageAffinity(f"img{i}", workers={f"w{j}": j + 1 for j in range(20)})
                  for i in range(3)]
    links = sankey_links(affinities, keep_workers=4)
    workers = {w for _, w, _ in links}
    assert workers == {"w19", "w18", "w17", "w16", "16 other workers"}
    assert sum(n for _, _, n in links) == 3 * sum(range(1, 21))  # no request lost
    small = sankey_links(affinities[:1], keep_workers=40)
    assert len(small) == 20 and {w for _, w, _ in small} == {f"w{j}" for j in range(20)}
