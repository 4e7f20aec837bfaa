"""What every page shares: the config's worker names, miss marking."""

from __future__ import annotations

from mmlens.analysis.views.common import (
    is_miss,
    verdict_counts,
    verdict_css,
    worker_label,
    worker_names,
)

TARGETS = {"workers": [{"name": "w1", "router_url": "grpc://127.0.0.1:50051"},
                       {"name": "w2", "router_url": "grpc://127.0.0.1:50052"},
                       {"name": "grpc://10.0.0.9:1", "router_url": "grpc://10.0.0.9:1"}]}


def test_workers_are_named_as_the_config_names_them() -> None:
    names = worker_names(TARGETS)
    assert worker_label("grpc://127.0.0.1:50051", names) == "w1"
    assert worker_label("127.0.0.1:50052", names) == "w2"  # as SMG's candidates print it
    assert worker_label("grpc://127.0.0.1:50052#1", names) == "w2#1"  # a DP rank
    assert worker_label("grpc://127.0.0.1:50051#0", names) == "w1"
    # A worker discovered by URL only keeps its address; no config at all: addresses.
    assert worker_label("grpc://10.0.0.9:1", names) == "10.0.0.9:1"
    assert worker_label("grpc://127.0.0.1:50051", worker_names(None)) == "127.0.0.1:50051"
    assert worker_label(None, names) == "—"


def test_misses_are_marked_and_counted() -> None:
    assert is_miss("false_hit") and is_miss("cold") and not is_miss("hit")
    assert not is_miss("unknown")
    assert verdict_css("false_hit") != verdict_css("hit") != ""
    assert verdict_css("unknown") == ""
    assert verdict_counts(["hit", "false_hit", "cold", "false_hit", "unknown"]) == \
        "3 miss(es) of 5 (false_hit 2, cold 1)"
    assert verdict_counts(["hit"]) == "0 miss(es) of 1"
