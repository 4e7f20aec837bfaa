"""The Lab's plans, images, inputs, step results and the router-vs-worker-mode comparison, on
constructed traces."""

from __future__ import annotations

import pytest

from mmlens.analysis.lab_plan import (
    StepResult,
    batches,
    parse_sizes,
    plan_steps,
    result_rows,
    run_images,
    summary_line,
    ttft_changes,
)
from mmlens.analysis.views.lab import check_inputs, compare_modes, router_modes, step_result
from mmlens.figures.lab import steps_figure
from mmlens.records import RequestTrace, RoutingDecision
from tests.verdicts_support import judged

W1 = "grpc://127.0.0.1:50051"
NAMES = {W1: "w1", "127.0.0.1:50051": "w1"}


def test_abab_seeds_a_and_b_together_then_replays() -> None:
    steps = plan_steps("abab", ["a.png", "b.png"], "t")
    assert [(s.label, s.key, s.together) for s in steps] == [
        ("A", "A", True), ("B", "B", True), ("A again", "A", False), ("B again", "B", False)]
    assert [[s.label for s in b] for b in batches(steps)] == [["A", "B"], ["A again"],
                                                              ["B again"]]
    assert [len(s.images) for s in plan_steps("staircase", ["a"], "t")] == [1, 2, 3]
    with pytest.raises(ValueError, match="needs 2 image"):
        plan_steps("isolation", ["a"], "t")


def test_every_image_of_a_run_differs_and_a_pinned_seed_repeats_it() -> None:
    run = run_images("gradient", [(480, 360), (640, 480)], 3, seed=41)
    assert [(i.name, i.width, i.seed) for i in run] == [("A", 480, 41), ("B", 640, 42),
                                                        ("C", 480, 43)]
    assert len({i.rgb for i in run}) == 3  # a tint each
    assert run_images("gradient", [(480, 360)], 3, seed=41)[0] == run[0]
    assert run_images("none", [(480, 360)], 3, seed=1) == []
    assert parse_sizes(" 480x360 ,640x480,") == [(480, 360), (640, 480)]
    with pytest.raises(ValueError, match="not an image size"):
        parse_sizes("480x360, abc")


def test_bad_inputs_get_a_message_each_and_good_ones_none() -> None:
    ok = check_inputs("gradient", "480x360, 640x480", 2, "", "abab", 0)
    assert ok.errors == {} and ok.sizes == [(480, 360), (640, 480)]
    bad = check_inputs("gradient", "abc", 1, "not a url", "abab", 0)
    assert "not an image size" in bad.errors["sizes"]
    assert "not an image URL" in bad.errors["url"]
    assert "needs 2 images: 1 given" in bad.errors["sequence"]
    assert check_inputs("none", "abc", 2, "", "once", 0).errors == {}  # sizes unused
    assert check_inputs("none", "", 0, "https://example.org/cat.png", "once", 0).url
    assert check_inputs("gradient", "0x0", 1, "", "once", 0).errors["sizes"].startswith(
        "image width must be positive")


def _trace(rid: str, worker: str, prompt: int, cached: int, predicted_blocks: int | None,
           ttft: float | None = None, mode: str | None = None) -> RequestTrace:
    t = RequestTrace(request_id=rid, router="http://r", router_kind="smg", model="m", ts=1.0,
                     stream=True, worker=worker, status=200, prompt_tokens=prompt,
                     cached_tokens=cached, ttft_s=ttft, processing_mode=mode)
    if predicted_blocks is not None:
        t.predictions.append(RoutingDecision(rid, "smg", "header:x-smg-cache-trace",
                                             worker=worker, branch="event_hit" if
                                             predicted_blocks else "event_miss",
                                             overlap_blocks=predicted_blocks,
                                             request_blocks=prompt // 16, block_size=16))
    return t


def test_step_results_carry_verdict_reason_hit_share_and_ttft_change() -> None:
    steps = plan_steps("abab", ["a", "b"], "t")
    traces = [_trace("a1", W1, 194, 0, 12, 0.020), _trace("b1", "grpc://x:2", 329, 0, 0, 0.03),
              _trace("a2", W1, 194, 192, 12, 0.005), _trace("b2", "grpc://x:2", 329, 320, 20)]
    verdicts = judged(traces)  # as the collector stores them
    results = [step_result(s, "demo", t, NAMES, verdict=verdicts[t.request_id])
               for s, t in zip(steps, traces, strict=True)]
    a1, b1, a2, b2 = result_rows(results)
    assert (a1["worker"], a1["verdict"], a1["hit %"]) == ("w1", "false_hit", 0)
    assert a1["why"].startswith("content-blind false hit") and "on w1" in a1["why"]
    assert (b1["verdict"], b1["worker"]) == ("cold", "x:2")
    assert (a2["verdict"], a2["hit %"], a2["computed"]) == ("hit", 99, 2)
    assert a2["TTFT change"] == "-75% vs A"
    assert b2["TTFT change"] == "—"  # no TTFT on that one
    assert a1["TTFT change"] == "—"  # a first send has no baseline
    fig = steps_figure(result_rows(results)).to_dict()
    assert [t["name"].split(" ")[0] for t in fig["data"]] == ["cached", "computed"]
    assert list(fig["data"][0]["y"]) == [0, 0, 192, 320]
    assert fig["data"][1]["text"][0] == "0% · false_hit"
    assert fig["data"][0]["x"][0] == "A<br>w1"
    assert summary_line(results).startswith(
        "A → w1: 0% cached (false_hit) · B → x:2: 0% cached (cold) · A again → w1: 99% cached "
        "(hit)")


def test_latency_stands_in_for_ttft_when_not_streamed() -> None:
    def r(step: str, latency: float) -> StepResult:
        return StepResult(step, "demo", step, "A", "w1", 100, 0, None, None, "cold", "",
                          latency_ms=latency)

    assert ttft_changes([r("A", 100.0), r("A again", 50.0)]) == {1: "-50% vs A (latency)"}


def test_router_and_worker_mode_compared_with_the_difference_explained() -> None:
    step = plan_steps("once", ["a"], "t")[0]
    router = step_result(step, "demo", _trace("r1", W1, 329, 320, 20), NAMES, "router")
    worker = step_result(step, "demo-worker", _trace("r2", W1, 329, 0, 0), NAMES, "worker")
    router.extra.update(router_view=329, worker_view=30)
    worker.extra.update(router_view=329, worker_view=30)
    (cmp,) = compare_modes([router, worker])
    assert [(r["router"], r["mode"], r["router routed on (tokens)"],
             r["engine prompt_tokens (observed)"]) for r in cmp.rows] == [
        ("demo", "router", 329, 329), ("demo-worker", "worker", 30, 329)]
    text = " ".join(cmp.notes)
    assert cmp.notes[0] == ("Engine prompt_tokens observed: demo (router mode, w1) 329 · "
                            "demo-worker (worker mode, w1) 329")
    assert "counted 329 prompt tokens in every mode" in text
    assert "routed on 30 ids with one placeholder per image" in text
    assert "router mode found 320 cached tokens, worker mode 0" in text
    drift = step_result(step, "demo-worker", _trace("r3", W1, 332, 0, 0), NAMES, "worker")
    (cmp,) = compare_modes([router, drift])
    assert any("counted +3 tokens against demo (router mode)" in n for n in cmp.notes)
    assert compare_modes([router]) == []  # one router: nothing to compare


def test_each_router_runs_in_the_mode_it_used_most() -> None:
    rows = [{"target": "demo", "mode": "router", "count": 12.0},
            {"target": "demo-worker", "mode": "worker", "count": 4.0},
            {"target": "demo-worker", "mode": "router", "count": 1.0}]
    assert router_modes(rows) == {"demo": "router", "demo-worker": "worker"}
