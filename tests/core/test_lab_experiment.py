"""A Lab run judged as an experiment: one PASS/FAIL with its reason, the warning before sending
same-size images to a content-blind router, and first sends framed as seeds. The step rows
are built from traces shaped as real SMG runs on the demo answered them (recorded by hand from
`mmlens dashboard --demo`, 2 workers): same-size A/B both went to w1, distinct sizes spread."""

from __future__ import annotations

from mmlens.analysis.lab_experiment import judge_experiment, same_size_warning, seed_notes
from mmlens.analysis.lab_plan import plan_steps, result_rows, summary_line
from mmlens.analysis.views.lab import step_result
from tests.core.test_lab import NAMES, W1, _trace
from tests.verdicts_support import judged

W2 = "grpc://127.0.0.1:22420"
NAMES = {**NAMES, W2: "w2", "127.0.0.1:22420": "w2"}


def _run(rows: list[tuple[str, int, int, int]]) -> list:
    """(worker, prompt, cached, predicted blocks) per A, B, A again, B again."""
    steps = plan_steps("abab", ["a", "b"], "t")
    traces = [_trace(f"r{i}", w, p, c, b) for i, (w, p, c, b) in enumerate(rows)]
    verdicts = judged(traces)  # as the collector stores them
    return [step_result(s, "demo", t, NAMES, verdict=verdicts[t.request_id])
            for s, t in zip(steps, traces, strict=True)]


def test_same_size_images_on_one_worker_fail_with_the_content_blind_cause() -> None:
    # Real SMG with two 640x480 images: A predicted from the warm-up's image of that size, B
    # predicted from A; both on w1, both replays warm there.
    results = _run([(W1, 329, 0, 19), (W1, 329, 0, 20), (W1, 329, 320, 20), (W1, 329, 320, 20)])
    e = judge_experiment("abab", results, same_size=True, content_blind=True)
    assert e.outcome == "fail"
    assert e.reason.startswith("B went to w1, A's worker: the router predicted 320 cached "
                               "tokens there and the engine found 0")
    assert "SMG routes same-size images by position, not content" in e.reason
    # Without the sizes being equal the cause is not claimed.
    assert "by position" not in judge_experiment("abab", results).reason


def test_a_replay_on_the_other_seed_worker_fails_naming_whose_worker_it_is() -> None:
    results = _run([(W1, 329, 0, 0), (W2, 329, 0, 0), (W2, 329, 0, 20), (W2, 329, 320, 20)])
    e = judge_experiment("abab", results, same_size=True, content_blind=True)
    assert e.outcome == "fail"
    assert e.reason.startswith("A again went to w2, B's worker, not w1 where A was seeded "
                               "(0% cached): SMG routes same-size images by position")


def test_distinct_sizes_spread_and_return_pass() -> None:
    results = _run([(W2, 194, 0, 12), (W1, 329, 0, 20), (W2, 194, 192, 12), (W1, 329, 320, 20)])
    e = judge_experiment("abab", results)
    assert e.outcome == "pass"
    assert e.reason == ("every replay went back to its seed's worker and was warm: "
                        "A again → w2 99% cached, B again → w1 97% cached")
    # A replay that came back cold fails, though on the right worker.
    cold = _run([(W2, 194, 0, 12), (W1, 329, 0, 20), (W2, 194, 16, 12), (W1, 329, 320, 20)])
    assert judge_experiment("abab", cold).reason == (
        "A again returned to w2 but found only 8% cached: its seed's blocks were not reused")


def test_seeds_are_framed_with_the_prediction_explained() -> None:
    results = _run([(W2, 194, 0, 12), (W1, 329, 0, 0), (W2, 194, 192, 12), (W1, 329, 320, 20)])
    seeds = seed_notes(results)
    assert set(seeds) == {0, 1}
    assert seeds[0] == ("seed: first send of A; the router predicted 192 cached tokens on w2 "
                        "from an earlier image of the same size (same token ids, other pixels), "
                        "and the engine found 0: a true content-blind false hit, expected here")
    assert seeds[1] == "seed: first send of B; nothing cached yet, as expected"
    rows = result_rows(results, seeds)
    assert [r["verdict"] for r in rows] == ["seed", "seed", "hit", "hit"]
    assert summary_line(results, seeds).startswith("A → w2: 0% cached (seed) · B → w1")


def test_the_warning_before_sending_same_size_images_to_a_content_blind_router() -> None:
    warn = same_size_warning("abab", [(640, 480)], 2, "smg", "router")
    assert warn is not None and warn.startswith("A and B are both 640x480: SMG routes on token")
    assert same_size_warning("abab", [(480, 360), (640, 480)], 2, "smg", "router") is None
    assert same_size_warning("abab", [(640, 480)], 2, "smg", "worker") is None  # no expansion
    assert same_size_warning("abab", [(640, 480)], 2, "dynamo", None) is None  # hashes the URL
    assert same_size_warning("repeat", [(640, 480)], 2, "smg", "router") is None
    assert same_size_warning("isolation", [(640, 480)], 2, "smg", None) is not None


def test_a_failed_step_fails_the_run_with_its_error() -> None:
    results = _run([(W2, 194, 0, 12), (W1, 329, 0, 0), (W2, 194, 192, 12), (W1, 329, 320, 20)])
    results[1].error = "multimodal_processing_failed: dns error: example.invalid"
    e = judge_experiment("abab", results)
    assert (e.outcome, e.reason) == (
        "fail", "B failed: multimodal_processing_failed: dns error: example.invalid")
    assert judge_experiment("once", results).outcome == "inconclusive"
