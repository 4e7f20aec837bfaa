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


def test_rows_get_the_name_and_keep_the_address() -> None:
    from mmlens.analysis.views.common import name_rows

    names = worker_names(TARGETS)
    rows = name_rows([{"router": "demo", "worker": "grpc://127.0.0.1:50051", "load": 0},
                      {"router": "demo", "worker": "grpc://10.0.0.9:1", "load": 1}], names)
    assert rows[0] == {"router": "demo", "worker": "w1", "address": "127.0.0.1:50051",
                       "load": 0}
    assert rows[1] == {"router": "demo", "worker": "10.0.0.9:1", "address": "10.0.0.9:1",
                       "load": 1}


def test_prefix_tree_blocks_are_labelled_by_request_and_image() -> None:
    from mmlens.collectors.trace_sink import SentRequest, TraceSink
    from mmlens.collectors.traces import ImagePart, solid_png

    from mmlens.analysis.block_labels import block_labels
    from mmlens.records import KVEventRow, RequestTrace

    def trace(rid: str, ts: float, cached: int) -> RequestTrace:
        t = RequestTrace(request_id=rid, router="r", router_kind="smg", model="m", ts=ts,
                         stream=False, worker="grpc://127.0.0.1:50051", status=200,
                         latency_s=0.1, cached_tokens=cached)
        TraceSink(layout_model="qwen3-vl").describe(
            t, SentRequest("Describe this image.", [ImagePart(solid_png(320, 240))]))
        return t

    first, second = trace("mmlens-aaaaaa01", 100.0, 0), trace("mmlens-bbbbbb02", 200.0, 96)
    w = "grpc://127.0.0.1:50051"
    events = [KVEventRow(100.05, w, 0, 1, "stored", 6, None, list(range(1, 7)), ["x"]),
              KVEventRow(200.05, w, 0, 2, "stored", 1, 6, [7], []),
              KVEventRow(150.0, w, 0, 3, "stored", 1, None, [9], [])]  # nobody in service
    labels = block_labels(events, [first, second])
    # 320x240 → 80 image tokens after a 4-token head: blocks 0-5 hold the image.
    assert labels[(w, 1)].text == "req aaaaaa · img 1 320x240" and labels[(w, 1)].image
    assert "image 1 320x240" in labels[(w, 2)].hover and labels[(w, 2)].text == ""
    assert labels[(w, 7)].text == "req bbbbbb"  # its first uncached block: block 6
    assert labels[(w, 7)].hover.startswith("block 6 of mmlens-bbbbbb02")
    assert (w, 9) not in labels


def test_messages_name_the_workers_they_mention() -> None:
    from mmlens.analysis.views.common import named_text

    names = worker_names(TARGETS)
    text = ("false hit: the router predicted 20 blocks on grpc://127.0.0.1:50051, the engine "
            "found 0; candidates 127.0.0.1:50052 load 1, 127.0.0.1:500510 untouched")
    assert named_text(text, names) == (
        "false hit: the router predicted 20 blocks on w1, the engine found 0; candidates w2 "
        "load 1, 127.0.0.1:500510 untouched")


def test_a_router_that_stopped_answering_marks_its_worker_rows() -> None:
    from mmlens.analysis.views.overview import mark_routers_down

    rows = [{"router": "demo", "worker": "w1", "state": "live"},
            {"router": "demo-worker", "worker": "w1", "state": "live"}]
    assert [r["state"] for r in mark_routers_down(rows, ["demo"])] == ["router down", "live"]
