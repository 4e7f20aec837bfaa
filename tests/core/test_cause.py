"""A stored verdict in one sentence naming the better worker, and two requests side by side."""

from __future__ import annotations

from mmlens.analysis.views.cause import cause_sentence, default_partner, diff_rows
from mmlens.records import RequestTrace, Verdict
from mmlens.records.traces import ImageInfo

W1, W2 = "grpc://127.0.0.1:22410", "grpc://127.0.0.1:22420"
NAMES = {W1: "w1", W2: "w2"}


def _v(category: str, worker: str, predicted: int | None, realized: int | None,
       better: str | None = None, better_blocks: int | None = None, **evidence: object,
       ) -> Verdict:
    return Verdict("r", 1.0, category, "headline", worker=worker, predicted_blocks=predicted,
                   realized_blocks=realized, better_worker=better, better_blocks=better_blocks,
                   evidence=dict(evidence))


def test_a_spill_names_the_worker_that_held_more() -> None:
    s = cause_sentence(_v("spilled", W2, 0, 0, W1, 10), NAMES)
    assert s == ("w1 held 10 of these blocks; the router chose w2, which served 0 blocks from "
                 "cache, because the router balanced load (or its spill gate fired) instead.")


def test_a_false_hit_says_what_the_router_expected_and_why() -> None:
    s = cause_sentence(_v("false_hit", W2, 20, 0), NAMES)
    assert s.startswith("The router chose w2 expecting 20 blocks, which served 0 blocks from "
                        "cache, because the router keys blocks by token ids")
    assert s.endswith("no worker held any of its blocks.")


def test_a_hit_names_its_worker_as_the_one_holding_the_blocks() -> None:
    s = cause_sentence(_v("hit", W1, 12, 12, W1, 12), NAMES)
    assert s == ("w1 served 12 blocks from cache, as the router predicted (12); w1 held 12 of "
                 "these blocks.")


def test_an_error_says_what_failed_and_what_to_change() -> None:
    s = cause_sentence(_v("error", W1, None, None, error="dns error: example.invalid",
                          error_code="multimodal_processing_failed",
                          what_to_change="fetchable images only"), NAMES)
    assert s == ("The request failed with multimodal_processing_failed on w1: dns error: "
                 "example.invalid. fetchable images only.")


def _t(rid: str, ts: float, worker: str, ident: str, cached: int) -> RequestTrace:
    return RequestTrace(rid, "http://r:1", "smg", "m", ts, True, worker=worker, status=200,
                        prompt_tokens=329, cached_tokens=cached, images=[
                            ImageInfo("data", None, 640, 480, identities={"smg_blake3": ident})])


def test_the_diff_pairs_a_request_with_its_replay_and_marks_what_differs() -> None:
    a, b, a2 = _t("a", 1.0, W1, "aaaa" * 8, 0), _t("b", 1.1, W2, "bbbb" * 8, 0), \
        _t("a2", 3.0, W2, "aaaa" * 8, 0)
    assert default_partner(a2, [a, b, a2]) is a  # same image, not the nearer B
    rows = {r[""]: r for r in diff_rows(a, _v("false_hit", W1, 20, 0), a2,
                                        _v("spilled", W2, 0, 0, W1, 20), NAMES,
                                        {"http://r:1": "demo"})}
    assert rows["worker"]["a"] == "w1" and rows["worker"]["a2"] == "w2"
    assert rows["worker"]["differs"] == "◆"
    assert rows["router"]["a"] == "demo" and rows["router"]["differs"] == ""
    assert rows["image identity (SMG)"]["differs"] == ""
    assert rows["better worker"]["a2"] == "w1 (20 blocks)"
    assert rows["verdict"]["differs"] == "◆"
