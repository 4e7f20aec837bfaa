"""The store keeps changes, keyframes and liveness of each scrape: counter increases over any
window stay exactly what every sample gives."""

from __future__ import annotations

import random

from mmlens.analysis.timeseries import deltas
from mmlens.ingest.sample_thinning import READ_BUCKETS, SampleThinner
from mmlens.records import MetricSample, labels_of

L = labels_of({"worker": "w1"})


def _s(name: str, value: float, ts: float, target: str = "smg") -> MetricSample:
    return MetricSample(target, name, L, value, ts)


def test_buckets_and_families_nothing_reads_are_dropped() -> None:
    t = SampleThinner()
    kept = t.keep([_s("smg_http_request_duration_seconds_bucket", 1, 0.0),
                   _s("smg_cache_aware_match_ratio_bucket", 1, 0.0),
                   _s("smg_http_requests_total", 1, 0.0),  # mmlens' own polls move it
                   _s("smg_worker_requests_total", 1, 0.0)])
    assert [s.name for s in kept] == ["smg_cache_aware_match_ratio_bucket",
                                      "smg_worker_requests_total"]
    assert "smg_cache_aware_match_ratio_bucket" in READ_BUCKETS


def test_an_unchanged_metric_is_kept_once_a_keyframe_and_its_run_end_before_a_change() -> None:
    t = SampleThinner(keyframe_s=60.0, always=("smg_worker_health",))
    kept = []
    for i in range(40):  # one scrape every 2 s; the counter steps once, at 50 s
        ts = 2.0 * i
        kept += t.keep([_s("c_total", 5.0 if ts < 50 else 7.0, ts),
                        _s("smg_worker_health", 1.0, ts)])
    counter = [(s.ts, s.value) for s in kept if s.name == "c_total"]
    # The first scrape, the run's end before the step, the step, a keyframe a minute on.
    assert counter == [(0.0, 5.0), (48.0, 5.0), (50.0, 7.0)]
    assert sum(s.name == "smg_worker_health" for s in kept) == 40  # liveness: every scrape
    assert (t.seen, t.kept) == (80, 43)
    assert [(s.ts, s.value) for s in t.keep([_s("c_total", 7.0, 110.0)])] == [(110.0, 7.0)]


def test_counter_increases_over_every_window_are_unchanged() -> None:
    rng = random.Random(7)
    value, full, t = 0.0, [], SampleThinner(keyframe_s=30.0)
    kept = []
    for i in range(300):
        if rng.random() < 0.1:
            value += rng.randrange(1, 50)
        if rng.random() < 0.01:
            value = 0.0  # a restart
        full.append((2.0 * i, value))
        kept += [(s.ts, s.value) for s in t.keep([_s("c_total", value, 2.0 * i)])]
    assert len(kept) < len(full) / 2

    def increase(points: list[tuple[float, float]], since: float) -> float:
        return sum(v for _, v in deltas([p for p in points if p[0] >= since]))

    for start in range(0, 600, 2):
        assert increase(kept, start) == increase(full, start), start
